"""What the watchdog knows between ticks (`Status`: what /state shows and the recovery under way; and
`DockerEvents`: what it read of Docker's event log, and its own stops and starts), what survives its
container (`Persisted`: state.json in the state volume), and its log. A library of
`watchdog`: standard library only; it travels with the program to the node.
"""

from __future__ import annotations

import json
import os
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from components.node_programs import health_wire
from components.node_programs.watchdog_settings import Target
from components.node_programs.watchdog_world import Probe

RESTART_KEEP = 50  # restarts kept in /state's history (the window's count is what the budget reads)
# Docker's event log (issue 53), read every tick: what is kept of it.
EVENTS_KEPT = 200  # events kept (the newest; /state shows watchdog_report.EVENTS_SHOWN of them)
OWN_KEPT = 100  # the watchdog's own stops and starts remembered, to tell their events from others'
OOM_KEPT = 20  # Docker's `oom` events kept for the next diagnosis
STAND_BACKS_KEPT = 20  # ended stand-backs kept in /state


def log(message: str) -> None:
    print(f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} watchdog: {message}", flush=True)


@dataclass
class Persisted:
    """What survives the watchdog's container (state.json in the state volume)."""

    restarts: list[dict] = field(default_factory=list)  # {at, reason, step}, newest last
    restarts_total: dict[str, int] = field(default_factory=dict)
    spent: dict | None = None  # {at, why}
    stopped: list[dict] = field(default_factory=list)  # {node, name} the watchdog stopped when spent
    budget_resets: list[dict] = field(default_factory=list)  # {at, why}

    @staticmethod
    def load(raw: dict | None) -> Persisted:
        raw = raw if isinstance(raw, dict) else {}
        return Persisted(
            restarts=list(raw.get("restarts") or []),
            restarts_total=dict(raw.get("restarts_total") or {}),
            spent=raw.get("spent"),
            stopped=list(raw.get("stopped") or []),
            budget_resets=list(raw.get("budget_resets") or [])[-RESTART_KEEP:],
        )

    def as_dict(self) -> dict:
        return {
            "restarts": self.restarts[-RESTART_KEEP:],
            "restarts_total": self.restarts_total,
            "spent": self.spent,
            "stopped": self.stopped,
            "budget_resets": self.budget_resets[-RESTART_KEEP:],
        }


@dataclass
class DockerEvents:
    """What the watchdog has read of Docker's events (issue 53), and its own stops and starts, which
    tell its events from others'. Times are the head's clock."""

    started: float = 0.0  # when the watchdog started: no event before it is read
    read: dict[str, float] = field(default_factory=dict)  # each node's events read up to
    # Why each node's last read failed (None: read; its restarts are counted from the events, else from
    # RestartCount).
    error: dict[str, str | None] = field(default_factory=dict)
    kept: deque[dict] = field(default_factory=lambda: deque(maxlen=EVENTS_KEPT))
    keys: deque[tuple] = field(default_factory=lambda: deque(maxlen=2 * EVENTS_KEPT))  # the ones seen
    own: deque[dict] = field(default_factory=lambda: deque(maxlen=OWN_KEPT))  # {node, name, action, by, …}
    guards_learned: deque[tuple] = field(default_factory=lambda: deque(maxlen=OWN_KEPT))
    ooms: deque[dict] = field(default_factory=lambda: deque(maxlen=OOM_KEPT))  # the next diagnosis's

    def read_nodes(self) -> set[str]:
        """The nodes whose events the last tick read (their restarts are counted from the events)."""
        return {node for node, error in self.error.items() if error is None}


@dataclass
class Status:
    """What the watchdog knows between ticks: its verdict, the step under way, the counts that lead to
    a verdict, and the last figures it read. Every part of the watchdog reads and writes this one
    record (a tick runs one part at a time); /state is made from it (`watchdog_report.snapshot`)."""

    state: health_wire.State
    since: float  # since when `state` holds
    grace_from: float  # no verdict before the server is first ready or startup_s has passed since this
    next_step: str
    ever_ready: bool = False
    # A recovery: its step, the reason, when the step gives up, what a memory wait starts, in order,
    # and the restart it leads to.
    step: health_wire.Step | None = None
    reason: str = ""
    step_deadline: float = 0.0
    pending: list[Target] = field(default_factory=list)
    after: health_wire.Step | None = None
    failures: int = 0  # failed /health probes in a row
    completion_failures: int = 0  # failed completions in a row: a passing /health does not clear them
    progress: dict | None = None  # the engine's last /metrics figures
    stall_since: float | None = None  # since when requests ran without a token generated
    last_ready: float | None = None
    last_probe: Probe | None = None
    last_ttft: float | None = None
    # Each serving container's last facts ({state, id, started_at, restarts}), by (node, name):
    # what tells a new container (a fresh grace) and Docker's own restarts apart.
    seen: dict[tuple[str, str], dict] = field(default_factory=dict)
    mem: dict[str, int | None] = field(default_factory=dict)
    rules: dict[str, dict] = field(default_factory=dict)  # vLLM's start-up rule per node, as last probed
    skew: dict[str, float] = field(default_factory=dict)
    refusals: dict[str, int] = field(default_factory=dict)  # each agent's refused requests
    held: dict | None = None
    diagnosis: dict | None = None
    would: dict | None = None
    guard_trips: dict[str, int] = field(default_factory=dict)  # trips seen since this watchdog started
    memory_guard: dict[str, dict] = field(default_factory=dict)  # each node's last trip
    # The server's last start as vLLM's log tells it (`cold_start.cold_start`), once it is ready.
    cold_start: dict | None = None
    docker: DockerEvents = field(default_factory=DockerEvents)
    # Serving containers someone else is stopping (a `kill` event not the watchdog's), by (node, name):
    # no verdict and no action until they are removed or started again, or the bound.
    standing: dict[tuple[str, str], dict] = field(default_factory=dict)
    stand_backs: deque[dict] = field(default_factory=lambda: deque(maxlen=STAND_BACKS_KEPT))  # ended ones
    stand_backs_total: int = 0

    def enter(self, state: health_wire.State, now: float) -> None:
        """Set the verdict; a change is logged, and `since` is when it changed."""
        if state is not self.state:
            log(f"state {self.state.value} -> {state.value}")
            self.state, self.since = state, now


def load_saved(path: str) -> dict | None:
    try:
        with open(path) as handle:
            return json.load(handle)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log(f"state file {path} unreadable ({exc}): starting from an empty history")
        return None


def saver(path: str) -> Callable[[dict], None]:
    def save(data: dict) -> None:
        tmp = f"{path}.tmp"
        with open(tmp, "w") as handle:
            json.dump(data, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)

    return save
