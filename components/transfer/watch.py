"""The orchestrator's watch over a session on a node: its stdout and stderr read as they come, the
source's progress lines said to the operator, and a backstop for a source that stops answering
(killed after its own stall limit plus `BACKSTOP_MARGIN_S`). The source's program enforces the real
limits itself (`node_programs/watched_pipeline.py`)."""

from __future__ import annotations

import contextlib
import json
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from components.node_programs.wire import PROGRESS_MARKER
from components.provider_kit.progress import SAY_EVERY_S, tell_operator, transfer_line
from components.transfer.endpoints import Endpoint
from components.transfer.timing import PhaseTimes
from components.transfer.values import Transfer

BACKSTOP_MARGIN_S = 30.0  # the orchestrator waits this long past the source's own stall limit


@dataclass
class Watched:
    returncode: int
    stdout: str
    stderr: str
    killed: str  # why the orchestrator killed the session, or ""


class Streams:
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
    streams: Streams,
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
    streams = Streams(proc, times)
    killed = watch(proc, streams, deadline_s, stall_s, margin_s, say=say, say_every_s=say_every_s)
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    streams.finish()
    return Watched(proc.returncode, "\n".join(streams.out), "\n".join(streams.err), killed)


def reap(proc: subprocess.Popen, streams: Streams, timeout_s: float) -> None:
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
