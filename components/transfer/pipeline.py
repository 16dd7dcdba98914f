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
import secrets
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from components.config import CopyConfig
from components.node_programs import program_argv
from components.node_programs.wire import PROGRESS_MARKER
from components.provider_kit.progress import SAY_EVERY_S, tell_operator, transfer_line
from components.remote import SSH_TRANSPORT_FAILURE, shell_join, ssh_argv
from components.transfer.endpoints import Endpoint
from components.transfer.peer import Forward, Peer, peer_unreachable
from components.transfer.timing import PhaseTimes

BACKSTOP_MARGIN_S = 30.0  # the orchestrator waits this long past the source's own stall limit
INSPECTION_TIMED_OUT = 124  # `DestinationEnd.before`: the session is up, the inspection hung


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
    forward: str = ""  # "used", "not used: why", or "" (no forward offered)

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


class _Streams:
    """A local process's stdout and stderr, read line by line in threads as they come."""

    def __init__(self, proc: subprocess.Popen, times: PhaseTimes | None):
        self.proc, self.times = proc, times
        self.out: list[str] = []
        self.err: list[str] = []
        self.last = time.monotonic()  # when the last line (either stream) arrived
        self.bytes_done = 0  # the source's latest `qwen35-progress <bytes> [<total>]`
        self.bytes_total = 0  # its total, when the line carries one
        self.changed = threading.Condition()
        self.threads = [
            threading.Thread(target=self._pump, args=(proc.stdout, self.out, False), daemon=True),
            threading.Thread(target=self._pump, args=(proc.stderr, self.err, True), daemon=True),
        ]
        for thread in self.threads:
            thread.start()

    def _pump(self, stream, lines: list[str], is_err: bool) -> None:
        for raw in stream:
            line = raw.decode(errors="replace").rstrip("\n")
            with self.changed:
                lines.append(line)
                self.last = time.monotonic()
                if is_err and line.startswith(PROGRESS_MARKER):
                    with contextlib.suppress(ValueError, IndexError):
                        fields = line.split()
                        self.bytes_done = int(fields[1])
                        if len(fields) > 2:
                            self.bytes_total = int(fields[2])
                self.changed.notify_all()
            if is_err and self.times is not None and not line.startswith(PROGRESS_MARKER):
                self.times.mark(f"  pipeline: {line[:26]}", self.last)
        with self.changed:
            self.changed.notify_all()

    def json_line(self, index: int, timeout: float) -> tuple[dict | None, int]:
        """The first JSON object line of stdout at or after `index` (waiting up to `timeout` while the
        process runs), and the index after it."""
        end = time.monotonic() + timeout
        with self.changed:
            while True:
                for at in range(index, len(self.out)):
                    if self.out[at].lstrip().startswith("{"):
                        with contextlib.suppress(ValueError):
                            return json.loads(self.out[at]), at + 1
                left = end - time.monotonic()
                if left <= 0 or (
                    self.proc.poll() is not None and not any(t.is_alive() for t in self.threads)
                ):
                    return None, index
                self.changed.wait(min(left, 0.1))

    def finish(self) -> None:
        for thread in self.threads:
            thread.join(timeout=5)


def watch(
    proc: subprocess.Popen,
    streams: _Streams,
    deadline_s: float,
    stall_s: float,
    margin_s: float,
    from_line: int = 0,
    say: Callable[..., None] | None = None,
    until_report: bool = False,
    say_every_s: float | None = None,
) -> str:
    """Wait for the process to end (or for a report line after `from_line`), killing it when its
    stderr goes silent for stall_s + margin_s or it passes deadline_s + margin_s; why it was killed.
    `say(bytes_done, elapsed_s, bytes_total)` is called every `say_every_s` (unset: SAY_EVERY_S) while
    it runs (progress for the operator; the total is the progress lines' own, 0 when they carry none)."""
    every = SAY_EVERY_S if say_every_s is None else say_every_s
    started = time.monotonic()
    said_at = started
    reported_at = None
    while proc.poll() is None:
        now = time.monotonic()
        if say is not None and now - said_at >= every:
            said_at = now
            say(streams.bytes_done, now - started, streams.bytes_total)
        if reported_at is None and streams.json_line(from_line, 0)[0] is not None:
            reported_at = now
            if until_report:
                break  # the program's last word: what remains of the session ends by itself
        if reported_at is not None and now - reported_at > 3:
            # The report is in, but something on the source still holds the session's pipes (a
            # channel on a dead link): nothing more will come, stop waiting.
            break
        killed = ""
        if now - started > deadline_s + margin_s:
            killed = f"the transfer passed its deadline of {deadline_s:g} s"
        elif now - streams.last > stall_s + margin_s:
            killed = f"no progress from the source for {stall_s + margin_s:g} s"
        if killed:
            proc.kill()
            proc.wait()
            return killed
        if until_report:
            streams.json_line(from_line, 0.1)  # returns as soon as the report (or the end) is there
        else:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=0.1)  # returns as soon as the session ends
    return ""


def run_watched(
    argv: list[str],
    deadline_s: float,
    stall_s: float,
    times: PhaseTimes | None = None,
    margin_s: float = BACKSTOP_MARGIN_S,
    say: Callable[..., None] | None = None,
    stdin: bytes | None = None,
    say_every_s: float | None = None,
) -> Watched:
    """Run argv locally; kill it when its stderr goes silent for stall_s + margin_s or it passes
    deadline_s + margin_s. `stdin`: bytes written to its standard input first (a secret, never an
    argument).

    The source's program enforces the real limits itself and says progress every second; this is the
    backstop for a source that stops answering altogether.
    """
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL if stdin is None else subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    if stdin is not None:
        with contextlib.suppress(OSError):  # a program that died at once: its exit status tells
            proc.stdin.write(stdin)
        with contextlib.suppress(OSError):
            proc.stdin.close()
    streams = _Streams(proc, times)
    killed = watch(proc, streams, deadline_s, stall_s, margin_s, say=say, say_every_s=say_every_s)
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    streams.finish()
    return Watched(proc.returncode, "\n".join(streams.out), "\n".join(streams.err), killed)


def reap(proc: subprocess.Popen, streams: _Streams, timeout_s: float) -> None:
    """Wait for a session's ssh to end (killed after `timeout_s`), then for its output readers."""
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    streams.finish()


def operator_progress(transfer: Transfer, source: Endpoint, destination: Endpoint) -> Callable[..., None]:
    """What a running transfer tells the operator every SAY_EVERY_S: bytes, rate, ETA."""

    def say(done: int, elapsed: float, _total: int = 0) -> None:
        tell_operator(
            transfer_line(
                transfer.operation, source.label, destination.label, done, transfer.bytes_total, elapsed
            )
        )

    return say


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
    report = None
    for line in reversed(outcome.stdout.splitlines()):
        if line.strip().startswith("{"):
            with contextlib.suppress(ValueError):
                report = json.loads(line)
            break
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


class SourceSession:
    """One SSH session on the source for a whole operation (`transfer_source serve`): it starts the
    connection to the destination and the destination's end at once, runs the caller's inspection of
    the source (`before`), then either runs one transfer or ends unused. Login-shell start-up on both
    nodes is paid while the caller inspects and decides, not on the transfer's path."""

    def __init__(
        self,
        source: Endpoint,
        peer: Peer | None,
        before: Sequence[str] | None,
        control_path: str | None = None,
        python: str = "python3",
        times: PhaseTimes | None = None,
    ):
        self.source, self.peer, self.times = source, peer, times
        spec = {
            "before": list(before) if before else None,
            "peer": peer.spec() if peer else None,
            # with a forward, the destination's end is the orchestrator's (`DestinationEnd`)
            "sink": peer.sink_argv(python) if peer and not peer.forward else None,
        }
        program = program_argv("transfer_source", ["serve", json.dumps(spec, separators=(",", ":"))], python)
        argv = ssh_argv(source.target, program, control_path, dial_with=sys.executable)
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        self.streams = _Streams(self.proc, times)
        self.read_to = 0
        self.ended = False

    def before(self, timeout: float = 120.0) -> tuple[int, str, str]:
        """The inspection's exit status, stdout and stderr; exit 255 when the session itself failed."""
        line, self.read_to = self.streams.json_line(0, timeout)
        if line is None or "before" not in line:
            self.close()
            return SSH_TRANSPORT_FAILURE, "", "\n".join(self.streams.err[-8:])
        outcome = line["before"]
        return int(outcome["status"]), str(outcome["stdout"]), str(outcome["stderr"])

    def transfer(
        self,
        job: Transfer,
        destination: Endpoint,
        tuning: CopyConfig,
        margin_s: float = BACKSTOP_MARGIN_S,
        end: DestinationEnd | None = None,
    ) -> TransferResult:
        """Run `job` in this session; as `run_transfer`. `end`: the destination's end, listening
        (this session's peer forwards to it): it starts the consumer now, before the source connects."""
        use_forward = end is not None and end.start(list(job.consumer.argv), tuning.deadline_s + margin_s)
        spec = run_spec(job, self.source, destination, self.peer, tuning, use_forward)
        spec.pop("peer")
        self._send({"run": spec})
        killed = watch(
            self.proc,
            self.streams,
            tuning.deadline_s,
            tuning.stall_timeout_s,
            margin_s,
            self.read_to,
            say=operator_progress(job, self.source, destination),
            until_report=True,
            say_every_s=tuning.progress_interval_s,
        )
        report, _ = self.streams.json_line(self.read_to, 0 if killed else 5)
        # With the report in, the program has ended its connection to the destination; the session
        # itself ends by itself, reaped meanwhile, not waited for.
        self._end(wait=report is None)
        outcome = Watched(
            self.proc.returncode if self.proc.returncode is not None else SSH_TRANSPORT_FAILURE,
            json.dumps(report) if report else "",
            "\n".join(self.streams.err),
            killed,
        )
        if self.peer is not None:
            self.peer.closed = True
        return interpret(outcome, self.source, destination, self.peer, job)

    def close(self) -> None:
        """End the session unused: the source ends its connection to the destination."""
        if not self.ended:
            self._send({})
            self._end()
            if self.peer is not None:
                self.peer.closed = self.proc.returncode == 0

    def _send(self, request: dict) -> None:
        with contextlib.suppress(OSError, ValueError):
            self.proc.stdin.write((json.dumps(request, separators=(",", ":")) + "\n").encode())
            self.proc.stdin.close()

    def _end(self, wait: bool = True) -> None:
        self.ended = True
        if not wait:
            threading.Thread(target=self._end, daemon=True).start()
            return
        reap(self.proc, self.streams, 10)


class DestinationEnd:
    """The destination's end of a transfer, started by the orchestrator in its own session to the
    destination (`transfer_sink listen`) while the source is inspected: it listens on a socket in a
    private folder there, runs the caller's inspection of the destination (`before`), starts the
    consumer when `start` names it, and serves the connection the source makes through its master's
    stream-local forward (`forward`). The destination's session and login shell, and the consumer's
    start, are then off the transfer's path; the source's connection carries no session. Where the
    end cannot listen, or the destination's sshd refuses the forward, the source runs the consumer
    over its master as before."""

    def __init__(
        self,
        destination: Endpoint,
        before: Sequence[str] | None,
        control_path: str | None = None,
        python: str = "python3",
        times: PhaseTimes | None = None,
        deadline_s: float = 6 * 3600,
    ):
        self.destination = destination
        self.forward = Forward(f"/tmp/qns-{secrets.token_hex(6)}/s", secrets.token_hex(16))
        spec = {
            "folder": self.forward.socket.rsplit("/", 1)[0],
            "token": self.forward.token,
            "before": list(before) if before else None,
            "deadline_s": deadline_s,
        }
        program = program_argv("transfer_sink", ["listen", json.dumps(spec, separators=(",", ":"))], python)
        self.proc = subprocess.Popen(
            ssh_argv(destination.target, program, control_path, dial_with=sys.executable),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        self.streams = _Streams(self.proc, times)
        self.listening = False
        self.started = False
        self.read_to = 0
        self.ended = False

    def before(self, timeout: float = 120.0) -> tuple[int, str, str]:
        """The inspection's exit status, stdout and stderr; exit 255 when the session itself failed."""
        line, self.read_to = self.streams.json_line(0, timeout)
        if line is None or "before" not in line:
            hung = self.proc.poll() is None
            self.close()
            if hung:  # the session is up, the inspection did not answer: not a failed connection
                return INSPECTION_TIMED_OUT, "", f"the inspection did not answer within {timeout:g} s"
            return SSH_TRANSPORT_FAILURE, "", "\n".join(self.streams.err[-8:])
        self.listening = bool(line.get("listening"))
        outcome = line["before"] or {"status": 0, "stdout": "", "stderr": ""}
        return int(outcome["status"]), str(outcome["stdout"]), str(outcome["stderr"])

    def start(self, consumer: list[str], deadline_s: float | None = None) -> bool:
        """Start the consumer now (`deadline_s`, counted from now, bounds it there); False when the end
        is not there to serve (the source then runs the consumer itself)."""
        if self.ended or not self.listening or self.started:
            return False  # one consumer, one connection: a second attempt runs its own
        self.started = True
        try:
            message = {"consumer": consumer, "deadline_s": deadline_s}
            self.proc.stdin.write((json.dumps(message) + "\n").encode())
            self.proc.stdin.flush()
        except (OSError, ValueError):
            return False
        return True

    def run(self, argv: list[str], timeout: float = 120.0) -> tuple[int, str, str] | None:
        """Nothing to serve after all: run `argv` in this session instead of a new one (the caller's
        last command for the node), which ends it; (status, stdout, stderr), or None when the end is
        not there to run it (the caller then runs it as usual)."""
        if self.ended or self.started or self.proc.poll() is not None:
            return None
        self.started = True
        try:
            self.proc.stdin.write((json.dumps({"run": argv}) + "\n").encode())
            self.proc.stdin.flush()
        except (OSError, ValueError):
            return None
        line, self.read_to = self.streams.json_line(self.read_to, timeout)
        if line is None or "ran" not in line:
            return None
        ran = line["ran"]
        return int(ran["status"]), str(ran["stdout"]), str(ran["stderr"])

    def close(self) -> None:
        """End the session: an end that served has already ended; one that did not (a skip, a retag,
        a fallback) ends a consumer it started, unfed."""
        if not self.ended:
            self.ended = True
            with contextlib.suppress(OSError, ValueError):
                self.proc.stdin.close()
            reap(self.proc, self.streams, 15)
