"""Per-operation SSH masters from the orchestrator to the nodes: one connection per node, opened
first, shared by every command of the operation, all closed at its end."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Collection, Iterator

from components.remote import SshTarget, ssh_options
from components.transfer.timing import PhaseTimes

MASTER_PERSIST_S = 30  # an orchestrator that died leaves no connection behind for longer


@contextlib.contextmanager
def ssh_sessions(times: PhaseTimes | None = None) -> Iterator[Callable[[str], str]]:
    """Control paths for one operation's SSH connections; every master is closed at the end.

    Connection setup dominates a short operation (each new SSH session costs a key exchange and the
    node's login shell); one master per node makes the many short commands cheap. `path(role)`
    gives the socket for a role.
    """
    folder = tempfile.mkdtemp(prefix="qni-", dir="/tmp")  # short: unix socket paths are limited
    used: dict[str, str] = {}

    def path(role: str) -> str:
        return used.setdefault(role, os.path.join(folder, role))

    try:
        yield path
    finally:
        with times.span("close SSH masters") if times else contextlib.nullcontext():
            close_masters(used.values())
        shutil.rmtree(folder, ignore_errors=True)


def close_masters(socket_paths: Collection[str]) -> None:
    """Ask every master to exit, all at once; a master wedged on a dead link must not hang the
    operation's cleanup (it is left to end by itself)."""
    closing = [
        subprocess.Popen(
            ["ssh", "-F", "/dev/null", "-o", f"ControlPath={socket_path}", "-O", "exit", "x"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for socket_path in socket_paths
        if os.path.exists(socket_path)
    ]
    deadline = time.monotonic() + 10
    for process in closing:
        try:
            process.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def open_master(target: SshTarget, control_path: str) -> None:
    """Connect to the node now, without running a remote shell; later commands share the connection.

    Best effort: when this fails, the first command connects by itself and reports why, with retries.
    """
    argv = [
        "ssh",
        # First value wins in ssh: these override the ControlMaster=auto of ssh_options.
        "-o", "ControlMaster=yes",
        "-o", f"ControlPersist={MASTER_PERSIST_S}",
        *ssh_options(target, control_path),
        "-f", "-N",
        target.destination,
    ]  # fmt: skip
    with contextlib.suppress(subprocess.TimeoutExpired, OSError):
        subprocess.run(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=target.connect_timeout * 2 + 5,
        )
