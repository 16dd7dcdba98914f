"""The watchdog's acts: a recovery in its steps (diagnose; stop; wait for memory, `watchdog_memory`;
start; wait for ready), the restart budget it spends, stopping everything when that is spent, and the
reset once an operator starts it all again. What to restart and whether the budget allows it are the
policy's (`watchdog_policy`); the stops and starts are the World's. A library of `watchdog`: standard
library only; it travels with the program to the node.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from components.node_programs import health_wire
from components.node_programs.watchdog_memory import MemoryGate
from components.node_programs.watchdog_policy import (
    SPENT_NEXT_STEP,
    budget_left,
    episode_from,
    in_window,
    memory_held,
    restart_step,
    restart_targets,
    spent_why,
)
from components.node_programs.watchdog_settings import Settings, Target
from components.node_programs.watchdog_state import RESTART_KEEP, Persisted, Status, log
from components.node_programs.watchdog_world import World

LOG_TAIL = 20  # server log lines kept in a diagnosis


class Recovery:
    """A recovery's steps, driven by the checks that call for one (`recover`) and by the watchdog's
    tick while it waits for memory (`memory_wait`); every restart recorded in the persisted history."""

    def __init__(
        self,
        settings: Settings,
        world: World,
        status: Status,
        persisted: Persisted,
        save: Callable[[dict], None],
        clock: Callable[[], float] = time.time,
    ):
        self.s, self.world, self.st, self.p, self._save = settings, world, status, persisted, save
        self.clock = clock
        self.memory = MemoryGate(settings, world, status)

    def budget_left(self, now: float) -> int:
        return budget_left(self.s, self.p.restarts, now)

    def recover(self, now: float, reason: str, step: health_wire.Step, tripped: dict | None = None) -> None:
        """Diagnose (naming the guard's trip `tripped` that called for it, if one did), then, within the
        budget, stop what `step` restarts and wait for memory before it starts again."""
        step = restart_step(self.s, step)
        self.st.reason = reason
        self.st.step = health_wire.Step.DIAGNOSE
        self.st.enter(health_wire.State.RECOVERING, now)
        self.st.diagnosis = self.diagnose(now, reason, tripped)
        if self.s.mode == health_wire.Mode.REPORT.value:
            self.st.step = None
            self.st.would = {"at": now, "step": step.value, "reason": reason}
            self.st.next_step = f"report mode: would {step.value.replace('_', ' ')} ({reason}); acting is off"
            self.st.enter(health_wire.State.FAILING, now)
            return
        if self.budget_left(now) <= 0:
            self.spend(now, reason, step)
            return
        targets = restart_targets(self.s, step)
        for target in reversed(targets):
            self.do("stop", target)
        self.st.pending, self.st.after = targets, step
        self.memory.begin()
        self.st.step, self.st.step_deadline = health_wire.Step.MEMORY_WAIT, now + self.s.memory_wait_s
        self.memory_wait(now)

    def do(self, action: str, target: Target) -> dict:
        done = self.act(action, target, "watchdog")
        log(f"{action} {target.name} on {target.node}: {'done' if done.get('ok') else done.get('error')}")
        return done

    def act(self, action: str, target: Target, by: str) -> dict:
        """Stop or start `target` for `by` (`watchdog`, or the head's memory guard: `guard`), remembering
        when (the head's clock): the Docker events it makes are then its own, not someone else's."""
        record = {"node": target.node, "name": target.name, "action": action, "by": by}
        record.update(begin=self.clock(), end=None)
        self.st.docker.own.append(record)
        try:
            return (self.world.stop if action == "stop" else self.world.start)(target)
        finally:
            record["end"] = self.clock()

    def memory_wait(self, now: float) -> None:
        """Start what the recovery stopped once every node has the memory for it; past `memory_wait_s`
        the restart is held (`memory_held`) and the watchdog stops acting."""
        short, refused = self.memory.check(now)
        if not short and not refused:
            self._start(now)
            return
        if now < self.st.step_deadline:
            names = ", ".join(item[0] for item in short or refused)
            rule = "" if short else " (vLLM's start-up rule)"
            self.st.next_step = f"waiting for memory on {names} before the restart{rule}"
            return
        held = memory_held(short, refused)
        log(held["message"])
        self.st.held = held
        self.st.step, self.st.pending, self.st.next_step = None, [], held["message"]
        self.st.enter(health_wire.State.MEMORY_HELD, now)

    def _start(self, now: float) -> None:
        after = self.st.after
        for target in self.st.pending:
            self.do("start", target)
        self.st.completion_failures, self.st.stall_since, self.st.progress = 0, None, None
        self.record_restart(now, self.st.reason, after)
        self.st.step, self.st.step_deadline = after, now + self.s.ready_s
        self.st.next_step = f"{after.value}: waiting up to {self.s.ready_s:g} s for ready"
        self.st.pending = []

    def record_restart(self, now: float, reason: str, step: health_wire.Step) -> None:
        self.p.restarts.append({"at": now, "reason": reason, "step": step.value})
        self.p.restarts = in_window(self.s, self.p.restarts, now)[-RESTART_KEEP:]
        self.p.restarts_total[reason] = self.p.restarts_total.get(reason, 0) + 1
        self._persist()

    def spend(self, now: float, reason: str, step: health_wire.Step) -> None:
        """The budget is spent: stop the server and the cluster (their memory is freed), keep why, and
        wait for an operator."""
        why = spent_why(self.s, reason, step)
        log(f"budget spent: {why}; stopping the server and the cluster")
        stopped = []
        for target in reversed(self.s.cluster):
            self.do("stop", target)
            stopped.append({"node": target.node, "name": target.name})
        if self.s.server not in self.s.cluster:
            self.do("stop", self.s.server)
            stopped.append({"node": self.s.server.node, "name": self.s.server.name})
        self.p.spent, self.p.stopped = {"at": now, "why": why}, stopped
        self._persist()
        self.st.step, self.st.pending, self.st.next_step = None, [], SPENT_NEXT_STEP
        self.st.enter(health_wire.State.BUDGET_SPENT, now)

    def check_reset(self, now: float) -> None:
        """Spent: reset once every container the watchdog stopped runs again (an operator started them)."""
        wanted = self.p.stopped
        if not wanted:
            return
        running = set()
        for node in {item["node"] for item in wanted}:
            running |= {(node, c["name"]) for c in self.world.containers(node) if c.get("state") == "running"}
        if all((item["node"], item["name"]) in running for item in wanted):
            why = "the containers it had stopped run again (started by an operator)"
            log(f"budget reset: {why}")
            self.p.budget_resets.append({"at": now, "why": why, "spent": self.p.spent})
            self.p.restarts, self.p.spent, self.p.stopped = [], None, []
            self._persist()
            self.st.grace_from, self.st.ever_ready, self.st.failures = now, False, 0
            self.st.next_step = "budget reset: waiting for the server to be ready"
            self.st.enter(health_wire.State.STARTING, now)

    def diagnose(self, now: float, reason: str, tripped: dict | None = None) -> dict:
        """What an operator needs to see after the fact; every read bounded, every failure recorded."""
        found: dict[str, Any] = {"at": now, "reason": reason, "containers": {}, "mem_available_bytes": {}}
        for node in self.s.nodes:
            found["containers"][node.name] = self.world.containers(node.name)
            available, why = self.world.mem_available(node.name)
            self.st.mem[node.name] = available
            found["mem_available_bytes"][node.name] = available if why is None else why
        found["ray_nodes"] = self.world.ray_nodes() if self.s.executor == "ray" else None
        found["progress"] = self.st.progress
        # The server's last lines go to this program's log only: /state answers anyone who can reach it.
        for line in self.world.logs(self.s.server, LOG_TAIL):
            log(f"{self.s.server.name}: {line}")
        found["server_logs"] = (
            f"not in /state: the watchdog's own log on {self.s.head}, "
            f"or `docker logs {self.s.server.name}` on {self.s.server.node}"
        )
        since = episode_from(self.s, now, self.st.last_ready)
        found["kernel"] = {n.name: self.world.kernel_faults(n.name, since) for n in self.s.nodes}
        if tripped:
            found["memory_guard"] = tripped
        # Docker's `oom` events of this episode: a process killed inside a container that may run on.
        found["docker_oom"] = [
            {k: event.get(k) for k in ("node", "name", "at")}
            for event in self.st.docker.ooms
            if event["at"] >= since
        ]
        found["fault"] = health_wire.fault_summary(found)
        unchecked = [n.name for n in self.s.nodes if n.need_bytes is None]
        if unchecked:
            found["memory_check"] = (
                f"no memory fit recorded for {', '.join(unchecked)}: MemAvailable is not checked there"
            )
        log(f"diagnosis: {json.dumps({k: v for k, v in found.items() if k != 'server_logs'})[:2000]}")
        return found

    def _persist(self) -> None:
        self._save(self.p.as_dict())
