"""Per-operation SSH masters from the orchestrator to the nodes: one connection per node, made by the
operation's first command to that node (`ControlMaster=auto`, see `remote.ssh_options`), shared by
every command after it, all closed at the operation's end."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Collection, Iterator

from components.remote import require_ssh
from components.transfer.timing import PhaseTimes


@contextlib.contextmanager
def ssh_sessions(times: PhaseTimes | None = None) -> Iterator[Callable[[str], str]]:
    """Control paths for one operation's SSH connections; every master is asked to exit at the end.

    Connection setup dominates a short operation (each new SSH session costs a key exchange and the
    node's login shell); one master per node makes the many short commands cheap. `path(role)`
    gives the socket for a role.
    """
    require_ssh()
    folder = tempfile.mkdtemp(prefix="qni-", dir="/tmp")  # short: unix socket paths are limited
    used: dict[str, str] = {}

    def path(role: str) -> str:
        return used.setdefault(role, os.path.join(folder, role))

    try:
        yield path
    finally:
        with times.span("close SSH masters") if times else contextlib.nullcontext():
            # Asked at once; their answers (and the folder's removal) are waited for off the
            # operation's path, by a thread the process waits for at exit (at most ~10 s).
            closing = ask_masters_to_exit(used.values())
            threading.Thread(target=_reap, args=(closing, folder), daemon=False).start()


def ask_masters_to_exit(socket_paths: Collection[str]) -> list[subprocess.Popen]:
    """Ask every master to exit, all at once."""
    return [
        subprocess.Popen(
            ["ssh", "-F", "/dev/null", "-o", f"ControlPath={socket_path}", "-O", "exit", "x"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for socket_path in socket_paths
        if os.path.exists(socket_path)
    ]


def _reap(closing: list[subprocess.Popen], folder: str) -> None:
    """Wait for the masters' answers, then remove their folder; a master wedged on a dead link must
    not hold the process (it is left to end by itself)."""
    deadline = time.monotonic() + 10
    for process in closing:
        try:
            process.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    shutil.rmtree(folder, ignore_errors=True)
