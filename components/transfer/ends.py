"""The live sessions of a transfer (I/O): the SSH session the orchestrator holds on each end for a
whole operation, the source's (`SourceSession`: `transfer_source serve`) and the destination's
(`DestinationEnd`: `transfer_sink listen`). Whom they reach, as values: `endpoints.py`. The
conversation: `components/transfer/__init__.py`."""

from __future__ import annotations

import contextlib
import json
import secrets
import subprocess
import sys
import threading
from collections.abc import Sequence

from components.config import CopyConfig
from components.node_programs import program_argv
from components.remote import SSH_TRANSPORT_FAILURE, ssh_argv
from components.transfer.endpoints import Endpoint
from components.transfer.peer import Forward, Peer
from components.transfer.pipeline import interpret, run_spec
from components.transfer.timing import PhaseTimes
from components.transfer.values import Transfer, TransferResult
from components.transfer.watch import BACKSTOP_MARGIN_S, Streams, Watched, operator_progress, reap, watch

INSPECTION_TIMED_OUT = 124  # `DestinationEnd.before`: the session is up, the inspection hung


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
        self.streams = Streams(self.proc, times)
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
        self.streams = Streams(self.proc, times)
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
