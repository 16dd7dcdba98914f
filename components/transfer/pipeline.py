"""The watched pipeline of one transfer, run ON THE SOURCE by `node_programs/transfer_source.py`:

    <producer stages> | <watch: stall watchdog, deadline, bytes, progress file> | ssh <destination> <consumer>

`run_transfer` starts it over the orchestrator's SSH master to the source, keeps a backstop of its
own (a source that stops answering altogether is killed after the stall limit plus a margin), and
turns the program's JSON report into a `TransferResult`: every stage's exit status and stderr tail,
the bytes sent, a stage's own JSON report, the consumer's JSON report, and the failure classified
(`Failure`). `TransferResult.error()` words a failure for people, naming both nodes.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from components.config import CopyConfig
from components.node_programs import program_argv
from components.node_programs.transfer_source import Marker
from components.remote import SSH_TRANSPORT_FAILURE, shell_join, ssh_argv
from components.transfer.endpoints import Endpoint
from components.transfer.peer import Peer, peer_unreachable
from components.transfer.timing import PhaseTimes

BACKSTOP_MARGIN_S = 30.0  # the orchestrator waits this long past the source's own stall limit


class Failure(str, Enum):
    """How a transfer failed, which decides what to tell the operator (and whether to retry)."""

    NONE = "none"
    PEER = "peer"  # the source could not connect to the destination: nothing was sent
    TRANSPORT = "transport"  # a link failed, stalled or passed the deadline (either SSH hop)
    STAGE = "stage"  # a producer stage or the consumer failed for its own reasons


@dataclass(frozen=True)
class Stage:
    """One command of a transfer: a name for messages, and its argument list."""

    name: str
    argv: tuple[str, ...]

    def __init__(self, name: str, argv: Sequence[str]):
        shell_join(list(argv))  # refuses what could not travel to a node safely
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "argv", tuple(argv))


@dataclass(frozen=True)
class Transfer:
    """What a caller provides: producers run on the source (their output is the stream), a consumer
    run on the destination (reads the stream, prints one JSON line on stdout), the byte total for
    progress, and an operation name (the progress file's name on the source)."""

    operation: str
    producers: tuple[Stage, ...]
    consumer: Stage
    bytes_total: int = 0


@dataclass
class StageOutcome:
    name: str
    status: int | None
    stderr: list[str] = field(default_factory=list)
    report: dict | None = None  # the stage's own `qwen35-report` line


@dataclass
class TransferResult:
    """What a caller gets back."""

    source: Endpoint
    destination: Endpoint
    stages: list[StageOutcome]
    bytes_sent: int
    consumer_report: dict | None
    failure: Failure
    why: str
    detail: list[str]
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.failure is Failure.NONE

    def stage(self, name: str) -> StageOutcome | None:
        return next((stage for stage in self.stages if stage.name == name), None)

    def statuses(self) -> str:
        """Every stage's exit status, for messages."""
        return ", ".join(f"{s.name} exited {s.status}" for s in self.stages if s.status is not None)

    def error(self, what: str, placed: str, next_step: str) -> str:
        """A failure worded for people: what, between which nodes, why, each stage, what to do."""
        lines = [f"{what} from {self.source.label} to {self.destination.label} failed: {self.why}"]
        if self.stages and any(s.status for s in self.stages):
            lines[0] += f" [{self.statuses()}]"
        if self.detail:
            lines.append("  stderr: " + "\n          ".join(self.detail[-6:]))
        lines.append(f"  {placed}; next: {next_step}")
        return "\n".join(lines)


@dataclass
class Watched:
    returncode: int
    stdout: str
    stderr: str
    killed: str  # why the orchestrator killed the session, or ""


def run_watched(
    argv: list[str],
    deadline_s: float,
    stall_s: float,
    times: PhaseTimes | None = None,
    margin_s: float = BACKSTOP_MARGIN_S,
) -> Watched:
    """Run argv locally; kill it when its stderr goes silent for stall_s + margin_s or it passes
    deadline_s + margin_s.

    The source's program enforces the real limits itself and says progress every second; this is the
    backstop for a source that stops answering altogether.
    """
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    err_lines: list[str] = []
    out_lines: list[str] = []
    last = [time.monotonic()]
    reported: list[float] = []

    def pump_err() -> None:
        for raw in proc.stderr:
            line = raw.decode(errors="replace").rstrip("\n")
            err_lines.append(line)
            last[0] = time.monotonic()
            if times is not None and not line.startswith(Marker.PROGRESS.value):
                times.mark(f"  pipeline: {line[:26]}", last[0])

    def pump_out() -> None:
        for raw in proc.stdout:
            out_lines.append(raw.decode(errors="replace"))
            if raw.strip().startswith(b"{"):
                reported.append(time.monotonic())

    threads = [threading.Thread(target=pump_err, daemon=True), threading.Thread(target=pump_out, daemon=True)]
    for thread in threads:
        thread.start()
    started = time.monotonic()
    killed = ""
    while proc.poll() is None:
        now = time.monotonic()
        if reported and now - reported[0] > 3:
            # The report is in, but something on the source still holds the session's pipes (a
            # channel on a dead link): nothing more will come, stop waiting.
            break
        if now - started > deadline_s + margin_s:
            killed = f"the transfer passed its deadline of {deadline_s:g} s"
        elif now - last[0] > stall_s + margin_s:
            killed = f"no progress from the source for {stall_s + margin_s:g} s"
        if killed:
            proc.kill()
            break
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=0.1)  # returns as soon as the session ends
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    for thread in threads:
        thread.join(timeout=5)
    return Watched(proc.returncode, "".join(out_lines), "\n".join(err_lines), killed)


def run_spec(
    transfer: Transfer, source: Endpoint, destination: Endpoint, peer: Peer | None, tuning: CopyConfig
) -> dict[str, Any]:
    """The JSON spec `transfer_source run` takes."""
    return {
        "operation": transfer.operation,
        "node": source.label,
        "peer_label": destination.label,
        "bytes_total": transfer.bytes_total,
        "stall_s": tuning.stall_timeout_s,
        "deadline_s": tuning.deadline_s,
        "interval_s": 1.0,
        "stages": [{"name": s.name, "argv": list(s.argv)} for s in transfer.producers],
        "consumer": {
            "name": transfer.consumer.name,
            "argv": peer.argv(list(transfer.consumer.argv)) if peer else list(transfer.consumer.argv),
        },
        "peer": peer.spec() if peer else None,
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
    local = ssh_argv(source.target, program, source_control_path)
    outcome = run_watched(local, tuning.deadline_s, tuning.stall_timeout_s, times, margin_s)
    if peer is not None:
        peer.closed = True  # the program closes the master whenever it got to run
    return interpret(outcome, source, destination, peer, transfer)


def interpret(
    outcome: Watched, source: Endpoint, destination: Endpoint, peer: Peer | None, transfer: Transfer
) -> TransferResult:
    """The program's report and the session's exit status as a TransferResult (pure)."""
    report = None
    for line in reversed(outcome.stdout.splitlines()):
        if line.strip().startswith("{"):
            with contextlib.suppress(ValueError):
                report = json.loads(line)
            break
    other = [
        line
        for line in outcome.stderr.splitlines()
        if line.strip() and not line.startswith(Marker.PROGRESS.value)
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
    )
