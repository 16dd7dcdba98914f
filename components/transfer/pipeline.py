"""One transfer run and read: `run_transfer` starts `transfer_source run` over the orchestrator's SSH
master to the source, watches it (`watch.run_watched`: a backstop of its own), and `interpret` turns
the program's JSON report into a `TransferResult`: every stage's exit status and stderr tail, the
bytes sent, a stage's own JSON report, the consumer's JSON report, and the failure classified
(`Failure`). The conversation: `components/transfer/__init__.py`.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from components.config import CopyConfig
from components.node_programs import program_argv
from components.node_programs.wire import PROGRESS_MARKER
from components.provider_kit.reports import last_json_object
from components.remote import SSH_TRANSPORT_FAILURE, ssh_argv
from components.transfer.endpoints import Endpoint
from components.transfer.peer import Peer, peer_unreachable
from components.transfer.timing import PhaseTimes
from components.transfer.values import Failure, StageOutcome, Transfer, TransferResult
from components.transfer.watch import BACKSTOP_MARGIN_S, Watched, operator_progress, run_watched


def run_spec(
    transfer: Transfer,
    source: Endpoint,
    destination: Endpoint,
    peer: Peer | None,
    tuning: CopyConfig,
    use_forward: bool = False,
) -> dict[str, Any]:
    """The JSON spec `transfer_source run` takes."""
    return {
        "operation": transfer.operation,
        "node": source.label,
        "peer_label": destination.label,
        "bytes_total": transfer.bytes_total,
        "stall_s": tuning.stall_timeout_s,
        "deadline_s": tuning.deadline_s,
        # the source's byte counts come at least as often as the operator's progress lines
        "interval_s": min(1.0, tuning.progress_interval_s or 1.0),
        "stages": [{"name": s.name, "argv": list(s.argv)} for s in transfer.producers],
        "consumer": {
            "name": transfer.consumer.name,
            "argv": peer.argv(list(transfer.consumer.argv)) if peer else list(transfer.consumer.argv),
            # what an early-opened destination end (`transfer_sink`) becomes
            "sink_argv": list(transfer.consumer.argv) if peer else None,
        },
        "peer": peer.spec() if peer else None,
        # the destination's end was told its consumer (`DestinationEnd.start`): reach it through the forward
        "use_forward": bool(peer and peer.forward and use_forward),
    }


def run_transfer(
    transfer: Transfer,
    source: Endpoint,
    destination: Endpoint,
    peer: Peer | None,
    tuning: CopyConfig,
    source_control_path: str | None = None,
    python: str = "python3",
    times: PhaseTimes | None = None,
    margin_s: float = BACKSTOP_MARGIN_S,
) -> TransferResult:
    """Run `transfer` from `source` to `destination` and report; raises `PeerUnreachable` when the
    source could not connect to the destination (nothing was sent). `peer` None: the consumer runs
    on the source itself (same node)."""
    spec = run_spec(transfer, source, destination, peer, tuning)
    program = program_argv("transfer_source", ["run", json.dumps(spec, separators=(",", ":"))], python)
    local = ssh_argv(source.target, program, source_control_path, dial_with=sys.executable)
    outcome = run_watched(
        local,
        tuning.deadline_s,
        tuning.stall_timeout_s,
        times,
        margin_s,
        say=operator_progress(transfer, source, destination),
        say_every_s=tuning.progress_interval_s,
    )
    if peer is not None:
        peer.closed = True  # the program closes the master whenever it got to run
    return interpret(outcome, source, destination, peer, transfer)


def interpret(
    outcome: Watched, source: Endpoint, destination: Endpoint, peer: Peer | None, transfer: Transfer
) -> TransferResult:
    """The program's report and the session's exit status as a TransferResult (pure)."""
    report = last_json_object(outcome.stdout)
    other = [
        line for line in outcome.stderr.splitlines() if line.strip() and not line.startswith(PROGRESS_MARKER)
    ]
    if report is None:
        if peer is not None:
            peer.closed = False  # the program never ran to its end: the caller still owes the close
        if outcome.killed:
            why = outcome.killed
        elif outcome.returncode == SSH_TRANSPORT_FAILURE:
            why = f"the SSH connection to {source.label} failed"
        else:
            why = f"the transfer program on {source.label} exited {outcome.returncode} without a report"
        return TransferResult(source, destination, [], 0, None, Failure.TRANSPORT, why, other[-6:])
    if report.get("preflight") and peer is not None:
        raise peer_unreachable(
            source, destination, peer, report["preflight"], report.get("preflight_stderr", "")
        )
    stages = [
        StageOutcome(s["name"], s.get("status"), list(s.get("stderr") or []), s.get("report"))
        for s in report.get("stages") or []
    ]
    consumer = stages[-1] if stages else None
    detail = [line for s in stages if s.status for line in s.stderr]
    error = str(report.get("error") or "")
    if outcome.killed:
        failure, why = Failure.TRANSPORT, outcome.killed
    elif error.startswith(("stalled", "deadline")):
        failure, why = Failure.TRANSPORT, error
    elif consumer is not None and consumer.status == SSH_TRANSPORT_FAILURE:
        failure, why = (
            Failure.TRANSPORT,
            f"the SSH connection from {source.label} to {destination.label} failed",
        )
    elif any(s.status for s in stages):
        failed = next(s for s in stages if s.status)
        failure, why = Failure.STAGE, f"{failed.name} exited {failed.status}"
    elif error:
        failure, why = Failure.STAGE, error
    else:
        failure, why = Failure.NONE, ""
    return TransferResult(
        source,
        destination,
        stages,
        int(report.get("bytes") or 0),
        report.get("consumer_report"),
        failure,
        why,
        detail or other[-6:],
        float(report.get("seconds") or 0.0),
        str(report.get("forward") or ""),
    )
