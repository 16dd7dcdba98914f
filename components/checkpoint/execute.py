"""What create/update/delete do on the nodes: fetch on the head, copy node to node, remove.

Facts come from `facts.py`, decisions from `plan.py`; this module carries them out and shapes the
outputs state keeps.
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
from components.checkpoint.facts import inventory, node_target, run_program
from components.checkpoint.plan import (
    OUTPUT_KEYS,
    CheckpointError,
    Manifest,
    check_space,
    manifest_from_inventory,
    plan_copy,
    problems,
)
from components.node_programs.wire import PROGRESS_MARKER
from components.provider_kit.progress import tell_operator, transfer_line
from components.remote import SSH_TRANSPORT_FAILURE, RemoteError, require_ssh, ssh_argv

FETCH_DEADLINE_S = 6 * 3600.0  # 126 GB at ~10 MB/s is 3.5 h
FETCH_STALL_S = 300.0  # the fetch says its progress every second; this long silent, it is gone


def fetch_on_head(props: Mapping[str, Any], owner: tuple[int, int] | None) -> str:
    """Fetch the revision into the head's cache; the commit it resolved to. The token goes on stdin.

    The fetch says its progress on stderr every second: the operator sees bytes, rate and ETA every
    SAY_EVERY_S during `pulumi up`, and a fetch silent for FETCH_STALL_S (the head or the link to it
    gone) is ended instead of waited for until the deadline."""
    target = node_target(props["node"], "node")
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


def head_manifest(props: Mapping[str, Any]) -> Manifest:
    """The head's checkpoint: fetched (hub) or adopted (cache), as a manifest of what it holds."""
    target = node_target(props["node"], "node")
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
    target = node_target(props["node"], "node")
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
            label = node_target(props["node"], "node").label
            raise CheckpointError(
                f"{label}: {manifest.repo}@{manifest.revision[:12]} after the "
                f"fetch: {json.dumps(broken)}; next: remove those blobs from the head's cache and run again"
            )
        extra = {"bytes_sent": 0, "files_sent": 0, "snapshot_path": _snapshot(report, manifest)}
    return _outputs(props, manifest, extra, started)


def remove(props: Mapping[str, Any]) -> None:
    """delete(): remove the revision from the node's cache, unless the stack keeps it (the default)."""
    if props.get("keep", True):
        return
    target = node_target(props["node"], "node")
    argv = programs.remove_argv(
        props.get("python") or "python3", props["cache_dir"], props["repo"], props["revision"]
    )
    status, report = run_program(target, argv, "checkpoint removal")
    if status != 0:
        raise CheckpointError(
            f"{target.label}: removing {props['repo']}@{props['revision']}: {report.get('error')}"
        )
