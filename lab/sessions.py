"""Test sessions sharing the lab: the last session out stops what sessions started, never a lab that
a developer brought up by hand (`make lab-up`)."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path

from lab.layout import LabNode, lab_dir, with_jumps
from lab.nodes import down_locked, lab_lock, pid_alive, running_nodes, up_locked


def _state_file() -> Path:
    return lab_dir() / "sessions.json"


def _load() -> dict:
    try:
        state = json.loads(_state_file().read_text())
    except (OSError, ValueError):
        state = {}
    return {"started": list(state.get("started", [])), "leases": list(state.get("leases", []))}


def _save(state: dict) -> None:
    tmp = _state_file().with_suffix(".tmp")
    tmp.write_text(json.dumps(state) + "\n")
    tmp.replace(_state_file())


def next_state(state: dict, *, running: set[str], wanted: list[str], me: int, alive) -> dict:
    """Sessions state after `me` joins: nodes not running before count as session-started."""
    leases = [pid for pid in state["leases"] if alive(pid) and pid != me] + [me]
    started = sorted(set(state["started"]) | {name for name in wanted if name not in running})
    return {"started": started, "leases": leases}


@contextlib.contextmanager
def lab_session(wanted: list[str]) -> Iterator[dict[str, LabNode]]:
    """Bring `wanted` up for the duration of a test session; the last live session stops them."""
    me = os.getpid()
    wanted = with_jumps(wanted)  # a node behind a jump is reached through it: both come up
    with lab_lock():
        running = set(running_nodes())
        state = next_state(_load(), running=running, wanted=wanted, me=me, alive=pid_alive)
        _save(state)  # recorded before up, so a failed up is still cleaned up below
        try:
            nodes = up_locked(wanted)
        except BaseException:
            _leave(me)
            raise
    try:
        yield nodes
    finally:
        with lab_lock():
            _leave(me)


def _leave(me: int) -> None:
    state = _load()
    state["leases"] = [pid for pid in state["leases"] if pid != me and pid_alive(pid)]
    if not state["leases"] and state["started"]:
        down_locked(state["started"])
        state["started"] = []
    _save(state)
