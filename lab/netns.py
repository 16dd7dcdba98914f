"""Network namespaces for lab nodes behind a jump: made, entered (one thread, briefly), removed."""

from __future__ import annotations

import contextlib
import ctypes
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

from lab.engines import find_binary
from lab.layout import LabError

CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


def is_netns(path: Path) -> bool:
    """Whether `path` is a live network namespace (an nsfs bind mount), not a leftover plain file."""
    for line in Path("/proc/self/mounts").read_text().splitlines():
        fields = line.split()
        if len(fields) > 2 and fields[1] == str(path) and fields[2] == "nsfs":
            return True
    return False


def ensure_netns(path: Path) -> None:
    """A persistent network namespace bound at `path`, with its loopback up (idempotent)."""
    if not is_netns(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
        argv = [find_binary("unshare"), f"--net={path}", "true"]
        made = subprocess.run(argv, capture_output=True, text=True)
        if made.returncode != 0:
            raise LabError(f"lab: cannot make a network namespace at {path}: {made.stderr.strip()}")
    up = subprocess.run(
        [find_binary("nsenter"), f"--net={path}", find_binary("ip"), "link", "set", "lo", "up"],
        capture_output=True,
        text=True,
    )
    if up.returncode != 0:
        raise LabError(f"lab: cannot bring up the loopback in {path}: {up.stderr.strip()}")


def netns_argv(path: Path, argv: list[str]) -> list[str]:
    """`argv` run inside the namespace at `path` (nsenter execs it: the pid stays the same)."""
    return [find_binary("nsenter"), f"--net={path}", *argv]


@contextlib.contextmanager
def in_netns(path: Path) -> Iterator[None]:
    """The calling thread inside the namespace at `path` until the block ends; sockets made there stay
    there (a server bound inside keeps serving after the thread is back)."""
    with open("/proc/thread-self/ns/net") as own, open(path) as target:
        _setns(target.fileno(), f"enter the network namespace {path}")
        try:
            yield
        finally:
            _setns(own.fileno(), f"leave the network namespace {path}")


def _setns(fd: int, what: str) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        raise LabError(f"lab: cannot {what}: {os.strerror(ctypes.get_errno())}")
