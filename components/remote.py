"""Transport to nodes: one quoting function, one set of SSH options, results as values.

Every command that reaches a node is an argument list; `shell_join` is the only place that turns
one into a shell string. `SshTransport` runs it on a node, `LocalTransport` on this machine.
"""

from __future__ import annotations

import contextlib
import random
import re
import shlex
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import IO, BinaryIO, Protocol

from components.errors import Qwen35Error
from components.node_programs import program_argv
from components.node_programs.wire import SSH_TRANSPORT_FAILURE  # noqa: F401  (re-exported)

_SAFE_ARG = re.compile(r"^[^\x00\n\r]*$")


class RemoteError(Qwen35Error, RuntimeError):
    """A command on a node failed: what ran, where, how, and what to do next."""

    def __init__(self, node: str, argv: Sequence[str], returncode: int, stderr: bytes | str, hint: str = ""):
        self.node = node
        self.argv = list(argv)
        self.returncode = returncode
        self.stderr = stderr.decode(errors="replace") if isinstance(stderr, bytes) else stderr
        self.hint = hint
        super().__init__(self._message())

    @property
    def transport_failed(self) -> bool:
        return self.returncode == SSH_TRANSPORT_FAILURE

    def _message(self) -> str:
        what = "could not be reached over SSH" if self.transport_failed else "failed"
        lines = [f"{self.node}: `{shell_join(self.argv)[:200]}` {what} (exit {self.returncode})"]
        tail = stderr_tail(self.stderr)
        if tail:
            lines.append("  stderr: " + tail.replace("\n", "\n          "))
        if self.hint:
            lines.append(f"  next: {self.hint}")
        return "\n".join(lines)


# What ssh adds after its dialer (`tcp_dial`) failed to connect, below the dialer's own message (ssh's
# usual "ssh: connect to host H port P: REASON"): noise that would push the reason out of a tail.
_DIALER_NOISE = ("mm_receive_fd: ", "proxy dialer did not pass back a connection")


def stderr_tail(text: bytes | str, lines: int = 8) -> str:
    """The last lines of a command's error output, for messages meant for people."""
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    kept = [line for line in text.strip().splitlines() if not line.startswith(_DIALER_NOISE)]
    return "\n".join(kept[-lines:])


def shell_join(argv: Sequence[str]) -> str:
    """The one function that turns an argument list into a shell command string."""
    if isinstance(argv, str):
        raise TypeError("argv must be a list of arguments, not a string")
    for arg in argv:
        if not isinstance(arg, str):
            raise TypeError(f"argument {arg!r} is not a string")
        if not _SAFE_ARG.match(arg):
            raise ValueError(f"argument {arg[:40]!r} contains a NUL or newline")
    return shlex.join(argv)


def bash_argv(script: str, pipefail: bool = False) -> list[str]:
    """The argv that runs a composed shell `script` (its values quoted by `shell_join`) with bash.

    `--norc`: sshd's bash reads ~/.bashrc even for a command, and so would this inner bash. The login
    shell sshd starts has already paid for it once; pyenv or conda set up there costs ~0.1 s or more
    for every command, and a node's shell setup must not change what our scripts do.
    """
    if not isinstance(script, str):
        raise TypeError("script must be a string")
    return ["bash", "--norc", "--noprofile", *(["-o", "pipefail"] if pipefail else []), "-c", script]


@dataclass(frozen=True)
class Result:
    """What a command did: argv, exit status and its output."""

    argv: tuple[str, ...]
    returncode: int
    stdout: bytes = b""
    stderr: bytes = b""
    node: str = "local"

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    @property
    def text(self) -> str:
        return self.stdout.decode(errors="replace")

    @property
    def out(self) -> str:
        """stdout as text, stripped (for one-line answers)."""
        return self.text.strip()

    @property
    def err(self) -> str:
        return self.stderr.decode(errors="replace").strip()

    def check(self, hint: str = "") -> Result:
        if not self.ok:
            raise RemoteError(self.node, self.argv, self.returncode, self.stderr, hint)
        return self


@dataclass(frozen=True)
class SshTarget:
    """How to reach one node over SSH. `known_hosts` pins its host key."""

    host: str
    user: str
    known_hosts: str
    port: int = 22
    identity_file: str | None = None
    proxy_jump: str | None = None
    name: str = ""
    connect_timeout: int = 10

    @property
    def label(self) -> str:
        return self.name or self.host

    @property
    def destination(self) -> str:
        return f"{self.user}@{self.host}"


# OpenSSH's own cipher list with AES-GCM first (chacha20-poly1305 is its default first choice): with
# AES instructions (x86 AES-NI, the ARMv8 crypto extensions of the GB10) AES-GCM encrypts about twice
# the bytes per CPU second, and a 120 GB checkpoint or a 20 GB image copy is bound by that CPU. The
# same ciphers, only reordered: a server that refuses AES-GCM still agrees on chacha20-poly1305.
CIPHERS = ",".join(
    (
        "aes128-gcm@openssh.com",
        "aes256-gcm@openssh.com",
        "chacha20-poly1305@openssh.com",
        "aes128-ctr",
        "aes192-ctr",
        "aes256-ctr",
    )
)


def ssh_options(
    target: SshTarget, control_path: str | None = None, dial_with: str | None = None
) -> list[str]:
    """The SSH options for a node, each with its reason. Pure, so it is tested without a node.

    `dial_with`: a Python interpreter on the machine that will run this ssh (`sys.executable` here,
    `python3` on a node); ssh then connects through `node_programs/tcp_dial.py`, with TCP_NODELAY from
    the first packet (~40 ms less per connection). None: ssh connects by itself.

    Never add `-v` here (use `-E <file>` to debug): a command's ssh that becomes a ControlPersist
    master backgrounds itself with its stdio on /dev/null only without `-v`; with it, the master
    would hold the command's pipes and every first command would wait for the master to end."""
    opts = [
        # Never prompt: a prompt would hang an unattended `pulumi up`.
        "-o", "BatchMode=yes",
        # Host keys are pinned: an unknown or changed key is an error, never accepted silently.
        "-o", "StrictHostKeyChecking=yes",
        "-o", f"UserKnownHostsFile={target.known_hosts}",
        "-o", "GlobalKnownHostsFile=/dev/null",
        # A node that does not answer fails in seconds instead of hanging.
        "-o", f"ConnectTimeout={target.connect_timeout}",
        # A dead link is noticed within ~45 s, even in the middle of a 20 GB copy.
        "-o", "ServerAliveInterval=15",
        "-o", "ServerAliveCountMax=3",
        # The operator's ssh_config must not change what we connect to.
        "-F", "/dev/null",
        "-o", "LogLevel=ERROR",
        "-o", f"Ciphers={CIPHERS}",
        "-p", str(target.port),
    ]  # fmt: skip
    if target.identity_file:
        # Only the configured key: agents with many keys hit MaxAuthTries.
        opts += ["-i", target.identity_file, "-o", "IdentitiesOnly=yes"]
    if target.proxy_jump:
        # The jump host is checked against the same pinned known_hosts.
        opts += ["-o", f"ProxyCommand={shell_join(_proxy_command(target))}"]
    elif dial_with:
        # No ~40 ms waits for delayed acknowledgements during the key exchange and login.
        dial = dial_command(dial_with, target.connect_timeout)
        opts += ["-o", f"ProxyCommand={dial}", "-o", "ProxyUseFdpass=yes"]
    if control_path:
        # Reuse one connection for the many short commands of an inspection.
        opts += ["-o", "ControlMaster=auto", "-o", f"ControlPath={control_path}", "-o", "ControlPersist=60"]
    return opts


def _proxy_command(target: SshTarget) -> list[str]:
    jump_user, _, jump_host = target.proxy_jump.rpartition("@")
    jump_host, _, jump_port = jump_host.partition(":")
    jump = SshTarget(
        host=jump_host,
        user=jump_user or target.user,
        port=int(jump_port or 22),
        known_hosts=target.known_hosts,
        identity_file=target.identity_file,
        connect_timeout=target.connect_timeout,
    )
    return ["ssh", *ssh_options(jump), "-W", "%h:%p", jump.destination]


def ssh_command(dial_with: str | None = None) -> list[str]:
    """The ssh to run with `ssh_options(…, dial_with)`. ssh starts its ProxyCommand (the dialer) with
    `$SHELL -c`; a login shell that is bash reads ~/.bashrc there (its stdin is a socket, which bash
    takes for a remote login), and a slow rc file (`conda init`) would cost every connection what the
    dialer saves. /bin/sh reads no rc file for `-c`."""
    return ["env", "SHELL=/bin/sh", "ssh"] if dial_with else ["ssh"]


def require_ssh(node: str = "this machine") -> None:
    """The transport's error when this machine has no ssh. A dialed ssh starts as `env … ssh`
    (`ssh_command`), so a missing one would otherwise look like a remote command exiting 127."""
    if shutil.which("ssh") is None:
        raise RemoteError(node, ["ssh"], 127, "no ssh on PATH", "install 'ssh' on this machine")


def dial_command(python: str, connect_timeout: int) -> str:
    """ssh's ProxyCommand that connects through `tcp_dial` run by `python` (ssh fills in %h and %p;
    a literal % in the interpreter's path is doubled for it)."""
    argv = program_argv("tcp_dial", ["%h", "%p", str(connect_timeout)], python.replace("%", "%%"))
    return shell_join(argv)


def ssh_argv(
    target: SshTarget, argv: Sequence[str], control_path: str | None = None, dial_with: str | None = None
) -> list[str]:
    """The argv that runs `argv` on the node (`dial_with`: see ssh_options)."""
    options = ssh_options(target, control_path, dial_with)
    return [*ssh_command(dial_with), *options, target.destination, "--", shell_join(argv)]


class Transport(Protocol):
    """Runs an argument list somewhere and returns a Result."""

    name: str

    def run(
        self, argv: Sequence[str], stdin: bytes | IO[bytes] | None = None, timeout: float | None = None
    ) -> Result: ...


def _run_local(
    node: str,
    local_argv: list[str],
    argv: Sequence[str],
    stdin: bytes | IO[bytes] | None,
    timeout: float | None,
) -> Result:
    kwargs: dict = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "timeout": timeout}
    if isinstance(stdin, bytes | bytearray):
        kwargs["input"] = stdin
    else:
        kwargs["stdin"] = stdin if stdin is not None else subprocess.DEVNULL
    try:
        proc = subprocess.run(local_argv, **kwargs)
    except subprocess.TimeoutExpired as exc:
        raise RemoteError(node, argv, -1, exc.stderr or b"", f"timed out after {timeout:g} s") from exc
    except FileNotFoundError as exc:
        raise RemoteError(node, argv, 127, str(exc), f"install {local_argv[0]!r} on this machine") from exc
    if proc.returncode == 127 and local_argv[0] == "env":  # ssh_command's `env … ssh`: was it ssh?
        require_ssh(node)
    return Result(tuple(argv), proc.returncode, proc.stdout, proc.stderr, node)


def lines_marked(prefix: str, relay: Callable[[str], None], strip: bool = False) -> Callable[[str], None]:
    """A relay for `run_relaying` that hands on only the lines that start with `prefix` (a node
    program's progress lines among its other stderr), with the prefix taken off when `strip`."""

    def marked(line: str) -> None:
        if line.startswith(prefix):
            relay(line.removeprefix(prefix) if strip else line)

    return marked


def run_relaying(
    node: str,
    local_argv: Sequence[str],
    argv: Sequence[str],
    stdin: bytes | Callable[[BinaryIO], None],
    timeout: float,
    relay: Callable[[str], None],
    relay_stdout: bool = False,
) -> Result:
    """Run `local_argv` (ssh … argv) like the transport does, handing each stderr line (and each stdout
    line with `relay_stdout`) to `relay` as it comes. `stdin`: bytes, or a function that writes it."""
    proc = subprocess.Popen(
        list(local_argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    out: list[bytes] = []
    err: list[bytes] = []

    def feed() -> None:
        try:
            if callable(stdin):
                stdin(proc.stdin)
            else:
                proc.stdin.write(stdin)
        except OSError:  # the remote side ended early: its exit status says why
            pass
        finally:  # a writer that failed half-way still ends the stream: the command sees a short input
            with contextlib.suppress(OSError):
                proc.stdin.close()

    def pump(stream: IO[bytes], kept: list[bytes], relayed: bool) -> None:
        for raw in stream:
            kept.append(raw)
            if relayed:
                relay(raw.decode(errors="replace").rstrip())

    threads = [
        threading.Thread(target=feed, daemon=True),
        threading.Thread(target=pump, args=(proc.stderr, err, True), daemon=True),
        threading.Thread(target=pump, args=(proc.stdout, out, relay_stdout), daemon=True),
    ]
    for thread in threads:
        thread.start()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise RemoteError(node, argv, -1, b"".join(err), f"timed out after {timeout:g} s") from None
    finally:
        for thread in threads:
            thread.join(timeout=5)
    return Result(tuple(argv), proc.returncode, b"".join(out), b"".join(err), node)


@dataclass(frozen=True)
class LocalTransport:
    """Runs commands on this machine (tests, and the node `pulumi` itself runs on)."""

    name: str = "local"
    env: dict[str, str] | None = None

    def run(self, argv, stdin=None, timeout=None) -> Result:
        local = list(argv)
        if self.env:
            local = ["env", *(f"{k}={v}" for k, v in self.env.items()), *local]
        return _run_local(self.name, local, argv, stdin, timeout)


@dataclass(frozen=True)
class SshTransport:
    """Runs commands on a node over SSH."""

    target: SshTarget
    control_path: str | None = None
    name: str = field(default="")

    def __post_init__(self):
        if not self.name:
            object.__setattr__(self, "name", self.target.label)

    def run(self, argv, stdin=None, timeout=None) -> Result:
        local = ssh_argv(self.target, argv, self.control_path, dial_with=sys.executable)
        return _run_local(self.name, local, argv, stdin, timeout)


def with_retries(
    call: Callable[[], Result],
    deadline_s: float = 60.0,
    first_delay_s: float = 1.0,
    max_delay_s: float = 10.0,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> Result:
    """Retry `call` while the SSH transport fails (exit 255), with backoff and jitter, until a deadline.

    A failure of the remote command itself is returned at once: retrying it would only repeat it.
    """
    end = clock() + deadline_s
    delay = first_delay_s
    while True:
        result = call()
        if result.returncode != SSH_TRANSPORT_FAILURE or clock() + delay > end:
            return result
        sleep(delay * random.uniform(0.5, 1.0))
        delay = min(delay * 2, max_delay_s)
