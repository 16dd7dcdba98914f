"""A second lab beside the first: the same nodes, addresses and ports, in a network namespace of its own,
with its own runtime state (LAB_DIR) and Docker data roots (LAB_DATA_DIR). Nothing of it is shared with
the first lab but the cache (which takes its locks), so both run at once on one machine: `make test`
runs the engine tier's stand-in modules on it beside the lab tier (tests/tiers.py, docs/testing.md).

Run as `python -m lab.apart COMMAND [ARG...]`: COMMAND runs inside the second lab's namespace (made
once, its loopback up) with LAB_DIR and LAB_DATA_DIR set to the second lab's; every lab command and
test session there sees only the second lab. It needs root, as the lab does.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from lab.layout import LabError
from lab.netns import ensure_netns, netns_argv
from lab.nodes import require_root

SECOND_LAB_DIR = "/run/qwen35-lab2"
SECOND_DATA_DIR = "/var/lib/qwen35-lab2"
# Outside SECOND_LAB_DIR: the lab's `down` unmounts what lies under its own folders.
NETNS = Path("/run/qwen35-lab2.netns")


def second_lab_env(environ: dict[str, str]) -> dict[str, str]:
    """`environ` for a process of the second lab (whatever lab the caller's own variables name)."""
    return {**environ, "LAB_DIR": SECOND_LAB_DIR, "LAB_DATA_DIR": SECOND_DATA_DIR}


def apart_argv(argv: list[str]) -> list[str]:
    """`argv` run inside the second lab's network namespace (made now when missing)."""
    require_root()
    ensure_netns(NETNS)
    return netns_argv(NETNS, argv)


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python -m lab.apart COMMAND [ARG...]", file=sys.stderr)
        return 2
    try:
        command = apart_argv(argv)  # nsenter finds COMMAND on PATH
    except LabError as exc:
        print(f"lab.apart: {exc}", file=sys.stderr)
        return 1
    os.execve(command[0], command, second_lab_env(dict(os.environ)))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
