"""What create/update/read/delete do on the nodes, the package's only I/O: run the node programs
(`programs.py`), fetch on the head, copy node to node, inventory, remove.

Reports are parsed by `facts.py`, decisions come from `plan.py`; this module carries them out and
shapes the outputs state keeps. The verbs: `ensure` (create, update), `observe` (read), `release`
(delete).
"""

from __future__ import annotations

import contextlib
import json
import secrets
import sys
import time
from collections.abc import Mapping
from typing import Any

from components import transfer
from components.checkpoint import programs
from components.checkpoint.errors import CheckpointError
from components.checkpoint.facts import RECEIVE_EXITS, program_report
from components.checkpoint.plan import (
    OUTPUT_KEYS,
    Manifest,
    check_space,
    manifest_from_inventory,
    plan_copy,
    problems,
)
from components.node_programs.wire import PROGRESS_MARKER
from components.nodes import transport_to
from components.provider_kit.progress import tell_operator, transfer_line
from components.provider_kit.reports import last_json_object
from components.remote import SSH_TRANSPORT_FAILURE, RemoteError, SshTransport, require_ssh, ssh_argv

FETCH_DEADLINE_S = 6 * 3600.0  # 126 GB at ~10 MB/s is 3.5 h
FETCH_STALL_S = 300.0  # the fetch says its progress every second; this long silent, it is gone


def node_transport(raw: Mapping[str, Any]) -> SshTransport:
    """The SSH transport to the node of a node dict; CheckpointError when it cannot be used."""
    return transport_to("Checkpoint node", raw, CheckpointError)


def checkpoint_program(
    transport: SshTransport, argv: list[str], what: str, stdin: bytes | None = None, timeout: float = 600
) -> tuple[int, dict[str, Any]]:
    """Run a node program; its exit status and JSON report, or an error naming the node."""
    try:
        done = transport.run(argv, stdin=stdin, timeout=timeout)
    except RemoteError as exc:
        raise CheckpointError(f"{transport.name}: {what}: {exc}") from None
    return program_report(transport.name, what, done)


def inventory(props: Mapping[str, Any], manifest: Manifest | None, full: bool) -> dict[str, Any]:
    """The node's inventory of the checkpoint (against `manifest` when given; every byte when `full`)."""
    transport = node_transport(props["node"])
    argv = programs.inventory_argv(
        props.get("python") or "python3",
        props["cache_dir"],
        props["repo"],
        manifest.revision if manifest else props["requested_revision"],
        manifest.as_state() if manifest else None,
        full,
    )
    status, report = checkpoint_program(transport, argv, "checkpoint inventory")
    if status != 0:
        raise CheckpointError(f"{transport.name}: checkpoint inventory failed: {report.get('error')}")
    return report


def upstream_revision(props: Mapping[str, Any]) -> str | None:
    """The commit the configured branch or tag points at on the Hub now (refresh shows a newer one
    beside the recorded `revision`; nothing moves until the operator pins it). None when the Hub
    cannot be asked: refresh of the files on the node must not depend on the Hub."""
    requested = str(props.get("requested_revision") or "")
    if len(requested) == 40 and all(c in "0123456789abcdef" for c in requested):
        return requested
    try:
        token = props.get("hf_token") or ""
        status, report = checkpoint_program(
            node_transport(props["node"]),
            programs.head_fetch_argv(props, None, resolve_only=True),
            "the Hub look-up",
            stdin=(token + "\n").encode(),
            timeout=120,
        )
    except CheckpointError:
        return props.get("upstream_revision")
    if status != 0 or "error" in report:
        return props.get("upstream_revision")
    return str(report.get("revision") or "") or None


def fetch_on_head(props: Mapping[str, Any], owner: tuple[int, int] | None) -> str:
    """Fetch the revision into the head's cache; the commit it resolved to. The token goes on stdin.

    The fetch says its progress on stderr every second: the operator sees bytes, rate and ETA every
    SAY_EVERY_S during `pulumi up`, and a fetch silent for FETCH_STALL_S (the head or the link to it
    gone) is ended instead of waited for until the deadline."""
    target = node_transport(props["node"]).target
    require_ssh(target.label)
    token = props.get("hf_token") or ""
    deadline = float((props.get("tuning") or {}).get("deadline_s") or FETCH_DEADLINE_S)
    operation = f"fetch {props['repo']}@{str(props['requested_revision'])[:12]}"

    def say(done: int, elapsed: float, total: int = 0) -> None:
        tell_operator(transfer_line(operation, "hub", target.label, done, total, elapsed))

    outcome = transfer.run_watched(
        ssh_argv(target, programs.head_fetch_argv(props, owner), dial_with=sys.executable),
        deadline,
        FETCH_STALL_S,
        margin_s=0.0,
        say=say,
        stdin=(token + "\n").encode(),
    )
    report = last_json_object(outcome.stdout)
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


def head_manifest(props: Mapping[str, Any]) -> Manifest:
    """The head's checkpoint: fetched (hub) or adopted (cache), as a manifest of what it holds."""
    target = node_transport(props["node"]).target
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
    target = node_transport(props["node"]).target
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
    if receive_status in RECEIVE_EXITS and result.failure is not transfer.Failure.TRANSPORT:
        result.why = f"{RECEIVE_EXITS[receive_status]} ({result.why})"
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


def ensure(props: Mapping[str, Any], olds: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """create()/update(): the node holds the checkpoint, intact, afterwards. A copy is likely on a
    create, and on an update whose recorded state (`olds`) listed problems: then the source's
    session opens while the node is inventoried (`copy_to_node`'s `early`)."""
    started = time.monotonic()
    copy_likely = olds is None or bool(olds.get("problems"))
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
            label = node_transport(props["node"]).name
            raise CheckpointError(
                f"{label}: {manifest.repo}@{manifest.revision[:12]} after the "
                f"fetch: {json.dumps(broken)}; next: remove those blobs from the head's cache and run again"
            )
        extra = {"bytes_sent": 0, "files_sent": 0, "snapshot_path": _snapshot(report, manifest)}
    return _outputs(props, manifest, extra, started)


def observe(props: Mapping[str, Any]) -> dict[str, Any] | None:
    """read(): the recorded outputs with what the node holds now (`problems`) and, on the head, where
    the branch points on the Hub; None when the revision is gone from the node."""
    manifest = Manifest.from_state(
        props["repo"], props["revision"], props["manifest"], props.get("refs") or {}
    )
    report = inventory(props, manifest, props.get("refresh") == "full")
    if not report.get("exists"):
        return None
    # `digest` stays the recorded one (other nodes' inputs follow it); what is wrong shows here.
    outs = {**props, "problems": problems(manifest, report)}
    if not props.get("source") and props.get("source_mode", "hub") == "hub":
        outs["upstream_revision"] = upstream_revision(props)
    return outs


def release(props: Mapping[str, Any]) -> None:
    """delete(): remove the revision from the node's cache, unless the stack keeps it (the default)."""
    if props.get("keep", True):
        return
    transport = node_transport(props["node"])
    argv = programs.remove_argv(
        props.get("python") or "python3", props["cache_dir"], props["repo"], props["revision"]
    )
    status, report = checkpoint_program(transport, argv, "checkpoint removal")
    if status != 0:
        raise CheckpointError(
            f"{transport.name}: removing {props['repo']}@{props['revision']}: {report.get('error')}"
        )
