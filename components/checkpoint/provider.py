"""Checkpoint: "this revision of this Hub repo is in node X's cache, intact" (a Pulumi dynamic resource).

On the head (no `source`): create() fetches the revision once from the Hub (or adopts what the head's
cache already holds), resolves it to a commit, and records the manifest. On every other node:
create() takes the manifest of its source node (an input: the source's own Checkpoint output),
inventories the node, checks free space for what is missing plus a reserve, and streams only the
missing or damaged files source → destination, verified while received. read() checks presence and
size of every file (every byte with `refresh: full`); diff() makes no I/O; delete() keeps the files
unless told otherwise.

Keep `CheckpointProvider` in this module under this name, with no import-time side effects: stacks
pickle it by reference to this module.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import sys
import time
from collections.abc import Mapping
from typing import Any

import pulumi
import pulumi.dynamic as dynamic

from components import transfer
from components.checkpoint import programs
from components.checkpoint.plan import (
    CheckpointError,
    Manifest,
    check_space,
    manifest_from_inventory,
    plan_copy,
    problems,
)
from components.node_programs.wire import PROGRESS_MARKER
from components.nodes import target_from_dict
from components.progress import tell_operator, transfer_line
from components.remote import (
    SSH_TRANSPORT_FAILURE,
    RemoteError,
    Result,
    SshTarget,
    SshTransport,
    require_ssh,
    ssh_argv,
    stderr_tail,
)

# Inputs whose change means another checkpoint on that node (a new resource).
REPLACE_KEYS = ("repo", "requested_revision", "source_mode", "cache_dir", "manifest_digest")
# How a node is reached may change (a new address, a jump host): an update in place. Only another
# node is another checkpoint (a replacement whose old copy, when not kept, is removed from the old node).
NODE_IDENTITY = ("name",)
OUTPUT_KEYS = (
    "upstream_revision",
    "revision",
    "files",
    "bytes",
    "bytes_sent",
    "files_sent",
    "digest",
    "snapshot_path",
    "manifest",
    "refs",
    "problems",
    "seconds",
)


def _target(raw: Mapping[str, Any], role: str) -> SshTarget:
    if not isinstance(raw, Mapping) or not raw.get("host") or not raw.get("known_hosts"):
        raise CheckpointError(
            f"Checkpoint {role}: give a node dict with host, user, known_hosts (got {raw!r})"
        )
    return target_from_dict(raw)


def _run(target: SshTarget, argv: list[str], what: str, stdin: bytes | None = None, timeout: float = 600):
    """Run a node program; its JSON report, or an error naming the node and the program's words."""
    try:
        done: Result = SshTransport(target).run(argv, stdin=stdin, timeout=timeout)
    except RemoteError as exc:
        raise CheckpointError(f"{target.label}: {what}: {exc}") from None
    report = programs.parse_report(done.text)
    if done.returncode == SSH_TRANSPORT_FAILURE and report is None:
        raise CheckpointError(
            f"{target.label}: could not be reached over SSH for {what} (exit 255):\n"
            f"  stderr: {stderr_tail(done.stderr, 4)}\n  next: check the node is up and its pinned host key"
        )
    if report is None or (done.returncode != 0 and "error" not in report):
        raise CheckpointError(
            f"{target.label}: {what} exited {done.returncode} without a report:\n"
            f"  stderr: {stderr_tail(done.stderr, 6)}"
        )
    return done.returncode, report


def inventory(props: Mapping[str, Any], manifest: Manifest | None, full: bool) -> dict[str, Any]:
    target = _target(props["node"], "node")
    argv = programs.inventory_argv(
        props.get("python") or "python3",
        props["cache_dir"],
        props["repo"],
        manifest.revision if manifest else props["requested_revision"],
        manifest.as_state() if manifest else None,
        full,
    )
    status, report = _run(target, argv, "checkpoint inventory")
    if status != 0:
        raise CheckpointError(f"{target.label}: checkpoint inventory failed: {report.get('error')}")
    return report


def fetch_argv(
    props: Mapping[str, Any], owner: tuple[int, int] | None, resolve_only: bool = False
) -> list[str]:
    """The fetch on the head: a Python that has the Hub client, or a short-lived container of the image."""
    fetch = props.get("fetch") or {}
    cache_dir = props["cache_dir"]
    endpoint = fetch.get("endpoint")
    progress = fetch.get("progress")
    if fetch.get("python"):
        program = programs.fetch_argv(
            fetch["python"], cache_dir, props["repo"], props["requested_revision"], props.get("allow") or [],
            props.get("ignore") or [], None if resolve_only else progress, resolve_only,
        )  # fmt: skip
        return (["env", f"HF_ENDPOINT={endpoint}"] if endpoint else []) + program
    image = fetch.get("image")
    if not image:
        raise CheckpointError(
            "Checkpoint fetch: neither a Python (model.fetch_python) nor an image to run the Hub client"
        )
    hub = programs.hub_dir(cache_dir)
    argv = ["docker", "run", "--rm", "-i", "--network", "host", "--entrypoint", "python3"]
    argv += ["-v", f"{hub}:{hub}", "-e", "HF_HOME=/tmp/qwen35-hf-home", "-e", "HF_HUB_DISABLE_TELEMETRY=1"]
    if owner:
        argv += ["--user", f"{owner[0]}:{owner[1]}"]
    if progress:
        folder = progress.rsplit("/", 1)[0]
        argv += ["-v", f"{folder}:{folder}"]
    if endpoint:
        argv += ["-e", f"HF_ENDPOINT={endpoint}"]
    program = programs.fetch_argv(
        "python3", cache_dir, props["repo"], props["requested_revision"], props.get("allow") or [],
        props.get("ignore") or [], None if resolve_only else progress, resolve_only,
    )  # fmt: skip
    return [*argv, image, *program[1:]]


FETCH_DEADLINE_S = 6 * 3600.0  # 126 GB at ~10 MB/s is 3.5 h
FETCH_STALL_S = 300.0  # the fetch says its progress every second; this long silent, it is gone


def fetch_on_head(props: Mapping[str, Any], owner: tuple[int, int] | None) -> str:
    """Fetch the revision into the head's cache; the commit it resolved to. The token goes on stdin.

    The fetch says its progress on stderr every second: the operator sees bytes, rate and ETA every
    SAY_EVERY_S during `pulumi up`, and a fetch silent for FETCH_STALL_S (the head or the link to it
    gone) is ended instead of waited for until the deadline."""
    target = _target(props["node"], "node")
    require_ssh(target.label)
    token = props.get("hf_token") or ""
    deadline = float((props.get("tuning") or {}).get("deadline_s") or FETCH_DEADLINE_S)
    operation = f"fetch {props['repo']}@{str(props['requested_revision'])[:12]}"

    def say(done: int, elapsed: float, total: int = 0) -> None:
        tell_operator(transfer_line(operation, "hub", target.label, done, total, elapsed))

    outcome = transfer.run_watched(
        ssh_argv(target, fetch_argv(props, owner), dial_with=sys.executable),
        deadline,
        FETCH_STALL_S,
        margin_s=0.0,
        say=say,
        stdin=(token + "\n").encode(),
        say_every_s=(props.get("tuning") or {}).get("progress_interval_s"),
    )
    report = programs.parse_report(outcome.stdout)
    if report is None or outcome.killed:
        lines = [line for line in outcome.stderr.splitlines() if not line.startswith(PROGRESS_MARKER)]
        why = outcome.killed or (
            "could not be reached over SSH" if outcome.returncode == SSH_TRANSPORT_FAILURE else "no report"
        )
        tail = "\n".join(lines[-6:])
        raise CheckpointError(
            f"{target.label}: the Hub fetch of {props['repo']} ended without a result: {why} "
            f"(exit {outcome.returncode}):\n  stderr: {tail.replace(token, '***') if token else tail}\n"
            "  files already complete are kept; next: check the head, then `pulumi up` again (it resumes)"
        )
    if outcome.returncode != 0 or "error" in report:
        message = str(report.get("error") or f"exit {outcome.returncode}")
        if token:
            message = message.replace(token, "***")
        raise CheckpointError(f"{target.label}: fetching {message}")
    return str(report["revision"])


def upstream_revision(props: Mapping[str, Any]) -> str | None:
    """The commit the configured branch or tag points at on the Hub now (refresh shows a newer one
    beside the recorded `revision`; nothing moves until the operator pins it). None when the Hub
    cannot be asked: refresh of the files on the node must not depend on the Hub."""
    requested = str(props.get("requested_revision") or "")
    if len(requested) == 40 and all(c in "0123456789abcdef" for c in requested):
        return requested
    try:
        target = _target(props["node"], "node")
        token = props.get("hf_token") or ""
        status, report = _run(
            target,
            fetch_argv(props, None, resolve_only=True),
            "the Hub look-up",
            stdin=(token + "\n").encode(),
            timeout=120,
        )
    except CheckpointError:
        return props.get("upstream_revision")
    if status != 0 or "error" in report:
        return props.get("upstream_revision")
    return str(report.get("revision") or "") or None


def head_manifest(props: Mapping[str, Any]) -> Manifest:
    """The head's checkpoint: fetched (hub) or adopted (cache), as a manifest of what it holds."""
    target = _target(props["node"], "node")
    revision = props["requested_revision"]
    if props.get("source_mode", "hub") == "hub":
        first = inventory(props, None, False)
        owner = (int(first["uid"]), int(first["gid"]))
        revision = fetch_on_head(props, owner)
    report = inventory({**props, "requested_revision": revision}, None, False)
    manifest = manifest_from_inventory(props["repo"], props["requested_revision"], report, target.label)
    if props["requested_revision"] != manifest.revision:
        manifest = Manifest(
            manifest.repo,
            manifest.revision,
            manifest.files,
            ((props["requested_revision"], manifest.revision),),
        )
    return manifest


def copy_to_node(props: Mapping[str, Any], manifest: Manifest, early: bool = True) -> dict[str, Any]:
    """Send the node what it lacks of `manifest` from its source; nothing when it holds it all.

    `early`: the source's session (its connection to this node, and this node's receiving end) is
    opened while this node is inventoried, so connection set-up and login shells are paid meanwhile,
    not on the copy's path; it ends unused when nothing is missing. Late (after the inventory) when a
    copy is unlikely (an update of a node that held everything at the last refresh)."""
    target = _target(props["node"], "node")
    full = props.get("refresh") == "full"
    source_raw = props.get("source")
    if not source_raw:
        report = inventory(props, manifest, full)
        plan = plan_copy(manifest, report)
        if plan.nothing_to_do:
            return {"bytes_sent": 0, "files_sent": 0, "snapshot_path": _snapshot(report, manifest)}
        raise CheckpointError(
            f"{target.label}: {manifest.repo}@{manifest.revision} is incomplete on the head itself "
            f"({len(plan.blobs)} files missing or damaged); next: `pulumi up` again (the fetch repairs it)"
        )
    try:
        tuning = transfer.tuning_from(props.get("tuning"), "Checkpoint tuning")
        source = transfer.Endpoint.from_dict("source", source_raw, tuning.connect_timeout_s)
        destination = transfer.Endpoint.from_dict("node", props["node"], tuning.connect_timeout_s)
    except (transfer.TuningError, transfer.EndpointError) as exc:
        raise CheckpointError(f"Checkpoint: {exc}") from None
    peer = transfer.Peer.new(transfer.peer_target(destination, tuning))
    python = props.get("python") or "python3"
    with transfer.ssh_sessions() as control:
        source_master = control("source")
        session = None
        try:
            if early:
                session = transfer.SourceSession(source, peer, None, source_master, python)
            report = inventory(props, manifest, full)
            plan = plan_copy(manifest, report)
            if plan.nothing_to_do:
                return {"bytes_sent": 0, "files_sent": 0, "snapshot_path": _snapshot(report, manifest)}
            check_space(target.label, plan, report, int(props.get("reserve") or 0))
            if session is None:
                session = transfer.SourceSession(source, peer, None, source_master, python)
            send = programs.send_argv(python, props["source_cache_dir"], manifest.repo, plan.blobs)
            owner = (int(report["uid"]), int(report["gid"]))
            receive = programs.receive_argv(
                python, props["cache_dir"], manifest.repo, manifest.revision, manifest.as_state(),
                dict(manifest.refs), owner,
            )  # fmt: skip
            job = transfer.Transfer(
                operation=f"checkpoint-{destination.label}-{secrets.token_hex(3)}",
                producers=(transfer.Stage("checkpoint send (source)", send),),
                consumer=transfer.Stage("checkpoint receive (destination)", receive),
                bytes_total=plan.bytes,
            )
            try:
                result = session.transfer(job, destination, tuning)
            except transfer.PeerUnreachable as exc:
                raise CheckpointError(str(exc)) from None
        finally:
            if session is not None:
                session.close()  # ends it unused (nothing to send, or a refusal before any byte)
                if not peer.closed:  # the session died before ending its connection to this node
                    with contextlib.suppress(RemoteError):
                        source.transport(source_master).run(peer.close_argv(python), timeout=30)
    received = _received(result, manifest, destination)
    return {
        # Bytes into the link (the files and their frame headers), as NodeImage counts them.
        "bytes_sent": result.bytes_sent,
        "files_sent": int(received.get("received") or 0),
        "snapshot_path": received.get("snapshot_path"),
    }


def _received(result: transfer.TransferResult, manifest: Manifest, destination: transfer.Endpoint) -> dict:
    """The receiver's report of a transfer that placed every file, verified; else an error for people."""
    received = result.consumer_report or {}
    if result.ok and "error" not in received and received.get("digest") == manifest.digest:
        return received
    receive_status = result.stages[-1].status if result.stages else None
    if received.get("error"):
        result.detail = [*result.detail, str(received["error"])]
    if receive_status in programs.RECEIVE_EXITS and result.failure is not transfer.Failure.TRANSPORT:
        result.why = f"{programs.RECEIVE_EXITS[receive_status]} ({result.why})"
    elif result.ok:
        result.why = f"the files on {destination.label} do not hash to the source's manifest digest"
    raise CheckpointError(
        result.error(
            f"copy of {manifest.repo}@{manifest.revision[:12]}",
            "files verified before the failure are kept; nothing unverified carries a final name",
            "check the link between the nodes and run `pulumi up` again (only what is missing is sent)",
        )
    )


def _snapshot(report: Mapping[str, Any], manifest: Manifest) -> str:
    return f"{report['root']}/snapshots/{manifest.revision}"


def _outputs(props: Mapping[str, Any], manifest: Manifest, extra: Mapping[str, Any], started: float) -> dict:
    return {
        **_inputs(props),
        "revision": manifest.revision,
        "files": len(manifest.files),
        "bytes": manifest.bytes,
        "digest": manifest.digest,
        "manifest": manifest.as_state(),
        "refs": dict(manifest.refs),
        "problems": {},
        # What the branch pointed at when this was placed; refresh updates it (see upstream_revision).
        "upstream_revision": None if props.get("source") else manifest.revision,
        "seconds": round(time.monotonic() - started, 3),
        **extra,
    }


def _inputs(props: Mapping[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in props.items() if key not in OUTPUT_KEYS and not key.startswith("__")}


def ensure(props: Mapping[str, Any], copy_likely: bool = True) -> dict[str, Any]:
    """create()/update(): the node holds the checkpoint, intact, afterwards."""
    started = time.monotonic()
    if props.get("source"):
        manifest = Manifest.from_state(
            props["repo"], props["source_revision"], props["source_manifest"], props.get("source_refs") or {}
        )
        extra = copy_to_node(props, manifest, early=copy_likely)
    else:
        manifest = head_manifest(props)
        report = inventory(props, manifest, props.get("refresh") == "full")
        broken = problems(manifest, report)
        if broken:
            raise CheckpointError(
                f"{_target(props['node'], 'node').label}: {manifest.repo}@{manifest.revision[:12]} after the "
                f"fetch: {json.dumps(broken)}; next: remove those blobs from the head's cache and run again"
            )
        extra = {"bytes_sent": 0, "files_sent": 0, "snapshot_path": _snapshot(report, manifest)}
    return _outputs(props, manifest, extra, started)


class CheckpointProvider(dynamic.ResourceProvider):
    """CRUD for Checkpoint; every method but diff/check talks to nodes over SSH."""

    def create(self, props: dict[str, Any]) -> dynamic.CreateResult:
        outs = ensure(props)
        return dynamic.CreateResult(
            id_=f"{outs['node'].get('name')}:{outs['repo']}@{outs['revision']}", outs=outs
        )

    def read(self, id_: str, props: dict[str, Any]) -> dynamic.ReadResult:
        manifest = Manifest.from_state(
            props["repo"], props["revision"], props["manifest"], props.get("refs") or {}
        )
        report = inventory(props, manifest, props.get("refresh") == "full")
        if not report.get("exists"):
            return dynamic.ReadResult("", {})
        # `digest` stays the recorded one (other nodes' inputs follow it); what is wrong shows here.
        outs = {**props, "problems": problems(manifest, report)}
        if not props.get("source") and props.get("source_mode", "hub") == "hub":
            outs["upstream_revision"] = upstream_revision(props)
        return dynamic.ReadResult(id_, outs)

    def diff(self, id_: str, olds: dict[str, Any], news: dict[str, Any]) -> dynamic.DiffResult:
        replaces = [key for key in REPLACE_KEYS if olds.get(key) != news.get(key)]
        old_node, new_node = olds.get("node") or {}, news.get("node") or {}
        if any(old_node.get(k) != new_node.get(k) for k in NODE_IDENTITY):
            replaces.append("node")
        updates = [
            key
            for key in ("node", "source", "refresh", "reserve", "tuning", "keep", "fetch", "allow", "ignore")
            if olds.get(key) != news.get(key) and key not in replaces
        ]
        # A refresh that found missing or damaged files: `up` sends them again (an update, in place).
        if olds.get("problems"):
            updates.append("problems")
        return dynamic.DiffResult(
            changes=bool(replaces or updates), replaces=replaces, delete_before_replace=False
        )

    def update(self, id_: str, olds: dict[str, Any], news: dict[str, Any]) -> dynamic.UpdateResult:
        # A node that held everything at the last refresh most likely still does: its source's
        # session is opened only once the inventory shows something missing. (Another manifest is a
        # replacement, never an update.)
        return dynamic.UpdateResult(outs=ensure(news, copy_likely=bool(olds.get("problems"))))

    def delete(self, id_: str, props: dict[str, Any]) -> None:
        if props.get("keep", True):
            return
        target = _target(props["node"], "node")
        argv = programs.remove_argv(
            props.get("python") or "python3", props["cache_dir"], props["repo"], props["revision"]
        )
        status, report = _run(target, argv, "checkpoint removal")
        if status != 0:
            raise CheckpointError(
                f"{target.label}: removing {props['repo']}@{props['revision']}: {report.get('error')}"
            )


class Checkpoint(dynamic.Resource, module="qwen35", name="Checkpoint"):
    """One node's copy of the checkpoint.

    Outputs: revision, files, bytes, bytes_sent, digest, snapshot_path (and manifest, refs, problems).
    """

    revision: pulumi.Output[str]
    files: pulumi.Output[int]
    bytes: pulumi.Output[int]
    bytes_sent: pulumi.Output[int]
    digest: pulumi.Output[str]
    snapshot_path: pulumi.Output[str]
    manifest: pulumi.Output[list]
    refs: pulumi.Output[dict]

    def __init__(
        self,
        name: str,
        *,
        node: dict,
        repo: str,
        revision: str,
        cache_dir: str,
        source: dict | None = None,
        source_cache_dir: str | None = None,
        source_checkpoint: Checkpoint | None = None,
        source_mode: str = "hub",
        allow: list[str] | None = None,
        ignore: list[str] | None = None,
        refresh: str = "sizes",
        keep: bool = True,
        reserve: int = 0,
        fetch: dict | None = None,
        tuning: dict | None = None,
        hf_token: pulumi.Input[str] | None = None,
        opts: pulumi.ResourceOptions | None = None,
    ):
        props: dict[str, Any] = {
            "node": node,
            "repo": repo,
            # As configured (a branch, tag or commit); the `revision` output is the commit it resolved to.
            "requested_revision": revision,
            "cache_dir": cache_dir,
            "source": source,
            "source_cache_dir": source_cache_dir,
            "source_mode": source_mode,
            "allow": list(allow or []),
            "ignore": list(ignore or []),
            "refresh": refresh,
            "keep": keep,
            "reserve": reserve,
            "fetch": fetch or {},
            "tuning": tuning or {},
            "hf_token": pulumi.Output.secret(hf_token) if hf_token is not None else None,
            "python": "python3",
            # The source's checkpoint, as recorded: a new revision there reaches this node by replacement.
            "source_revision": source_checkpoint.revision if source_checkpoint else None,
            "source_manifest": source_checkpoint.manifest if source_checkpoint else None,
            "source_refs": source_checkpoint.refs if source_checkpoint else None,
            "manifest_digest": source_checkpoint.digest if source_checkpoint else None,
        }
        props.update({key: None for key in OUTPUT_KEYS if key not in props})
        super().__init__(
            CheckpointProvider(),
            name,
            props,
            pulumi.ResourceOptions.merge(
                opts, pulumi.ResourceOptions(additional_secret_outputs=["hf_token"])
            ),
        )
