"""The watchdog's settings (its part of QWEN35_HEALTH_CONFIG, read once at its start) and the bounds
they imply (docs/health.md, "What the watchdog will do"). A library of `watchdog`: standard library
only, pure; it travels with the program to the node.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

# Allowance for /health's and /metrics' reads in a tick of a hang /health hides (they answer at once).
READS_S = 2.0
# Standing back for a stop someone else sent (issue 53) lasts at most the container's stop timeout plus
# this: then the server is judged again.
STAND_BACK_EXTRA_S = 60.0


@dataclass(frozen=True)
class Target:
    """One container the watchdog may stop and start: on which node, and how long its stop may take."""

    node: str
    name: str
    stop_timeout_s: int = 30


@dataclass(frozen=True)
class NodeSettings:
    name: str
    fabric_ip: str
    agent: str | None  # host:port of its agent; None on the head (the watchdog's own socket)
    need_bytes: int | None
    containers: tuple[str, ...]


@dataclass(frozen=True)
class Settings:
    """The watchdog's part of QWEN35_HEALTH_CONFIG."""

    mode: str
    interval_s: float
    deadline_s: float
    completion_every: int
    completion_deadline_s: float
    failures: int
    startup_s: float
    ready_s: float
    memory_wait_s: float
    max_restarts: int
    window_s: float
    executor: str
    head: str
    nodes: tuple[NodeSettings, ...]
    server: Target
    # Start order of a cluster restart (stopped in reverse); the server is the last to start.
    cluster: tuple[Target, ...]
    vllm_url: str = ""
    model: str = ""
    ray_dashboard: str | None = None
    metrics_host: str = "127.0.0.1"
    port: int = 29592
    stall_s: float = 300.0
    memory_floor_bytes: int | None = None  # the memory guard's floor (None: off)
    memory_floor_s: float = 5.0
    guard_stop_s: int = 10  # the guard's stop: SIGTERM, then SIGKILL after this many seconds
    # A completion sent while /metrics says the engine is idle: due every probe, within this deadline.
    idle_completion_deadline_s: float = 10.0
    # serve.gpu_memory_utilization: vLLM's start-up rule is checked before a restart (None: not)
    gpu_memory_utilization: float | None = None

    @staticmethod
    def from_json(text: str) -> Settings:
        raw = json.loads(text)

        def target(item: dict) -> Target:
            return Target(item["node"], item["name"], int(item.get("stop_timeout_s", 30)))

        return Settings(
            mode=raw["mode"],
            interval_s=float(raw["interval_s"]),
            deadline_s=float(raw["deadline_s"]),
            completion_every=int(raw["completion_every"]),
            completion_deadline_s=float(raw["completion_deadline_s"]),
            failures=int(raw["failures"]),
            startup_s=float(raw["startup_s"]),
            ready_s=float(raw["ready_s"]),
            memory_wait_s=float(raw["memory_wait_s"]),
            max_restarts=int(raw["max_restarts"]),
            window_s=float(raw["window_s"]),
            executor=raw["executor"],
            head=raw["head"],
            nodes=tuple(
                NodeSettings(
                    n["name"], n["fabric_ip"], n.get("agent"), n.get("need_bytes"), tuple(n["containers"])
                )
                for n in raw["nodes"]
            ),
            server=target(raw["server"]),
            cluster=tuple(target(t) for t in raw["cluster"]),
            vllm_url=raw.get("vllm_url", ""),
            model=raw.get("model", ""),
            ray_dashboard=raw.get("ray_dashboard"),
            metrics_host=raw.get("metrics_host", "127.0.0.1"),
            port=int(raw.get("port", 29592)),
            stall_s=float(raw.get("stall_s", 300)),
            memory_floor_bytes=raw.get("memory_floor_bytes"),
            memory_floor_s=float(raw.get("memory_floor_s", 5)),
            guard_stop_s=int(raw.get("guard_stop_s", 10)),
            idle_completion_deadline_s=float(raw.get("idle_completion_deadline_s", 10)),
            gpu_memory_utilization=raw.get("gpu_memory_utilization"),
        )

    def node(self, name: str) -> NodeSettings:
        return next(n for n in self.nodes if n.name == name)

    def serving(self) -> tuple[Target, ...]:
        """Every container that serves (the cluster's and the server), each once, in start order."""
        return tuple(dict.fromkeys((*self.cluster, self.server)))

    def stand_back_s(self, node: str, name: str) -> float:
        """The longest the watchdog stands back while someone else stops the serving container `name`
        on `node`: its stop timeout (SIGKILL after it), plus a minute."""
        found = next((t for t in self.serving() if (t.node, t.name) == (node, name)), Target(node, name))
        return found.stop_timeout_s + STAND_BACK_EXTRA_S

    def idle_deadline_s(self) -> float:
        """The deadline of a completion sent to an idle engine (never longer than a busy one's)."""
        return min(self.idle_completion_deadline_s, self.completion_deadline_s)

    def hang_bound_s(self) -> float:
        """The longest a hang that /health hides goes undeclared while the engine was idle
        (docs/health.md): a completion is due every probe, so the wait for the next tick, then
        `failures` completions in a row, each run to its deadline after a /health and a /metrics read
        that answer at once (READS_S). At the defaults: 3 x max(10, 10 + 2) + 10 = 46 s. Under load a
        hang is the stall rule's: `stall_bound_s`."""
        hung_tick = READS_S + self.idle_deadline_s()
        period = max(self.interval_s, hung_tick)
        return self.failures * period + self.idle_deadline_s()

    def unread_bound_s(self) -> float:
        """The bound where /metrics cannot be read (no idle engine known): a completion every
        `completion_every` probes, each within `completion_deadline_s` after reads within `deadline_s`."""
        hung_tick = 2 * self.deadline_s + self.completion_deadline_s
        period = max(self.interval_s, hung_tick)
        return self.completion_every * self.interval_s + (self.failures - 1) * period + hung_tick

    def stall_bound_s(self) -> float:
        """The longest a hang under load goes undeclared: `stall_s` without a token counted, seen at the
        next tick (a tick may wait out a completion's deadline)."""
        return self.stall_s + max(self.interval_s, READS_S + self.completion_deadline_s)
