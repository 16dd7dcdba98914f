"""The destination's end of a transfer, started before the source knows what to send (runs ON THE
DESTINATION; standard library only). Two ways to start it:

    transfer_sink              started by the source over its connection to the destination; stdin:
                               `<length>\\n<JSON {"argv": [...]}>` then the stream; becomes that argv
    transfer_sink listen SPEC  started by the orchestrator in its own session to the destination: listens
                               on a socket in a private folder, runs SPEC.before (the caller's inspection
                               of the destination) and prints its outcome as one JSON line, starts the
                               consumer when stdin says {"consumer": ARGV}, and serves the one connection
                               the source makes through its SSH master's stream-local forward (`-L`);
                               or runs the caller's last command for the node ({"run": ARGV}, one JSON
                               line {"ran": outcome}) when there is nothing to serve

The first: the destination's SSH session (and its login shell's start-up) is paid for while both nodes
are still being inspected; the header names the consumer; this program then replaces itself with it
(exec), the stream's first byte still unread on stdin. End of input before a header (nothing to send):
exit 0.

The second (`listen`) takes the destination's session off the transfer's path altogether: the source's
connection carries no session and no login shell, and the consumer (e.g. `docker load`) is already
running when the first byte arrives. The connection starts with SPEC.token and a newline; the answer is
`+` (served: the stream follows, half-closed at its end) or `-` (refused). When the consumer has ended,
its outcome goes back over the connection as one JSON line {"status", "stdout", "stderr"} and this
program exits. End of stdin (or {}) before a connection: nothing to serve, a started consumer gets end
of input and is ended. The conversation: `components/transfer/__init__.py`.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import select
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from enum import IntEnum

from components.node_programs.wire import NUDGE, REFUSED, SERVED, TAIL_LINES


class Exit(IntEnum):
    NOTHING_TO_DO = 0
    CANNOT_LISTEN = 97  # listen: the private folder or its socket could not be made
    BAD_HEADER = 98
    CANNOT_START = 99


TOKEN_WAIT_S = 10.0  # a connection must say its token within this


def read_exact(count: int) -> bytes:
    data = b""
    while len(data) < count:
        more = os.read(0, count - len(data))
        if not more:
            break
        data += more
    return data


def become_consumer() -> int:
    digits = b""
    while not digits.endswith(b"\n"):
        byte = os.read(0, 1)  # unbuffered: what follows the header stays on stdin for the consumer
        if not byte:
            return Exit.NOTHING_TO_DO if not digits else Exit.BAD_HEADER
        digits += byte
        if len(digits) > 12:
            return Exit.BAD_HEADER
    try:
        header = json.loads(read_exact(int(digits)))
        argv = [str(arg) for arg in header["argv"]]
    except (ValueError, KeyError, TypeError):
        sys.stderr.write("transfer_sink: the stream does not start with a valid header\n")
        return Exit.BAD_HEADER
    try:
        os.execvp(argv[0], argv)
    except OSError as exc:
        sys.stderr.write(f"transfer_sink: cannot start {argv[0]}: {exc}\n")
    return Exit.CANNOT_START


# ---- listen --------------------------------------------------------------------------------------------


def make_listener(folder: str) -> socket.socket:
    """A socket at `folder`/s, the folder made private (0700) and ours; raises OSError."""
    os.mkdir(folder, 0o700)
    info = os.lstat(folder)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        raise OSError(f"{folder} is not a directory of ours")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(os.path.join(folder, "s"))
    listener.listen(4)
    return listener


class Consumer:
    """The consumer, started before the stream arrives: stdin a pipe this program fills from the
    connection, stdout and stderr kept (the outcome sent back at the end)."""

    def __init__(self, argv: list[str]):
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,  # ended as a group should nothing arrive
        )
        self.out: list[bytes] = []
        self.err: list[bytes] = []
        self.readers = [
            threading.Thread(target=lambda: self.out.extend(self.proc.stdout), daemon=True),
            threading.Thread(target=lambda: self.err.extend(self.proc.stderr), daemon=True),
        ]
        for reader in self.readers:
            reader.start()

    def end_input(self) -> None:
        with contextlib.suppress(OSError):
            self.proc.stdin.close()

    def outcome(self) -> dict:
        """Wait for the consumer; its exit status, stdout and stderr's tail."""
        self.end_input()
        self.proc.wait()
        for reader in self.readers:
            reader.join(timeout=5)
        err = b"".join(self.err).decode(errors="replace").splitlines()
        return {
            "status": self.proc.returncode,
            "stdout": b"".join(self.out).decode(errors="replace")[-20000:],
            "stderr": err[-TAIL_LINES:],
        }

    def cancel(self) -> None:
        """Nothing will arrive: end of input, then the group is ended if it lingers."""
        self.end_input()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(OSError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def relay(conn: socket.socket, sink_fd: int) -> tuple[int, str]:
    """Copy the connection into the consumer's stdin until the source's end of stream: (bytes, why it
    stopped early or "")."""
    moved = 0
    splice = getattr(os, "splice", None)
    buffer = bytearray(1 << 20)
    try:
        while True:
            if splice is not None:
                try:
                    count = splice(conn.fileno(), sink_fd, 1 << 20)
                except OSError as exc:
                    if exc.errno not in (22, 95):  # EINVAL, EOPNOTSUPP: copy by hand instead
                        raise
                    splice = None
                    continue
            else:
                count = conn.recv_into(buffer)
                view = memoryview(buffer)[:count]
                while view:
                    view = view[os.write(sink_fd, view) :]
            if not count:
                return moved, ""
            moved += count
    except BrokenPipeError:
        return moved, "the consumer stopped reading"
    except OSError as exc:
        return moved, f"{type(exc).__name__}: {exc}"


class Stdin:
    """This program's stdin: JSON lines from the orchestrator, read without blocking the listener."""

    def __init__(self):
        self.buffer = b""
        self.closed = False

    def read_available(self) -> list[dict]:
        data = os.read(0, 65536)
        if not data:
            self.closed = True
        self.buffer += data
        messages = []
        while b"\n" in self.buffer:
            line, self.buffer = self.buffer.split(b"\n", 1)
            with contextlib.suppress(ValueError):
                message = json.loads(line) if line.strip() else {}
                messages.append(message if isinstance(message, dict) else {})
        return messages


def gone(conn: socket.socket) -> bool:
    """The source ended its side (before "+" it sends nothing else)."""
    try:
        return conn.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False


def read_line(conn: socket.socket, size: int) -> str:
    """The connection's first line (its token, or NUDGE), at most `size` bytes with its newline, not
    one byte more: what follows is the stream."""
    conn.settimeout(TOKEN_WAIT_S)
    data = b""
    with contextlib.suppress(OSError):
        while len(data) < size and not data.endswith(b"\n"):
            more = conn.recv(1)
            if not more:
                break
            data += more
    conn.settimeout(None)
    return data.decode(errors="replace").rstrip("\n")


def listen(spec: dict) -> int:
    folder = str(spec["folder"])
    deadline = time.monotonic() + float(spec.get("deadline_s") or 6 * 3600)
    try:
        listener = make_listener(folder)
        error = ""
    except OSError as exc:
        listener, error = None, f"cannot listen in {folder}: {exc}"
    try:
        before = spec.get("before")
        outcome = run_captured([str(arg) for arg in before]) if before else None
        say({"before": outcome, "listening": listener is not None, "error": error})
        if listener is None:
            return Exit.CANNOT_LISTEN
        return serve_one(listener, str(spec["token"]), deadline)
    finally:
        if listener is not None:
            listener.close()
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(folder, "s"))
        with contextlib.suppress(OSError):
            os.rmdir(folder)


class Serving:
    """One `listen` while it waits to serve: the orchestrator's messages (stdin), the consumer they
    name, the source's connection once it said the token, and the nudges held open meanwhile."""

    def __init__(self, listener: socket.socket, token: str, deadline: float):
        self.listener = listener
        self.token = token
        self.deadline = deadline
        self.stdin = Stdin()
        self.consumer: Consumer | None = None
        self.conn: socket.socket | None = None
        self.held: list[socket.socket] = []

    def can_serve(self) -> bool:
        return self.conn is not None and self.consumer is not None

    def waiting_on(self) -> list:
        """What to wait on: the listener until the source's connection is in, that connection until
        its consumer is named (should its source give up, a retried attempt, it is dropped and the
        end listens again), and stdin while it is open."""
        waiting = [self.listener] if self.conn is None else ([self.conn] if self.consumer is None else [])
        if not self.stdin.closed:
            waiting.append(0)
        return waiting

    def take_messages(self) -> bool:
        """Act on the orchestrator's messages: start the consumer it names, or run its last command
        for this node here; True once that command ran (nothing to serve after all)."""
        for message in self.stdin.read_available():
            if isinstance(message.get("consumer"), list) and self.consumer is None:
                self.consumer = Consumer([str(arg) for arg in message["consumer"]])
                if message.get("deadline_s"):  # the transfer's own, counted from now
                    self.deadline = time.monotonic() + float(message["deadline_s"])
            elif isinstance(message.get("run"), list) and self.consumer is None:
                # Nothing to serve after all (a skip, a retag): the one command the caller still has
                # for this node runs here, in this session, instead of a new one (a connection the
                # source opened early is refused on the way out).
                say({"ran": run_captured([str(arg) for arg in message["run"]])})
                return True
            elif not message.get("consumer"):
                self.stdin.closed = True  # {}: nothing to serve
        return False

    def drop_connection(self) -> None:
        self.conn.close()
        self.conn = None

    def accept(self) -> None:
        """Take the next connection and check what it says first: the token (the source's, kept),
        NUDGE (held, unanswered) or anything else (refused)."""
        accepted, _ = self.listener.accept()
        line = read_line(accepted, max(len(self.token), len(NUDGE)) + 1)
        if line == self.token:
            self.conn = accepted
        elif line == NUDGE:
            # Held, unanswered: closing it would make this node's sshd send a small packet just
            # before the answer to the real connection, which then waits ~40 ms for the source's
            # delayed ACK (Nagle; measured on OpenSSH 9.2).
            self.held.append(accepted)
        else:
            with contextlib.suppress(OSError):
                accepted.sendall(REFUSED)
            accepted.close()

    def answer(self) -> bool:
        """Tell the source its stream is served; False (the connection dropped, to listen for another
        attempt) when the source has given up meanwhile."""
        try:
            if gone(self.conn):  # the source ended its side meanwhile: not served
                raise BrokenPipeError
            self.conn.sendall(SERVED)
        except OSError:
            self.drop_connection()
            return False
        return True

    def serve(self) -> None:
        """Relay the stream into the consumer, send its outcome line back, and report what was served."""
        conn, consumer = self.conn, self.consumer
        with contextlib.suppress(OSError, AttributeError):  # fewer wake-ups; best effort
            fcntl.fcntl(consumer.proc.stdin.fileno(), fcntl.F_SETPIPE_SZ, 1 << 20)
        # Should the orchestrator end this session (its stdin: it gave up on the copy) or the
        # deadline pass while the consumer is at work, the connection is cut and the consumer
        # ended: it never promotes what the orchestrator no longer waits for.
        watch = threading.Thread(
            target=end_on_eof_or, args=(conn, self.stdin, self.deadline, consumer), daemon=True
        )
        watch.start()
        moved, why = relay(conn, consumer.proc.stdin.fileno())
        outcome = consumer.outcome()
        with contextlib.suppress(OSError):
            conn.sendall((json.dumps(outcome) + "\n").encode())
            conn.shutdown(socket.SHUT_WR)
        conn.close()
        self.consumer = self.conn = None
        say({"served": {"bytes": moved, "stopped": why, "status": outcome["status"]}})

    def close(self) -> None:
        """End what was never served: the consumer, a connection accepted but not answered, the nudges."""
        if self.consumer is not None:
            self.consumer.cancel()
        if self.conn is not None:
            with contextlib.suppress(OSError):
                self.conn.sendall(REFUSED)  # the source falls back to a session of its own
            self.conn.close()
        for nudge in self.held:
            nudge.close()


def serve_one(listener: socket.socket, token: str, deadline: float) -> int:
    """Wait for the consumer's argv (stdin) and the source's connection (either first); serve it."""
    serving = Serving(listener, token, deadline)
    try:
        while time.monotonic() < serving.deadline:
            if serving.stdin.closed and not serving.can_serve():
                break  # the orchestrator's session ended (or said {}): nothing more to serve
            ready, _, _ = select.select(serving.waiting_on(), [], [], 1.0)
            if 0 in ready:
                if serving.take_messages():
                    return Exit.NOTHING_TO_DO
                if serving.stdin.closed and serving.conn is None:
                    break
            if serving.conn is not None and serving.conn in ready:  # before SERVED it sends nothing: it went
                serving.drop_connection()
                continue
            if listener in ready:
                serving.accept()
            if serving.can_serve():
                if not serving.answer():
                    continue
                serving.serve()
                return Exit.NOTHING_TO_DO
        say({"served": None})
        return Exit.NOTHING_TO_DO
    finally:
        serving.close()


def run_captured(argv: list[str]) -> dict:
    """Run `argv` to its end: exit status, stdout, stderr's tail (the caller's inspection, or its
    last command for the node)."""
    try:
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True)
    except OSError as exc:
        return {"status": Exit.CANNOT_START, "stdout": "", "stderr": f"cannot start {argv[0]}: {exc}"}
    return {
        "status": done.returncode,
        "stdout": done.stdout.decode(errors="replace"),
        "stderr": done.stderr.decode(errors="replace")[-4000:],
    }


def end_on_eof_or(conn: socket.socket, stdin: Stdin, deadline: float, consumer: Consumer) -> None:
    while not stdin.closed:
        ready, _, _ = select.select([0], [], [], max(0.0, min(5.0, deadline - time.monotonic())))
        if ready:
            stdin.read_available()
        elif time.monotonic() >= deadline:
            break
    with contextlib.suppress(OSError):
        conn.shutdown(socket.SHUT_RDWR)
    if consumer.proc.poll() is None:
        with contextlib.suppress(OSError):
            os.killpg(consumer.proc.pid, signal.SIGKILL)


def say(doc: dict) -> None:
    sys.stdout.write(json.dumps(doc) + "\n")
    sys.stdout.flush()


def main(argv: list[str]) -> int:
    if argv[:1] == ["listen"] and len(argv) == 2:
        return listen(json.loads(argv[1]))
    if argv:
        sys.stderr.write("usage: transfer_sink [listen SPEC]\n")
        return Exit.BAD_HEADER
    return become_consumer()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
