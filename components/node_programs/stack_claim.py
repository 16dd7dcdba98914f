"""A stack's claim on a node (standard library only): which stack's containers (by name prefix) and
host ports this node holds, so that another stack that would take them over is refused up front.

    stack_claim take SPEC   record SPEC.owner's claim (SPEC.prefix, SPEC.ports); refused (exit 3) when
                            another stack's claim has the same prefix or a port in common
    stack_claim held SPEC   whether SPEC.owner's claim is recorded, and as what
    stack_claim drop SPEC   remove SPEC.owner's claim (only its own)

Why: Docker names containers and volumes per node. A second stack with the same prefix on the same
node would adopt the first one's `<prefix>-ray-tmp` volume (a volume create of an existing name
succeeds) before its containers fail on the names, and its destroy would then try to remove that
volume from under the first stack. Host ports are per machine: two Ray heads on one port never start.
Records live in ~/.qwen35/stacks/, one JSON file per stack, changed under a lock. Every mode prints
one JSON report on stdout. `ports` are [low, high] ranges (a single port is [p, p]).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import sys
from enum import IntEnum

from components.node_programs.wire import STACK_RECORDS


class Exit(IntEnum):
    OK = 0
    CLAIMED = 3  # `take`: another stack holds the prefix or a port (the report names it)
    USAGE = 6


_OWNER = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")


def clashes(mine: dict, others: list[dict]) -> list[dict]:
    """Each other stack's claim that `mine` collides with, and how (pure)."""
    found = []
    for other in others:
        if other.get("owner") == mine["owner"]:
            continue
        reasons = []
        if other.get("prefix") == mine["prefix"]:
            reasons.append(f"containers {mine['prefix']}-*")
        shared = sorted(
            (max(a[0], b[0]), min(a[1], b[1]))
            for a in mine.get("ports") or []
            for b in other.get("ports") or []
            if max(a[0], b[0]) <= min(a[1], b[1])
        )
        if shared:
            reasons.append("ports " + ", ".join(str(lo) if lo == hi else f"{lo}-{hi}" for lo, hi in shared))
        if reasons:
            found.append({"owner": other.get("owner"), "prefix": other.get("prefix"), "clash": reasons})
    return found


@contextlib.contextmanager
def records():
    folder = os.path.expanduser(STACK_RECORDS)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield folder


def record_path(folder: str, owner: str) -> str:
    return os.path.join(folder, owner.replace("/", "--") + ".json")


def read_all(folder: str) -> list[dict]:
    found = []
    for name in sorted(os.listdir(folder)):
        if name.endswith(".json"):
            with contextlib.suppress(OSError, ValueError), open(os.path.join(folder, name)) as handle:
                found.append(json.load(handle))
    return found


def take(spec: dict) -> tuple[int, dict]:
    mine = {"owner": spec["owner"], "prefix": spec["prefix"], "ports": spec.get("ports") or []}
    with records() as folder:
        clash = clashes(mine, read_all(folder))
        if clash:
            return Exit.CLAIMED, {"taken": False, "clashes": clash}
        partial = f"{record_path(folder, mine['owner'])}.{os.getpid()}.tmp"
        with open(partial, "w") as handle:
            json.dump(mine, handle)
        os.replace(partial, record_path(folder, mine["owner"]))
    return Exit.OK, {"taken": True}


def held(spec: dict) -> tuple[int, dict]:
    with records() as folder:
        mine = [r for r in read_all(folder) if r.get("owner") == spec["owner"]]
    return Exit.OK, {"held": bool(mine), "record": mine[0] if mine else None}


def drop(spec: dict) -> tuple[int, dict]:
    with records() as folder:
        path = record_path(folder, spec["owner"])
        existed = os.path.exists(path)
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)
    return Exit.OK, {"dropped": existed}


MODES = {"take": take, "held": held, "drop": drop}


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in MODES:
        print(json.dumps({"error": "usage: stack_claim take|held|drop SPEC"}))
        return Exit.USAGE
    spec = json.loads(argv[1])
    if not _OWNER.match(str(spec.get("owner") or "")):
        print(json.dumps({"error": f"owner {spec.get('owner')!r} is not project/stack"}))
        return Exit.USAGE
    code, report = MODES[argv[0]](spec)
    print(json.dumps(report))
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
