"""The source node's side of a node-to-node transfer (runs ON THE SOURCE; standard library only).

    transfer_source serve SPEC   for one whole operation: start connecting to the destination and open
                                 the destination's end early (`transfer_sink`), meanwhile run SPEC.before
                                 (the caller's inspection of the source) and print its outcome as one JSON
                                 line; then read one JSON line on stdin: {"run": RUN} runs the transfer as
                                 below, anything else (or end of input) ends the connection unused
    transfer_source run RUN      connect, then run `producer stages | watch | ssh destination consumer`,
                                 print one JSON report
    transfer_source close SPEC   end the connection to the destination and remove its private folder

SPEC and RUN are JSON; every ssh argv arrives ready-made in SPEC (the orchestrator builds them from
its one set of SSH options). This program holds the connection to the destination (an SSH control
master whose socket lives in a private folder, 0700, owned by us; with SPEC.peer.forward its `-L`
forward to the destination's end) and the progress file for `status`; the watched pipeline it runs
is the library `watched_pipeline`. The conversation: `components/transfer/__init__.py`.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import socket
import stat
import subprocess
import sys
import threading
import time
from enum import IntEnum

from components.node_programs import watched_pipeline
from components.node_programs.wire import NUDGE, PROGRESS_DIR, SERVED, SSH_TRANSPORT_FAILURE


class Exit(IntEnum):
    """This program's exit status (the JSON report says more)."""

    OK = 0
    FAILED = 1  # a stage failed, stalled or passed the deadline: see the report
    PEER_FOLDER = 96  # the private folder for the connection could not be made or is not ours
    PEER_TIMEOUT = 95  # the connection attempt hung past twice the connect timeout
    USAGE = 97


OPERATION = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")
NUDGES: list[socket.socket] = []  # kept open until this program ends


# ---- the connection to the destination --------------------------------------------------------------


def own_folder(folder: str) -> bool | None:
    """Make the private folder (True), or accept an existing one only if it is a directory we own
    (False: a retry, whose master may be up); None when neither."""
    try:
        os.mkdir(folder, 0o700)
        return True
    except FileExistsError:
        info = os.lstat(folder)
        return False if stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid() else None
    except OSError:
        return None


def dialing_env(folder: str) -> dict[str, str]:
    """The environment of an ssh to the destination, whose dialer (ProxyCommand `python3 … tcp_dial`)
    must run under this program's own Python: a version manager's `python3` shim first on the login
    PATH (pyenv's is a shell script) would cost each connection more than the dialer saves. `python3`
    in the connection's private folder links to this interpreter, and that folder comes first on
    PATH (nothing else in it is a program: ssh, docker and the rest are found as before)."""
    if not sys.executable:
        return dict(os.environ)
    with contextlib.suppress(FileExistsError):
        os.symlink(sys.executable, os.path.join(folder, "python3"))
    return {**os.environ, "PATH": os.pathsep.join([folder, os.environ.get("PATH", os.defpath)])}


def connect(peer: dict) -> tuple[int, str]:
    """Make sure the control master is up: (exit status, stderr of a failed attempt)."""
    folder = peer["folder"]
    made = own_folder(folder)
    if made is None:
        return Exit.PEER_FOLDER, f"could not make {folder} (or it exists and is not ours)"
    quiet = {"stdin": subprocess.DEVNULL, "stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    # A folder just made holds no master: nothing to check (an ssh start on the transfer's path).
    if not made and subprocess.run(peer["check"], **quiet).returncode == 0:
        return 0, ""
    errors = os.path.join(folder, "err")
    # The master's stderr goes to a file: a backgrounded master must not hold a session's pipes.
    with open(errors, "wb") as err:
        dialing = dialing_env(folder)
        status = subprocess.run(
            peer["connect"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err, env=dialing
        )
    if status.returncode == 0:
        return 0, ""
    with open(errors, "rb") as err:
        return status.returncode, err.read().decode(errors="replace")


def close(peer: dict) -> int:
    quiet = {"stdin": subprocess.DEVNULL, "stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    with contextlib.suppress(subprocess.TimeoutExpired):  # a master that does not answer ends by itself
        subprocess.run(peer["exit"], timeout=10, **quiet)
    folder = peer["folder"]
    with contextlib.suppress(OSError):
        if stat.S_ISDIR(os.lstat(folder).st_mode) and os.lstat(folder).st_uid == os.getuid():
            for name in os.listdir(folder):
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(folder, name))
            os.rmdir(folder)
    return 0


def connect_with_sink(peer: dict, sink_argv: list[str]) -> tuple[int, str, subprocess.Popen | None]:
    """Start the destination's end over a connection of its own that becomes the master: (0, "", the
    sink) once the master's socket is there (authenticated), else the ssh's exit status and stderr."""
    try:
        dialing = dialing_env(peer["folder"])
        sink = subprocess.Popen(
            sink_argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=dialing
        )
    except OSError as exc:
        return Exit.FAILED, f"cannot start ssh: {exc}", None
    deadline = time.monotonic() + 2 * float(peer["connect_timeout"]) + 5
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            if stat.S_ISSOCK(os.lstat(peer["control"]).st_mode):
                return 0, "", sink
        if sink.poll() is not None:
            err = sink.stderr.read().decode(errors="replace")
            return int(sink.returncode or Exit.FAILED), err, None
        time.sleep(0.005)
    sink.kill()
    sink.wait()
    return Exit.PEER_TIMEOUT, "the connection attempt did not end in time", None


class PeerLink(threading.Thread):
    """Connects to the destination in the background together with the destination's end of the
    transfer (`sink`: an ssh argv running `transfer_sink` there; in a new folder its ssh becomes the
    connection's master, one step), so both are paid for while the caller still decides."""

    def __init__(self, peer: dict, sink: list[str] | None):
        super().__init__(daemon=True)
        self.peer, self.sink_argv = peer, sink
        self.status: int | None = None
        self.err = ""
        self.sink: subprocess.Popen | None = None
        # Through a forward to the orchestrator's end: the connection to it, opened as soon as the
        # master is up and its token said, so that opening the channel is paid while the caller
        # decides; the end answers once it holds the consumer (None: not opened, tried again later).
        self.early: socket.socket | None = None

    def run(self) -> None:
        if self.sink_argv and self.peer.get("control") and own_folder(self.peer["folder"]):
            # A new folder has no master in it: the sink's own ssh becomes the master (its argv says
            # ControlMaster=auto), one connection and one session set-up instead of two steps.
            self.status, self.err, self.sink = connect_with_sink(self.peer, self.sink_argv)
            return
        self.status, self.err = connect(self.peer)
        if self.status == 0 and self.sink_argv:
            with contextlib.suppress(OSError):
                self.sink = subprocess.Popen(
                    self.sink_argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
                )
        elif self.status == 0 and self.peer.get("forward"):
            self.early, _ = say_token(self.peer["forward"], float(self.peer["connect_timeout"]) + 10)

    def ready(self) -> tuple[int, str]:
        """The connection's status once the attempt ended (bounded); a failed attempt is tried once more."""
        self.join(2 * float(self.peer["connect_timeout"]) + 5)
        if self.is_alive():
            return Exit.PEER_TIMEOUT, "the connection attempt did not end in time"
        if self.status:
            self.status, self.err = connect(self.peer)
        return int(self.status or 0), self.err

    def take_early(self) -> socket.socket | None:
        early, self.early = self.early, None
        return early

    def discard(self) -> None:
        """What was opened early and not used: the sink, the connection to the end."""
        if self.sink is not None:
            with contextlib.suppress(OSError):
                self.sink.stdin.close()  # end of input before a header: the sink exits at once
        early = self.take_early()
        if early is not None:
            early.close()


# `close` after a run: the attempt has ended (the run waited for it), so there is nothing to wait for.
CLOSE_AFTER_RUN = (
    "import json,shutil,subprocess,sys;p=json.loads(sys.argv[1]);"
    "subprocess.run(p['exit'],stdin=-3,stdout=-3,stderr=-3);shutil.rmtree(p['folder'],ignore_errors=True)"
)


def close_detached(peer: dict) -> None:
    """End the master in the background, detached from this session's pipes: the session ends at once."""
    subprocess.Popen(
        [sys.executable, "-I", "-S", "-c", CLOSE_AFTER_RUN, json.dumps(peer)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


# ---- the destination's end over the master's stream-local forward --------------------------------------


class _SendSide:
    """The connection's sending half, shaped as a pipe's write end for `watched`."""

    def __init__(self, conn: socket.socket):
        self.conn = conn

    def fileno(self) -> int:
        return self.conn.fileno()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.conn.shutdown(socket.SHUT_WR)  # end of stream: the consumer gets end of input


class Forwarded:
    """The destination's end started by the orchestrator (`transfer_sink listen`), reached through the
    master's `-L` forward and shaped like a Popen for `watched`: stdin is the connection; exit status,
    stdout and stderr are the consumer's, sent back over the connection once it has ended. A connection
    that ends without them counts as a failed SSH link (255)."""

    def __init__(self, conn: socket.socket):
        self.conn = conn
        self.stdin = _SendSide(conn)
        self.returncode: int | None = None
        self._out: list[bytes] = []
        self._err: list[bytes] = []
        self._done = threading.Event()
        threading.Thread(target=self._read_outcome, daemon=True).start()

    def _read_outcome(self) -> None:
        # The outcome is one line: taken as soon as it is complete, not at the connection's end (the
        # destination's sshd sends its end of the channel only once this side acknowledged the line,
        # ~40 ms later, a delayed ACK; measured on OpenSSH 9.2).
        data = b""
        with contextlib.suppress(OSError):
            while b"\n" not in data:
                more = self.conn.recv(65536)
                if not more:
                    break
                data += more
        try:
            outcome = json.loads(data.split(b"\n", 1)[0].decode(errors="replace"))
            self.returncode = int(outcome["status"])
            self._out = [line + b"\n" for line in str(outcome.get("stdout") or "").encode().splitlines()]
            self._err = [str(line).encode() + b"\n" for line in outcome.get("stderr") or []]
        except (ValueError, KeyError, IndexError, TypeError):
            self.returncode = SSH_TRANSPORT_FAILURE
            self._err = [b"the destination's end closed the connection without the consumer's outcome\n"]
        self._done.set()

    def _lines(self, which: str):
        self._done.wait()
        yield from getattr(self, which)

    @property
    def stdout(self):
        return self._lines("_out")

    @property
    def stderr(self):
        return self._lines("_err")

    def wait(self) -> int:
        self._done.wait()
        return int(self.returncode)

    def kill(self) -> None:
        with contextlib.suppress(OSError):
            self.conn.shutdown(socket.SHUT_RDWR)  # the destination's end sees the stream cut


def say_token(forward: dict, timeout: float) -> tuple[socket.socket | None, str]:
    """Connect to the destination's end through the forward and say the token: the connection, its
    answer still to come (`hear_answer`), or (None, why)."""
    # The destination's sshd does not set TCP_NODELAY on a connection without a session: a small
    # packet it sends waits for this side's ACK of the one before, which this side delays ~40 ms
    # when it has nothing to send (measured on OpenSSH 9.2). The first channel of a connection just
    # made would wait so for its confirmation (44 ms in 10 runs of 10); a throwaway channel to the
    # same end, opened just before and saying NUDGE, takes that wait (then 2 ms in 10 of 10). It is
    # left open: closing it would make sshd send one more small packet just before the end's answer.
    with contextlib.suppress(OSError):
        nudge = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        NUDGES.append(nudge)
        nudge.connect(forward["local"])
        nudge.sendall(NUDGE.encode() + b"\n")
    time.sleep(0.001)
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.settimeout(timeout)
    try:
        conn.connect(forward["local"])
        conn.sendall((str(forward["token"]) + "\n").encode())
    except OSError as exc:
        conn.close()
        return None, f"{type(exc).__name__}: {exc}"
    return conn, ""


def hear_answer(conn: socket.socket, timeout: float) -> tuple[Forwarded | None, str]:
    """(the end, "") once it answered `+` (it holds the consumer and relays), else (None, why): refused,
    or forwarding not allowed by the destination's sshd (the connection closes at once)."""
    conn.settimeout(timeout)
    try:
        answer = conn.recv(1)
    except OSError as exc:
        conn.close()
        return None, f"{type(exc).__name__}: {exc}"
    if answer != SERVED:
        conn.close()
        return None, "refused by the destination's end" if answer else "the forward was closed at once"
    conn.settimeout(None)
    return Forwarded(conn), ""


def open_forward(forward: dict, timeout: float) -> tuple[Forwarded | None, str]:
    """Connect to the destination's end through the forward, say the token and hear its answer."""
    conn, why = say_token(forward, timeout)
    return hear_answer(conn, timeout) if conn is not None else (None, why)


# ---- progress -----------------------------------------------------------------------------------------


class Progress:
    """`PROGRESS_DIR/<operation>.json` (`~/.qwen35/progress`), replaced atomically, at most once a second."""

    def __init__(self, spec: dict, started_at: float):
        self.path = ""
        operation = str(spec.get("operation") or "")
        if spec.get("progress", True) and OPERATION.match(operation):
            folder = os.path.expanduser(PROGRESS_DIR)
            with contextlib.suppress(OSError):
                os.makedirs(folder, exist_ok=True)
                self.path = os.path.join(folder, f"{operation}.json")
        self.doc = {
            "operation": operation,
            "node": spec.get("node", ""),
            "peer": spec.get("peer_label", ""),
            "stage": "connecting",
            "bytes_done": 0,
            "bytes_total": int(spec.get("bytes_total") or 0),
            "rate_bps": 0,
            "eta_s": None,
            "started_at": round(started_at, 3),
            "updated_at": round(started_at, 3),
            "pid": os.getpid(),
        }
        self.written_at = 0.0

    def update(self, stage: str, done: int, elapsed: float, force: bool = False) -> None:
        now = time.monotonic()
        if not self.path or (not force and now - self.written_at < 1.0):
            return
        self.written_at = now
        rate = done / elapsed if elapsed > 0 else 0.0
        total = self.doc["bytes_total"]
        eta = (total - done) / rate if rate > 0 and total > done else (0 if total and done >= total else None)
        self.doc.update(
            stage=stage,
            bytes_done=done,
            rate_bps=int(rate),
            eta_s=None if eta is None else round(eta, 1),
            updated_at=round(time.time(), 3),
        )
        partial = f"{self.path}.{os.getpid()}.tmp"
        with contextlib.suppress(OSError):
            with open(partial, "w") as handle:
                json.dump(self.doc, handle)
            os.replace(partial, self.path)

    def remove(self) -> None:
        if self.path:
            with contextlib.suppress(OSError):
                os.unlink(self.path)


def run(spec: dict, link: PeerLink | None = None) -> int:
    """The transfer: connect (or use `link`, started earlier), then the watched pipeline; one report."""
    started, started_at = time.monotonic(), time.time()
    progress = Progress(spec, started_at)
    report: dict = {"preflight": None, "stages": [], "bytes": 0, "error": "", "seconds": 0.0}
    lock = threading.Lock()

    def say(line: str) -> None:
        with lock:
            sys.stderr.write(line + "\n")
            sys.stderr.flush()

    peer = spec.get("peer")
    reach = None
    ended: list[bool] = []

    def end_connection() -> None:
        """Before the report goes out: once it is out, the caller may end this session at once."""
        if not ended:
            ended.append(True)
            if link is not None:
                # An attempt still under way (an error before the connection was waited for) ends
                # first: a master that comes up after the close would be left behind.
                link.join(2 * float(peer["connect_timeout"]) + 5)
                link.discard()
            if peer:
                close_detached(peer)

    try:
        if peer:
            progress.update("connecting", 0, 0.0, force=True)
            if link is None:
                link = PeerLink(peer, None)
                link.start()
            # The producers start at once; their start-up overlaps the connection coming up (what
            # they make waits in the pipe), which `reach` waits for.
            reach = functools.partial(connected_end, link, peer, spec, report)
        try:
            result = watched_pipeline.watched(spec, progress, started, say, reach)
        except NotConnected:
            end_connection()
            return finish(report, progress, started, Exit.FAILED)
        report.update(result)
        failed = report["error"] or any(stage["status"] for stage in report["stages"])
        end_connection()
        return finish(report, progress, started, Exit.FAILED if failed else Exit.OK)
    finally:
        end_connection()


class NotConnected(Exception):
    """The connection to the destination could not be made (the report's preflight says why)."""


def connected_end(
    link: PeerLink, peer: dict, spec: dict, report: dict
) -> subprocess.Popen | Forwarded | None:
    """Once the connection is up: the destination's end opened early (its sink, or through the
    forward), or None (the consumer is then run over the connection). Raises NotConnected."""
    status, err = link.ready()
    report["preflight"] = status
    if status:
        report["preflight_stderr"] = err[-2000:]
        raise NotConnected
    sink, link.sink = link.sink, None
    if sink is None and peer.get("forward") and spec.get("use_forward"):
        return reach_forward(peer, report, link.take_early())
    return sink


def reach_forward(peer: dict, report: dict, early: socket.socket | None) -> Forwarded | None:
    """The destination's end through the forward (its answer on the connection opened `early`, else on
    one opened now: the end may not have listened yet when the master came up), or None (not served:
    the consumer then runs in a session of its own over the master, as without one); the report says
    which."""
    timeout = float(peer["connect_timeout"]) + 10
    deadline = time.monotonic() + timeout
    end = hear_answer(early, timeout)[0] if early is not None else None
    why = ""
    if end is None:  # within what is left of the wait: an end that never answered is not waited for twice
        end, why = open_forward(peer["forward"], max(1.0, deadline - time.monotonic()))
    report["forward"] = "used" if end is not None else f"not used: {why}"
    return end


def serve(spec: dict) -> int:
    """One operation's session: early connection and sink, the caller's inspection, then maybe a run."""
    peer = spec.get("peer")
    link = PeerLink(peer, spec.get("sink")) if peer else None
    if link is not None:
        link.start()
    try:
        before = spec.get("before")
        if before:
            done = subprocess.run(before, stdin=subprocess.DEVNULL, capture_output=True)
            outcome = {
                "status": done.returncode,
                "stdout": done.stdout.decode(errors="replace"),
                "stderr": done.stderr.decode(errors="replace")[-4000:],
            }
            sys.stdout.write(json.dumps({"before": outcome}) + "\n")
            sys.stdout.flush()
        line = sys.stdin.readline()
        try:
            request = json.loads(line) if line.strip() else {}
        except ValueError:
            request = {}
        if isinstance(request, dict) and request.get("run"):
            served, link = link, None  # run() ends the connection itself
            return run({**request["run"], "peer": peer}, served)
        return Exit.OK
    finally:
        if link is not None:
            link.join(2 * float(peer["connect_timeout"]) + 5)  # a sink opened meanwhile is discarded too
            link.discard()
            # Ended unused (the caller skips or retags): end the master before the session ends, so
            # nothing is left behind when the caller returns; nothing waits on a transfer here.
            close(peer)


def finish(report: dict, progress: Progress, started: float, status: int) -> int:
    progress.remove()
    report["seconds"] = round(time.monotonic() - started, 3)
    sys.stdout.write(json.dumps(report) + "\n")
    sys.stdout.flush()
    return int(status)


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("serve", "run", "close"):
        sys.stderr.write("usage: transfer_source serve|run|close SPEC\n")
        return Exit.USAGE
    spec = json.loads(argv[1])
    if argv[0] == "serve":
        return serve(spec)
    if argv[0] == "close":
        return close(spec["peer"])
    return run(spec)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
