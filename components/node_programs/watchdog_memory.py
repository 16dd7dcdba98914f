"""The memory check before a restart (a recovery's `memory_wait`): every node's MemAvailable against
its need, then vLLM's start-up rule by a memory probe beside the stack's image on each node
(`gpu_memory`). It reads and judges; the recovery starts, waits or holds. A library of `watchdog`:
standard library only; it travels with the program to the node.
"""

from __future__ import annotations

import threading

from components.node_programs import gpu_memory, health_wire
from components.node_programs.watchdog_policy import short_of_memory, startup_rule
from components.node_programs.watchdog_settings import Settings
from components.node_programs.watchdog_state import Status, log
from components.node_programs.watchdog_world import CALL_TIMEOUT_S, World

RULE_RETRY_S = 15.0  # a node vLLM's start-up rule refused is probed again after this, within the wait


class MemoryGate:
    """One memory wait's checks: what the stop freed, node by node. `begin` at each wait; `check` at
    each tick of it."""

    def __init__(self, settings: Settings, world: World, status: Status):
        self.s, self.world, self.st = settings, world, status
        self.nodes: list[str] = []  # the nodes this wait checks
        self.passed: set[str] = set()  # nodes this wait's probe passed (or could not judge)
        self.retry_at: dict[str, float] = {}  # when a refused node is probed again, in this wait

    def begin(self) -> None:
        """A new wait: every node (what the stop frees), no probe run yet."""
        self.nodes = [n.name for n in self.s.nodes]
        self.passed, self.retry_at = set(), {}

    def check(
        self, now: float
    ) -> tuple[list[tuple[str, int | None, int, str | None]], list[tuple[str, dict]]]:
        """(short, refused): each node whose MemAvailable is below its need (name, available, need,
        why unknown), and, once none is short, each node whose start-up rule refuses (name, rule)."""
        short = []
        for name in self.nodes:
            need = self.s.node(name).need_bytes
            available, why = self.world.mem_available(name)
            self.st.mem[name] = available
            if short_of_memory(need, available):
                short.append((name, available, need, why))
        refused = [] if short else self._startup_rule(now)
        return short, refused

    def _startup_rule(self, now: float) -> list[tuple[str, dict]]:
        """The nodes whose probe says vLLM would refuse to start now (`gpu_memory.startup_rule`), each
        probed once every node's MemAvailable passed, and again every RULE_RETRY_S while refused; the
        nodes due are probed at once, side by side. A node whose probe cannot judge (no CUDA device in
        the image, no report) is recorded and not held."""
        util = self.s.gpu_memory_utilization
        if util is None:
            return []
        refused: list[tuple[str, dict]] = []
        due = []
        for name in self.nodes:
            if name in self.passed:
                continue
            if now < self.retry_at.get(name, 0.0):
                refused.append((name, self.st.rules[name]))
            else:
                due.append(name)
        for name, done in self._probe_all(due).items():
            # The probe's own output goes to this log only; /state keeps the bounded reason.
            if done.get("error") and done.get("output"):
                log(f"{name}: the memory probe's last lines: {done['output']}")
            rule = startup_rule(done, util, self.st.mem.get(name))
            rule.update(at=now, took_s=done.get("took_s"))
            self.st.rules[name] = rule
            if rule.get("checked") and not rule.get("ok"):
                log(gpu_memory.rule_message(name, rule))
                self.retry_at[name] = now + RULE_RETRY_S
                refused.append((name, rule))
                continue
            if rule.get("checked"):
                log(
                    f"{name}: vLLM's start-up rule passes: {health_wire.gb1(rule['free_bytes'])} free "
                    f"({rule['free_from']}), {health_wire.gb1(rule['requested_bytes'])} requested"
                )
            else:
                log(f"{name}: vLLM's start-up rule not checked: {rule['why']}")
            self.passed.add(name)
        return refused

    def _probe_all(self, nodes: list[str]) -> dict[str, dict]:
        """`World.memory_probe` of each node, in threads of their own (each is bounded by itself)."""
        found: dict[str, dict] = {}

        def one(name: str) -> None:
            try:
                found[name] = self.world.memory_probe(name)
            except Exception as exc:  # the World's own bound failed: recorded as not judged
                found[name] = {"report": None, "error": f"{type(exc).__name__}: {exc}"}

        threads = [threading.Thread(target=one, args=(name,), daemon=True) for name in nodes]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(gpu_memory.PROBE_TIMEOUT_S + gpu_memory.REMOVE_S + 2 * CALL_TIMEOUT_S)
        return {
            name: found.get(name) or {"report": None, "error": "the probe did not answer in time"}
            for name in nodes
        }
