"""The watched pipeline of one transfer (a library of `transfer_source`, run ON THE SOURCE; standard
library only): `producer stages | watch | consumer`, the copy between the last producer and the
consumer done here so that every byte is counted.

`watched` runs the stages and the consumer, copies the stream between them, and ends the whole
pipeline when no byte moved for `stall_s` while streaming (not once every byte is sent and the
consumer is finishing) or the deadline passed; it says progress on stderr and keeps the caller's
progress file up to date, and returns every stage's exit status, the tail of its stderr, a stage's
own one-line JSON report (a stderr line `qwen35-report {...}`) and the consumer's one-line JSON
report (its last stdout line). The conversation it is part of: `components/transfer/__init__.py`.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import subprocess
import threading
import time
from collections.abc import Callable

from components.node_programs import wire
from components.node_programs.wire import TAIL_LINES


class StageErr(threading.Thread):
    """Reads one stage's stderr: keeps its tail and its `qwen35-report` line, passes lines on."""

    def __init__(self, stream, on_line):
        super().__init__(daemon=True)
        self.stream, self.on_line = stream, on_line
        self.tail: list[str] = []
        self.report: dict | None = None

    def run(self) -> None:
        for raw in self.stream:
            line = raw.decode(errors="replace").rstrip("\n")
            if line.startswith(wire.REPORT_MARKER + " "):
                with contextlib.suppress(ValueError):
                    self.report = json.loads(line[len(wire.REPORT_MARKER) + 1 :])
                continue
            self.tail = (self.tail + [line])[-TAIL_LINES:]
            self.on_line(line)


PIPE_BYTES = 1 << 20  # pipes the stream passes through: 1 MiB instead of the default 64 KiB


def pump(source_fd: int, sink_fd: int, watch: Watch) -> str:
    """Copy until end of input, counting in `watch.moved`; "" or why it stopped. In-kernel (splice)
    where the platform has it."""
    for fd in (source_fd, sink_fd):  # fewer wake-ups of both ends per byte; best effort
        with contextlib.suppress(OSError, AttributeError):
            fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
    splice = getattr(os, "splice", None)
    try:
        while True:
            if splice is not None:
                count = splice(source_fd, sink_fd, 1 << 20)
            else:
                data = os.read(source_fd, 1 << 20)
                count = len(data)
                view = memoryview(data)
                while view:
                    view = view[os.write(sink_fd, view) :]
            if not count:
                return ""
            watch.moved += count
    except BrokenPipeError:
        return "the consumer stopped reading"
    except OSError as exc:
        return f"{type(exc).__name__}: {exc}"


class Watch:
    """What the copy and its watchdog share while the stream runs: the bytes moved so far, the phase
    ("streaming", then "finishing": every byte sent, the consumer still at work), and why the pipeline
    was ended ("" while nothing ended it). The watchdog thread says progress, writes the progress
    file, and kills every process on a stall (streaming only) or at the deadline."""

    def __init__(self, spec: dict, procs: list, progress, started: float, say):
        self.stall_s, self.deadline_s = float(spec["stall_s"]), float(spec["deadline_s"])
        self.interval_s = float(spec.get("interval_s") or 1.0)
        self.procs, self.progress, self.started, self.say = procs, progress, started, say
        self.moved = 0
        self.phase = "streaming"
        self.why = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _watch(self) -> None:
        last_change, seen, said = time.monotonic(), -1, 0.0
        while not self._stop.wait(0.1):
            now = time.monotonic()
            if self.moved != seen:
                seen, last_change = self.moved, now
            if now - said >= self.interval_s:
                said = now
                self.say(f"{wire.PROGRESS_MARKER} {seen}")
            self.progress.update(self.phase, seen, now - self.started)
            # The stall limit is for the stream only: once every byte is sent, the consumer (a
            # `docker load` unpacking a large first copy) may rightly be silent for long; the
            # deadline still holds, and the progress lines above keep the orchestrator's backstop quiet.
            if self.phase == "streaming" and now - last_change > self.stall_s:
                self.why = f"stalled: no data moved for {self.stall_s:g} s ({seen} bytes sent)"
            elif now - self.started > self.deadline_s:
                self.why = f"deadline of {self.deadline_s:g} s passed ({seen} bytes sent)"
            if self.why:
                kill_all(self.procs)
                return


def kill_all(procs: list) -> None:
    for proc in procs:
        with contextlib.suppress(OSError):
            proc.kill()


def start_producers(stages: list[dict]) -> list[subprocess.Popen]:
    """The producer stages, each reading the one before (the first reads nothing)."""
    procs: list[subprocess.Popen] = []
    previous = subprocess.DEVNULL
    for stage in stages:
        proc = subprocess.Popen(stage["argv"], stdin=previous, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        if previous is not subprocess.DEVNULL:
            previous.close()  # the next stage holds it now
        previous = proc.stdout
        procs.append(proc)
    return procs


def open_consumer(consumer: dict, sink):
    """The consumer: the end reached early (a Popen: an early `transfer_sink`, told its argv when it
    was started without one; or shaped like one: `transfer_source.Forwarded`), else one run over the
    connection now."""
    if isinstance(sink, subprocess.Popen) and consumer.get("sink_argv"):
        header = json.dumps({"argv": consumer["sink_argv"]}).encode()
        try:
            sink.stdin.write(b"%d\n" % len(header) + header)
            sink.stdin.flush()
        except OSError:
            sink = None  # the early session is gone: open the consumer now
    if sink is None:
        sink = subprocess.Popen(
            consumer["argv"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
    return sink


def last_json_line(lines: list[str]) -> dict | None:
    """The consumer's report: its last non-empty stdout line, when that is JSON."""
    for line in reversed(lines):
        if line.strip():
            with contextlib.suppress(ValueError):
                return json.loads(line)
            return None
    return None


def watched(
    spec: dict,
    progress,
    started: float,
    say,
    reach: Callable[[], object] | None = None,
) -> dict:
    """Run the stages and the consumer, copy and watch the stream between them; their outcome.
    `reach`: called once the producers run (their start overlaps its wait): the destination's end
    opened earlier (`transfer_sink`, told the consumer's argv first, or reached through the forward),
    or None: the consumer is run over the connection, and what the producers made waits in the pipe
    for it. What `reach` raises (the program's NotConnected: no connection) ends the producers and is
    raised on. `progress.update(phase, bytes, elapsed)` keeps the caller's progress file."""
    stages, consumer = list(spec["stages"]), spec["consumer"]
    procs = start_producers(stages)
    previous = procs[-1].stdout if procs else subprocess.DEVNULL
    try:
        reached = reach() if reach is not None else None
    except BaseException:  # not connected (or worse): the producers end with it
        kill_all(procs)
        for proc in procs:
            proc.wait()
        raise
    sink = open_consumer(consumer, reached)
    procs.append(sink)
    readers = [StageErr(proc.stderr, say) for proc in procs]
    for reader in readers:
        reader.start()
    out_lines: list[str] = []
    out_reader = threading.Thread(
        target=lambda: out_lines.extend(raw.decode(errors="replace") for raw in sink.stdout), daemon=True
    )
    out_reader.start()
    watch = Watch(spec, procs, progress, started, say)
    stopped = pump(previous.fileno(), sink.stdin.fileno(), watch) if stages else ""
    watch.phase = "finishing"
    with contextlib.suppress(OSError):
        previous.close()  # producers still writing get a broken pipe instead of blocking
    with contextlib.suppress(OSError):
        sink.stdin.close()
    for proc in procs:
        proc.wait()
    watch.stop()
    out_reader.join(timeout=5)
    for reader in readers:
        reader.join(timeout=5)
    names = [stage["name"] for stage in stages] + [consumer["name"]]
    return {
        "stages": [
            {"name": name, "status": proc.returncode, "stderr": reader.tail, "report": reader.report}
            for name, proc, reader in zip(names, procs, readers, strict=True)
        ],
        "bytes": watch.moved,
        "error": watch.why or ("" if not stopped or sink.returncode else stopped),
        "consumer_report": last_json_line(out_lines),
    }
