"""Test sessions sharing the lab: a node a session started is stopped when no live session still
wants it, and a lab that a developer brought up by hand (`make lab-up`) is never stopped.

Each `lab_session` holds its own lease, naming its process and the nodes it wants. Sessions nest: a
test module that adds node-c and node-d inside a test run's session for node-a and node-b stops only
node-c and node-d when it ends (one lease per session, never one per process)."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
from collections.abc import Callable, Iterator
from pathlib import Path

from lab.images import clear_left_images, disk_short
from lab.layout import LabNode, lab_dir, with_jumps
from lab.nodes import down_locked, lab_lock, pid_alive, running_nodes, up_locked


def _state_file() -> Path:
    return lab_dir() / "sessions.json"


def _lease(entry: object, started: list[str]) -> dict | None:
    """One lease as saved; a bare pid (the older format) wanted every node sessions started."""
    if isinstance(entry, int):
        return {"id": str(entry), "pid": entry, "nodes": list(started)}
    if isinstance(entry, dict) and isinstance(entry.get("pid"), int):
        return {
            "id": str(entry.get("id", entry["pid"])),
            "pid": entry["pid"],
            "nodes": list(entry.get("nodes", [])),
        }
    return None


def _load() -> dict:
    try:
        state = json.loads(_state_file().read_text())
    except (OSError, ValueError):
        state = {}
    started = [str(name) for name in state.get("started", [])]
    leases = [lease for entry in state.get("leases", []) if (lease := _lease(entry, started))]
    return {"started": started, "leases": leases}


def _save(state: dict) -> None:
    tmp = _state_file().with_suffix(".tmp")
    tmp.write_text(json.dumps(state) + "\n")
    tmp.replace(_state_file())


def joined(state: dict, *, running: set[str], lease: dict, alive: Callable[[int], bool]) -> dict:
    """Sessions state after `lease` joins: the nodes it wants that were not running count as
    session-started; leases of dead processes are dropped."""
    leases = [held for held in state["leases"] if alive(held["pid"]) and held["id"] != lease["id"]]
    started = sorted(set(state["started"]) | {name for name in lease["nodes"] if name not in running})
    return {"started": started, "leases": [*leases, lease]}


def left(state: dict, *, lease_id: str, alive: Callable[[int], bool]) -> tuple[dict, list[str]]:
    """Sessions state after lease `lease_id` leaves, and the session-started nodes that no live lease
    wants any more (to stop)."""
    leases = [held for held in state["leases"] if held["id"] != lease_id and alive(held["pid"])]
    wanted = {name for held in leases for name in held["nodes"]}
    stop = [name for name in state["started"] if name not in wanted]
    started = [name for name in state["started"] if name in wanted]
    return {"started": started, "leases": leases}, stop


@contextlib.contextmanager
def lab_session(wanted: list[str]) -> Iterator[dict[str, LabNode]]:
    """Bring `wanted` up for the duration of a test session; the last live session that wants a node
    it started stops it."""
    wanted = with_jumps(wanted)  # a node behind a jump is reached through it: both come up
    lease = {"id": f"{os.getpid()}-{secrets.token_hex(4)}", "pid": os.getpid(), "nodes": sorted(wanted)}
    with lab_lock():
        running = set(running_nodes())
        state = joined(_load(), running=running, lease=lease, alive=pid_alive)
        _save(state)  # recorded before up, so a failed up is still cleaned up below
        try:
            nodes = up_locked(wanted)
            # A node no session uses holds only what earlier runs left: cleared when the disk is short.
            fresh = sorted(set(wanted) - running) if disk_short() else []
            for name in fresh:
                if removed := clear_left_images(nodes[name]):
                    print(f"lab: {name}: removed {len(removed)} images earlier test runs left")
        except BaseException:
            _leave(lease["id"])
            raise
    try:
        yield nodes
    finally:
        with lab_lock():
            _leave(lease["id"])


def _leave(lease_id: str) -> None:
    state, stop = left(_load(), lease_id=lease_id, alive=pid_alive)
    if stop:
        down_locked(stop)
    _save(state)
