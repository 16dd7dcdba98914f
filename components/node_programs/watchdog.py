"""The watchdog, on the head (issue 33): probe the server, and recover a hung or crashed one in steps,
memory-checked and within a restart budget; serve /metrics (Prometheus text) and /state (JSON).

    python3 -I -S -c <program> [--once]      (config: QWEN35_HEALTH_CONFIG, secret: /run/qwen35-health/secret)

Every `interval_s` one tick: a /health probe (every `completion_every`-th also a one-token chat
completion), each with its deadline. A slow answer within the deadline is not a failure. No verdict
before the server was first ready or `startup_s` has passed since the server's container started in
this boot (or the watchdog did, when that is earlier or the server has not started yet). Each time
Docker's own restart policy restarts the head's containers (a crash under `unless-stopped`, with no
memory check) spends one of the budget. After `failures` failures in a row:

  1. diagnose: every node's containers (state, exit code), Ray's live nodes under executor ray (best
     effort, bounded), every node's MemAvailable, the server's last log lines;
  2. restart the server: stop it; wait (`memory_wait_s`) until MemAvailable on the nodes it frees
     reaches their need; start it; wait `ready_s` for ready;
  3. not ready: restart the cluster the same way, node by node (ray: server, Ray workers, Ray head
     stopped; Ray head, workers, server started; mp: every rank, the headless ones before the head).

A node whose memory does not come back blocks the restart (`memory_held`) and the watchdog stops
acting. Every restart spends one of `max_restarts` per `window_s`; a recovery that finds the budget
spent stops the server and the cluster's containers (their memory is freed), records why and waits
for an operator: `budget_spent` is kept in the state volume, so neither a reboot nor a replaced
watchdog container restarts such a cluster. It resets when the watchdog sees every container it
stopped running again (the operator started them). In `report` mode it records what it would do and
never acts. The head's Docker is the mounted socket; other nodes' only through their agents.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from components.node_programs import health_wire

wire = health_wire  # the short name below

LOG_TAIL = 20  # server log lines kept in a diagnosis
CALL_TIMEOUT_S = 10.0  # any one call to an agent, the daemon or Ray (the stop's own wait is added)
RESTART_KEEP = 50  # restarts kept in /state's history (the window's count is what the budget reads)


def log(message: str) -> None:
    print(f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} watchdog: {message}", flush=True)


# ---- settings ----------------------------------------------------------------------------------------


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
        )

    def node(self, name: str) -> NodeSettings:
        return next(n for n in self.nodes if n.name == name)


# ---- what the watchdog observes and does (the World), and what it decides (Watchdog) ------------------


@dataclass(frozen=True)
class Probe:
    """One probe's outcome: `kind` ok | timeout | refused | status | error."""

    ok: bool
    latency_s: float
    kind: str = "ok"
    detail: str = ""


# A failed probe's kind as a restart's reason (`restarts_total{reason}`).
REASONS = {"timeout": "hang", "refused": "down", "status": "error", "error": "error"}


class World:
    """What the watchdog reads and does; tests give a fake one."""

    def probe_health(self, deadline_s: float) -> Probe:
        raise NotImplementedError

    def probe_completion(self, deadline_s: float) -> Probe:
        raise NotImplementedError

    def mem_available(self, node: str) -> tuple[int | None, str | None]:
        raise NotImplementedError

    def containers(self, node: str) -> list[dict]:
        raise NotImplementedError

    def stop(self, target: Target) -> dict:
        raise NotImplementedError

    def start(self, target: Target) -> dict:
        raise NotImplementedError

    def logs(self, target: Target, tail: int) -> list[str]:
        raise NotImplementedError

    def ray_nodes(self) -> dict:
        raise NotImplementedError

    def server_started_at(self) -> float | None:
        """When the server's container last started (unix seconds), None when unknown."""
        return None

    def boot_time(self) -> float | None:
        """When the head booted (unix seconds, /proc/stat's btime), None when unknown."""
        return None

    def restart_count(self) -> int | None:
        """How often Docker's own restart policy has restarted the head's containers (the sum of their
        RestartCount), None when unknown."""
        return None

    def agent_refusals(self) -> dict[str, int]:
        return {}


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


class Watchdog:
    """The decisions, one `tick()` at a time: the clock and the World are given, so tests drive it."""

    def __init__(
        self,
        settings: Settings,
        world: World,
        clock: Callable[[], float] = time.time,
        saved: dict | None = None,
        save: Callable[[dict], None] = lambda _: None,
    ):
        self.s, self.world, self.clock, self._save = settings, world, clock, save
        self.p = Persisted.load(saved)
        now = clock()
        self.grace_from = now
        self.grace_checked = False  # the server container's start time read (on the first tick)
        # The head containers' RestartCount sum when last read (Docker's own restarts: `_docker_restarts`).
        self.docker_restarts_seen: int | None = None
        self.ever_ready = False
        self.state = wire.State.BUDGET_SPENT if self.p.spent else wire.State.STARTING
        self.since = now
        self.step: wire.Step | None = None
        self.after: wire.Step | None = None  # the restart a memory wait leads to
        self.step_deadline = 0.0
        self.pending: list[Target] = []  # what a memory wait starts, in order
        self.memory_nodes: list[str] = []
        self.reason = ""
        self.failures = 0
        self.probes = 0
        self.last_ready: float | None = None
        self.last_probe: Probe | None = None
        self.last_ttft: float | None = None
        self.mem: dict[str, int | None] = {}
        self.held: dict | None = None
        self.diagnosis: dict | None = None
        self.would: dict | None = None
        self.next_step = "wait: no verdict before the server is first ready or startup_s has passed"
        if self.p.spent:
            self.next_step = self._spent_next_step()
        self.lock = threading.Lock()

    # -- the budget --

    def budget_left(self, now: float | None = None) -> int:
        now = self.clock() if now is None else now
        in_window = [r for r in self.p.restarts if now - r["at"] < self.s.window_s]
        return max(self.s.max_restarts - len(in_window), 0)

    def _spent_next_step(self) -> str:
        return (
            "the restart budget is spent and the server and cluster containers are stopped: find the "
            "cause (last_diagnosis), then start them again (`pulumi up --refresh`); the watchdog sees "
            "them running and resets its budget"
        )

    # -- one tick --

    def tick(self) -> None:
        with self.lock:
            self._tick(self.clock())

    def _set(self, state: wire.State, now: float) -> None:
        if state is not self.state:
            log(f"state {self.state.value} -> {state.value}")
            self.state, self.since = state, now

    def _tick(self, now: float) -> None:
        self.world_refusals = self.world.agent_refusals()
        if not self.grace_checked:
            # The grace runs from the containers' start: a watchdog replaced (an upgrade) while the
            # server has run for an hour gives it no new hour; after a boot both started together.
            # After a reboot the server's container may not have been started again yet: its
            # StartedAt is then the last boot's, and counts for nothing.
            self.grace_checked = True
            started, boot = self.world.server_started_at(), self.world.boot_time()
            if started is not None and (boot is None or started >= boot) and started < self.grace_from:
                self.grace_from = started
        if self.state is wire.State.BUDGET_SPENT:
            self._check_reset(now)
            return
        if self.step is wire.Step.MEMORY_WAIT:
            self._memory_wait(now)
            return
        if self._docker_restarts(now):
            return
        probe = self._probe()
        if probe.ok:
            if self.state is not wire.State.HEALTHY:
                log(f"the server is ready ({probe.latency_s:.2f} s)")
            self.failures, self.step, self.held, self.last_ready, self.ever_ready = 0, None, None, now, True
            self.next_step = "nothing to do"
            self._set(wire.State.HEALTHY, now)
            return
        if self.state is wire.State.MEMORY_HELD:
            return  # stopped acting: an operator frees the memory (reboots the node)
        if self.step in (wire.Step.RESTART_SERVER, wire.Step.RESTART_CLUSTER):
            if now >= self.step_deadline:
                log(f"not ready {self.s.ready_s:g} s after {self.step.value}: restarting the cluster")
                self._recover(now, "not_ready", wire.Step.RESTART_CLUSTER)
            return
        if not self.ever_ready and now - self.grace_from < self.s.startup_s:
            self._set(wire.State.STARTING, now)
            return
        self.failures += 1
        self._set(wire.State.FAILING, now)
        if self.failures < self.s.failures:
            self.next_step = f"{self.failures} of {self.s.failures} failed probes before a recovery"
        elif self.failures == self.s.failures or self.s.mode != wire.Mode.REPORT.value:
            # Report mode records one diagnosis per run of failures, not one per probe.
            self._recover(now, REASONS.get(probe.kind, "error"), wire.Step.RESTART_SERVER)

    def _probe(self) -> Probe:
        self.probes += 1
        probe = self.world.probe_health(self.s.deadline_s)
        if probe.ok and self.s.completion_every and self.probes % self.s.completion_every == 0:
            probe = self.world.probe_completion(self.s.completion_deadline_s)
            if probe.ok:
                self.last_ttft = probe.latency_s
        self.last_probe = probe
        if not probe.ok:
            log(f"probe failed ({probe.kind}: {probe.detail})")
        return probe

    def _docker_restarts(self, now: float) -> bool:
        """Docker's own restart policy (`unless-stopped`) restarts a crashing server at once, with no
        memory check: each such restart spends one of the budget (`docker_restart`), and one that
        finds it spent stops the cluster. True when it did."""
        count = self.world.restart_count()
        seen, self.docker_restarts_seen = self.docker_restarts_seen, count
        if count is None or seen is None or count <= seen:
            return False
        log(f"Docker restarted the head's containers {count - seen} time(s) on its own")
        for _ in range(count - seen):
            self._record_restart(now, "docker_restart", wire.Step.RESTART_SERVER)
        if self.s.mode == wire.Mode.REPORT.value or self.budget_left(now) > 0:
            return False
        self.reason = "docker_restart"
        self.diagnosis = self._diagnose(now, "docker_restart")
        self._spend(now, "docker_restart", wire.Step.RESTART_SERVER)
        return True

    # -- recovery --

    def _targets(self, step: wire.Step) -> list[Target]:
        """What `step` starts, in order (stopped in the reverse order)."""
        return [self.s.server] if step is wire.Step.RESTART_SERVER else list(self.s.cluster)

    def _freed_nodes(self, step: wire.Step) -> list[str]:
        """The nodes whose memory `step`'s stop frees: every node, except for an mp server restart (the
        head's rank alone; under Ray the server's workers live in every node's Ray container)."""
        if step is wire.Step.RESTART_SERVER and self.s.executor == "mp":
            return [self.s.server.node]
        return [n.name for n in self.s.nodes]

    def _recover(self, now: float, reason: str, step: wire.Step) -> None:
        self.reason = reason
        self.step = wire.Step.DIAGNOSE
        self._set(wire.State.RECOVERING, now)
        self.diagnosis = self._diagnose(now, reason)
        if self.s.mode == wire.Mode.REPORT.value:
            self.step = None
            self.would = {"at": now, "step": step.value, "reason": reason}
            self.next_step = f"report mode: would {step.value.replace('_', ' ')} ({reason}); acting is off"
            self._set(wire.State.FAILING, now)
            return
        if self.budget_left(now) <= 0:
            self._spend(now, reason, step)
            return
        targets = self._targets(step)
        for target in reversed(targets):
            self._do("stop", target)
        self.pending, self.after = targets, step
        self.memory_nodes = self._freed_nodes(step)
        self.step, self.step_deadline = wire.Step.MEMORY_WAIT, now + self.s.memory_wait_s
        self._memory_wait(now)

    def _do(self, action: str, target: Target) -> dict:
        done = (self.world.stop if action == "stop" else self.world.start)(target)
        log(f"{action} {target.name} on {target.node}: {'done' if done.get('ok') else done.get('error')}")
        return done

    def _memory_wait(self, now: float) -> None:
        short = []
        for name in self.memory_nodes:
            need = self.s.node(name).need_bytes
            available, why = self.world.mem_available(name)
            self.mem[name] = available
            if need is not None and (available is None or available < need):
                short.append((name, available, need, why))
        if not short:
            for target in self.pending:
                self._do("start", target)
            self._record_restart(now, self.reason, self.after)
            self.step, self.step_deadline = self.after, now + self.s.ready_s
            self.next_step = f"{self.after.value}: waiting up to {self.s.ready_s:g} s for ready"
            self.pending = []
            return
        name, available, need, why = short[0]
        if now < self.step_deadline:
            self.next_step = f"waiting for memory on {', '.join(s[0] for s in short)} before the restart"
            return
        message = (
            wire.held_message(name, available, need)
            if available is not None
            else f"{name}: MemAvailable unknown ({why}), {wire.gb(need)} needed: check the node"
        )
        log(message)
        self.held = {"node": name, "available_bytes": available, "need_bytes": need, "message": message}
        self.step, self.pending, self.next_step = None, [], message
        self._set(wire.State.MEMORY_HELD, now)

    def _record_restart(self, now: float, reason: str, step: wire.Step) -> None:
        self.p.restarts.append({"at": now, "reason": reason, "step": step.value})
        self.p.restarts = [r for r in self.p.restarts if now - r["at"] < self.s.window_s][-RESTART_KEEP:]
        self.p.restarts_total[reason] = self.p.restarts_total.get(reason, 0) + 1
        self._persist()

    def _spend(self, now: float, reason: str, step: wire.Step) -> None:
        why = (
            f"{self.s.max_restarts} restarts in {self.s.window_s:g} s spent; the server needed another "
            f"({step.value.replace('_', ' ')}, {reason})"
        )
        log(f"budget spent: {why}; stopping the server and the cluster")
        stopped = []
        for target in reversed(self.s.cluster):
            self._do("stop", target)
            stopped.append({"node": target.node, "name": target.name})
        if self.s.server not in self.s.cluster:
            self._do("stop", self.s.server)
            stopped.append({"node": self.s.server.node, "name": self.s.server.name})
        self.p.spent, self.p.stopped = {"at": now, "why": why}, stopped
        self._persist()
        self.step, self.pending, self.next_step = None, [], self._spent_next_step()
        self._set(wire.State.BUDGET_SPENT, now)

    def _check_reset(self, now: float) -> None:
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
            self.grace_from, self.ever_ready, self.failures = now, False, 0
            self.next_step = "budget reset: waiting for the server to be ready"
            self._set(wire.State.STARTING, now)

    def _diagnose(self, now: float, reason: str) -> dict:
        """What an operator needs to see after the fact; every read bounded, every failure recorded."""
        found: dict[str, Any] = {"at": now, "reason": reason, "containers": {}, "mem_available_bytes": {}}
        for node in self.s.nodes:
            found["containers"][node.name] = self.world.containers(node.name)
            available, why = self.world.mem_available(node.name)
            self.mem[node.name] = available
            found["mem_available_bytes"][node.name] = available if why is None else why
        found["ray_nodes"] = self.world.ray_nodes() if self.s.executor == "ray" else None
        found["server_logs"] = self.world.logs(self.s.server, LOG_TAIL)
        unchecked = [n.name for n in self.s.nodes if n.need_bytes is None]
        if unchecked:
            found["memory_check"] = (
                f"no memory fit recorded for {', '.join(unchecked)}: MemAvailable is not checked there"
            )
        log(f"diagnosis: {json.dumps({k: v for k, v in found.items() if k != 'server_logs'})[:2000]}")
        return found

    # -- what it shows --

    def snapshot(self) -> dict:
        # Without the lock: a tick may be in a stop that takes minutes, and /state must answer then.
        for _ in range(5):
            try:
                return self._snapshot()
            except RuntimeError:  # a list or dict changed size while copied: read again
                continue
        return self._snapshot()

    def _snapshot(self) -> dict:
        now = self.clock()
        return {
            "state": self.state.value,
            "mode": self.s.mode,
            "step": self.step.value if self.step else None,
            "since": self.since,
            "last_ready": self.last_ready,
            "consecutive_failures": self.failures,
            "restarts": [r for r in self.p.restarts if now - r["at"] < self.s.window_s],
            "restarts_total": dict(self.p.restarts_total),
            "budget_left": self.budget_left(now),
            "spent": self.p.spent,
            "held": self.held,
            "budget_resets": list(self.p.budget_resets),
            "last_diagnosis": self.diagnosis,
            "would": self.would,
            "next_step": self.next_step,
            "mem_available_bytes": dict(self.mem),
            "last_probe": None
            if self.last_probe is None
            else {
                "ok": self.last_probe.ok,
                "kind": self.last_probe.kind,
                "latency_s": self.last_probe.latency_s,
            },
            "last_ttft_s": self.last_ttft,
            "agent_refusals": dict(getattr(self, "world_refusals", {}) or {}),
        }

    def _persist(self) -> None:
        self._save(self.p.as_dict())


def _number(value: float | int) -> str:
    # Bytes and timestamps in full (`:g` would keep 6 digits).
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def metrics_text(state: dict) -> str:
    """/state as Prometheus text (version 0.0.4)."""
    probe = state.get("last_probe") or {}
    by_node = sorted((state.get("mem_available_bytes") or {}).items())
    refusals = sorted((state.get("agent_refusals") or {}).items())
    totals = sorted((state.get("restarts_total") or {}).items()) or [("none", 0)]
    families = [
        ("probe_latency_seconds", "gauge", "The last probe's latency.", [("", probe.get("latency_s"))]),
        ("probe_ok", "gauge", "1 when the last probe passed.", [("", probe and int(bool(probe.get("ok"))))]),
        ("consecutive_failures", "gauge", "Failed probes in a row.", [("", state["consecutive_failures"])]),
        (
            "restarts_total",
            "counter",
            "Restarts by the watchdog, by reason.",
            [(f'{{reason="{reason}"}}', count) for reason, count in totals],
        ),
        ("budget_left", "gauge", "Restarts left in the window.", [("", state["budget_left"])]),
        (
            "mem_available_bytes",
            "gauge",
            "MemAvailable per node, last read.",
            [(f'{{node="{node}"}}', value) for node, value in by_node if isinstance(value, int)],
        ),
        (
            "last_ready_timestamp_seconds",
            "gauge",
            "When the server was last ready.",
            [("", state.get("last_ready"))],
        ),
        (
            "completion_ttft_seconds",
            "gauge",
            "The last one-token completion's time to its token.",
            [("", state.get("last_ttft_s"))],
        ),
        (
            "agent_refusals_total",
            "counter",
            "Requests an agent refused (absent or wrong signature).",
            [(f'{{node="{node}"}}', count) for node, count in refusals],
        ),
        (
            "state",
            "gauge",
            "1 for the watchdog's current state.",
            [(f'{{state="{s.value}"}}', int(state["state"] == s.value)) for s in wire.State],
        ),
    ]
    lines = []
    for name, kind, text, samples in families:
        lines += [f"# HELP qwen35_health_{name} {text}", f"# TYPE qwen35_health_{name} {kind}"]
        lines += [
            f"qwen35_health_{name}{labels} {_number(v)}" for labels, v in samples if v not in (None, {})
        ]
    return "\n".join(lines) + "\n"


# ---- the real World: HTTP to the server and the agents, the head's Docker through its socket ---------


def http_call(
    url: str,
    method: str = "GET",
    body: bytes | None = None,
    headers: dict | None = None,
    timeout: float = 5.0,
) -> tuple[int, bytes]:
    """One HTTP request with a deadline over the whole exchange: (status, body)."""
    import http.client
    import urllib.parse

    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=timeout)
    deadline = time.monotonic() + timeout
    try:
        conn.request(method, parts.path + (f"?{parts.query}" if parts.query else ""), body, headers or {})
        response = conn.getresponse()
        data = response.read()
        if time.monotonic() > deadline:
            raise TimeoutError(f"answered after {timeout:g} s")
        return response.status, data
    finally:
        conn.close()


def timed_probe(call: Callable[[], tuple[int, bytes]]) -> Probe:

    started = time.monotonic()
    try:
        status, _ = call()
    except TimeoutError as exc:
        return Probe(False, time.monotonic() - started, "timeout", str(exc) or "no answer")
    except ConnectionRefusedError as exc:
        return Probe(False, time.monotonic() - started, "refused", str(exc))
    except OSError as exc:
        return Probe(False, time.monotonic() - started, "error", f"{type(exc).__name__}: {exc}")
    except Exception as exc:  # a malformed answer (http.client's own errors)
        return Probe(False, time.monotonic() - started, "error", f"{type(exc).__name__}: {exc}")
    latency = time.monotonic() - started
    return Probe(status == 200, latency, "ok" if status == 200 else "status", f"HTTP {status}")


class Agent:
    """The watchdog's client of one node's agent: every request signed for that node, with a nonce."""

    def __init__(self, address: str, secret: str, node: str):
        self.address, self.secret, self.node = address, secret, node
        self.skew_s: float | None = None  # the agent's clock minus this one's, from its last answer

    def call(self, path: str, payload: dict, timeout: float = CALL_TIMEOUT_S) -> dict:
        body = json.dumps(payload).encode()
        headers = {"Content-Type": "application/json"}
        sent = time.time()
        headers.update(wire.signed_headers(self.secret, "POST", path, body, sent, node=self.node))
        status, data = http_call(f"http://{self.address}{path}", "POST", body, headers, timeout)
        answer = json.loads(data) if data else {}
        if isinstance(answer.get("clock"), int | float):
            # Half the round trip is the measure's error: seconds matter here, not milliseconds.
            self.skew_s = float(answer["clock"]) - (sent + time.time()) / 2
        if status != 200:
            raise OSError(f"agent {self.address} answered {status}: {answer.get('error')}")
        return answer


class RealWorld(World):
    def __init__(self, settings: Settings, secret: str, api_key: str | None, meminfo: str, socket_path: str):
        self.s, self.api_key, self.meminfo, self.socket = settings, api_key, meminfo, socket_path
        self.agents = {n.name: Agent(n.agent, secret, n.name) for n in settings.nodes if n.agent}
        self.refusals: dict[str, int] = {}

    def probe_health(self, deadline_s: float) -> Probe:
        return timed_probe(lambda: http_call(f"{self.s.vllm_url}/health", timeout=deadline_s))

    def probe_completion(self, deadline_s: float) -> Probe:
        body = json.dumps(
            {"model": self.s.model, "messages": [{"role": "user", "content": "ping"}], "max_tokens": 1}
        ).encode()
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        url = f"{self.s.vllm_url}/v1/chat/completions"
        return timed_probe(lambda: http_call(url, "POST", body, headers, deadline_s))

    def _agent(self, node: str, path: str, payload: dict, timeout: float = CALL_TIMEOUT_S) -> dict:
        answer = self.agents[node].call(path, payload, timeout)
        if "refusals" in answer:
            self.refusals[node] = int(answer["refusals"])
        return answer

    def mem_available(self, node: str) -> tuple[int | None, str | None]:
        if node not in self.agents:
            return wire.read_mem_available(self.meminfo)
        try:
            answer = self._agent(node, wire.AGENT_MEMINFO, {})
        except (OSError, ValueError) as exc:
            return None, f"its agent did not answer: {exc}"
        return answer.get("available_bytes"), answer.get("error")

    def containers(self, node: str) -> list[dict]:
        if node not in self.agents:
            return [wire.inspect(self.socket, name) for name in self.s.node(node).containers]
        try:
            return self._agent(node, wire.AGENT_CONTAINERS, {})["containers"]
        except (OSError, ValueError, KeyError) as exc:
            return [
                {"name": name, "state": "unknown", "error": str(exc)} for name in self.s.node(node).containers
            ]

    def _act(self, action: str, target: Target) -> dict:
        if target.node not in self.agents:
            return wire.act(
                self.socket,
                action,
                target.name,
                target.stop_timeout_s,
                CALL_TIMEOUT_S + target.stop_timeout_s,
            )
        path = wire.AGENT_STOP if action == "stop" else wire.AGENT_START
        try:
            return self._agent(
                target.node, path, {"name": target.name}, CALL_TIMEOUT_S + target.stop_timeout_s
            )
        except (OSError, ValueError) as exc:
            return {"ok": False, "error": str(exc)}

    def stop(self, target: Target) -> dict:
        return self._act("stop", target)

    def start(self, target: Target) -> dict:
        return self._act("start", target)

    def logs(self, target: Target, tail: int) -> list[str]:
        if target.node not in self.agents:
            return wire.logs(self.socket, target.name, tail)
        try:
            return self._agent(target.node, wire.AGENT_LOGS, {"name": target.name, "tail": tail})["lines"]
        except (OSError, ValueError, KeyError) as exc:
            return [f"(no logs: {exc})"]

    def ray_nodes(self) -> dict:
        """Ray's live nodes from its dashboard (best effort, bounded)."""
        if not self.s.ray_dashboard:
            return {"error": "no Ray dashboard address"}
        try:
            status, data = http_call(f"{self.s.ray_dashboard}/nodes?view=summary", timeout=5.0)
            nodes = json.loads(data).get("data", {}).get("summary", [])
            alive = [n for n in nodes if (n.get("raylet") or {}).get("state") == "ALIVE"]
            return {"alive": len(alive), "nodes": len(nodes), "status": status}
        except Exception as exc:  # best effort: any failure is recorded, never raised
            return {"error": f"{type(exc).__name__}: {exc}"}

    def server_started_at(self) -> float | None:
        found = wire.inspect(self.socket, self.s.server.name).get("started_at") or ""
        return parse_started_at(found)

    def boot_time(self) -> float | None:
        try:
            with open("/proc/stat") as handle:
                return next(float(line.split()[1]) for line in handle if line.startswith("btime "))
        except (OSError, StopIteration, ValueError, IndexError):
            return None

    def restart_count(self) -> int | None:
        names = {t.name for t in (self.s.server, *self.s.cluster) if t.node == self.s.head}
        counts = [wire.inspect(self.socket, name).get("restarts") for name in sorted(names)]
        return sum(counts) if counts and all(isinstance(c, int) for c in counts) else None

    def agent_refusals(self) -> dict[str, int]:
        return dict(self.refusals)


def parse_started_at(text: str) -> float | None:
    """Docker's `State.StartedAt` (RFC 3339, UTC, nanoseconds) as unix seconds; None for none."""
    import calendar

    if not text or text.startswith("0001-"):
        return None
    try:
        return float(calendar.timegm(time.strptime(text[:19], "%Y-%m-%dT%H:%M:%S")))
    except ValueError:
        return None


# ---- the process -------------------------------------------------------------------------------------


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


def serve_http(dog: Watchdog, host: str, port: int):
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, fmt: str, *args: Any) -> None:
            pass

        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            path = self.path.split("?", 1)[0]
            if path == wire.METRICS_PATH:
                data, kind = metrics_text(dog.snapshot()).encode(), "text/plain; version=0.0.4"
            elif path == wire.STATE_PATH:
                data, kind = json.dumps(dog.snapshot()).encode(), "application/json"
            else:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def main(argv: list[str]) -> int:
    try:
        raw = os.environ[wire.CONFIG_ENV]
        if json.loads(raw).get("mode") == wire.Mode.OFF.value:
            log("health.mode is off: nothing to watch")
            return wire.Exit.MODE_OFF
        settings = Settings.from_json(raw)
    except (KeyError, ValueError, TypeError, AttributeError) as exc:
        log(f"{wire.CONFIG_ENV} missing or not the watchdog's config ({type(exc).__name__}: {exc})")
        return wire.Exit.BAD_CONFIG
    secret = wire.read_secret()
    if not secret and any(n.agent for n in settings.nodes):
        log(f"no secret in {wire.SECRET_FILE} (nor {wire.SECRET_ENV}): the agents would refuse every request")
        return wire.Exit.NO_SECRET
    state_path = os.path.join(os.environ.get("QWEN35_HEALTH_STATE_DIR", wire.STATE_DIR), wire.STATE_FILE)
    world = RealWorld(
        settings,
        secret,
        os.environ.get(wire.API_KEY_ENV) or None,
        os.environ.get(wire.MEMINFO_ENV, wire.DEFAULT_MEMINFO),
        wire.DOCKER_SOCKET_MOUNT,
    )
    dog = Watchdog(settings, world, time.time, load_saved(state_path), saver(state_path))
    try:
        serve_http(dog, settings.metrics_host, settings.port)
    except OSError as exc:
        log(f"cannot listen on {settings.metrics_host}:{settings.port}: {exc}")
        return wire.Exit.CANNOT_LISTEN
    where = f"{settings.metrics_host}:{settings.port}"
    log(f"watching {settings.vllm_url} ({settings.mode}); /metrics and /state on {where}")
    while True:
        started = time.monotonic()
        try:
            dog.tick()
        except Exception as exc:  # a tick that fails is logged and the next one runs: never exit
            log(f"tick failed: {type(exc).__name__}: {exc}")
        if "--once" in argv:
            return wire.Exit.OK
        time.sleep(max(settings.interval_s - (time.monotonic() - started), 0.1))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
