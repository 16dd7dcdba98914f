"""The watchdog, on the head (issue 33): probe the server, and recover a hung or crashed one in steps,
memory-checked and within a restart budget; serve /metrics (Prometheus text) and /state (JSON).

    python3 -I -S -c <program> [--once]      (config: QWEN35_HEALTH_CONFIG, secret: /run/qwen35-health/secret)

Every `interval_s` one tick: a /health probe (liveness) within its deadline; once the server serves,
also vLLM's /metrics (requests running or waiting while no prompt or generated token is counted for
`stall_s` is a hang) and a one-token chat completion: on every probe while /metrics says the engine is
idle (within `idle_completion_deadline_s`: an idle engine answers one token at once, so a hang behind
a passing /health is found in under a minute at the defaults), else every `completion_every`-th probe
(within `completion_deadline_s`), and every probe after a failed one: failed
completions are counted on their own, a passing /health does not clear them (vLLM's /health answers
while its engine hangs). A slow answer within the deadline is not a failure. No verdict before the
server was first ready or `startup_s` has passed since the server's container started in this boot;
a new serving container (another ID, or started again by someone else, e.g. `pulumi up`) gets a new
grace, and while one is missing or not yet started the watchdog neither judges nor acts. Docker's
own restarts (a crash under `unless-stopped`, with no memory check) spend the budget as the
watchdog's do; under mp one of any rank means the world is restarted. After `failures` failures in a
row:

  1. diagnose: every node's containers (state, exit code), Ray's live nodes under executor ray (best
     effort, bounded), every node's MemAvailable, the server's last log lines;
  2. restart the server (under mp: the world, every step): stop it; wait (`memory_wait_s`) until
     MemAvailable on the nodes reaches their need; start it; wait `ready_s` for ready;
  3. not ready: restart the cluster the same way, node by node (ray: server, Ray workers, Ray head
     stopped; Ray head, workers, server started; mp: every rank, the headless ones before the head).

A node whose memory does not come back blocks the restart (`memory_held`) and the watchdog stops
acting. The memory guard (issue 41 item 6; `health_wire.MemoryGuard`): MemAvailable on a node below
`memory_floor_bytes` for `memory_floor_s` stops that node's serving containers once (the head's by this
program, read every second in a thread; the others' by their agents); the watchdog answers each trip
with a cluster restart, reason `memory_floor`, within the budget. A diagnosis names a memory or GPU
fault: Docker's OOMKilled, the kernel's OOM kills and NVRM Xids where the kernel's log can be read.
Every restart spends one of `max_restarts` per `window_s`; a recovery that finds the budget
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
from dataclasses import replace
from typing import Any

from components.node_programs import cold_start, gpu_memory, health_wire
from components.node_programs.watchdog_report import serve_http
from components.node_programs.watchdog_settings import Settings, Target
from components.node_programs.watchdog_state import RESTART_KEEP, Persisted, load_saved, log, saver
from components.node_programs.watchdog_world import CALL_TIMEOUT_S, Probe, RealWorld, World

LOG_TAIL = 20  # server log lines kept in a diagnosis
RULE_RETRY_S = 15.0  # a node vLLM's start-up rule refused is probed again after this, within the wait


# ---- what the watchdog decides (Watchdog) ------------------------------------------------------------


# A failed probe's kind as a restart's reason (`restarts_total{reason}`); `stall`, `not_ready`,
# `docker_restart` and `memory_floor` (a node's memory guard stopped its serving containers) are the others.
REASONS = {"timeout": "hang", "refused": "down", "status": "error", "error": "error"}
# Docker states of a container that `pulumi up` (or an operator) is replacing: no verdict meanwhile.
REPLACING = ("missing", "created", "removing")
# vLLM's own figures (its /metrics): requests in the engine (running, waiting), and the tokens it has
# computed so far, prompt and generated (a long prefill is progress too). Running and generated are
# required; the others count as 0 where a server does not export them.
RUNNING_METRIC = "vllm:num_requests_running"
WAITING_METRIC = "vllm:num_requests_waiting"
TOKENS_METRIC = "vllm:generation_tokens_total"
PROMPT_METRIC = "vllm:prompt_tokens_total"


def engine_progress(text: str) -> tuple[float, float, float] | None:
    """(requests running, requests waiting, tokens computed: prompt and generated) from Prometheus
    text, each summed over its series (one per engine and model); None when requests running or tokens
    generated are absent."""
    sums: dict[str, float] = {}
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name not in (RUNNING_METRIC, WAITING_METRIC, TOKENS_METRIC, PROMPT_METRIC):
            continue
        rest = line.rsplit("}", 1)[1] if "{" in line else line[len(name) :]
        try:
            sums[name] = sums.get(name, 0.0) + float(rest.split()[0])
        except (ValueError, IndexError):
            continue
    if RUNNING_METRIC not in sums or TOKENS_METRIC not in sums:
        return None
    return (
        sums[RUNNING_METRIC],
        sums.get(WAITING_METRIC, 0.0),
        sums[TOKENS_METRIC] + sums.get(PROMPT_METRIC, 0.0),
    )


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
        # Each serving container's last facts ({state, id, started_at, restarts}), by (node, name):
        # what tells a new container (a fresh grace) and Docker's own restarts apart.
        self.seen: dict[tuple[str, str], dict] = {}
        self.ever_ready = False
        self.state = health_wire.State.BUDGET_SPENT if self.p.spent else health_wire.State.STARTING
        self.since = now
        self.step: health_wire.Step | None = None
        self.after: health_wire.Step | None = None  # the restart a memory wait leads to
        self.step_deadline = 0.0
        self.pending: list[Target] = []  # what a memory wait starts, in order
        self.memory_nodes: list[str] = []
        self.rules: dict[str, dict] = {}  # vLLM's start-up rule per node, as last probed
        self.rule_passed: set[str] = set()  # nodes this memory wait's probe passed (or could not judge)
        self.rule_next: dict[str, float] = {}  # when a refused node is probed again, in this wait
        self.reason = ""
        self.failures = 0  # failed /health probes in a row
        self.completion_failures = 0  # failed completions in a row: a passing /health does not clear them
        self.probes = 0
        self.progress: dict | None = None  # the engine's last /metrics figures
        self.stall_since: float | None = None  # since when requests ran without a token generated
        self.last_ready: float | None = None
        self.last_probe: Probe | None = None
        self.last_ttft: float | None = None
        self.mem: dict[str, int | None] = {}
        self.skew: dict[str, float] = {}
        self.held: dict | None = None
        self.diagnosis: dict | None = None
        self.would: dict | None = None
        self.guard = health_wire.MemoryGuard(
            settings.head,
            settings.memory_floor_bytes,
            settings.memory_floor_s,
            settings.mode == health_wire.Mode.ENFORCE.value,
            lambda: world.mem_available(settings.head),
            self._head_running,
            self._guard_stop,
        )
        self.guard_seen: dict[str, int] = {settings.head: 0}  # each node's guard trips already answered
        self.guard_trips: dict[str, int] = {}  # trips seen since this watchdog started, by node
        self.memory_guard: dict[str, dict] = {}  # each node's last trip (/state `memory_guard`)
        self.tripped: dict | None = None  # the trip a recovery answers (its diagnosis names it)
        # The server's last start as vLLM's log tells it (`cold_start.cold_start`), once it is ready.
        self.cold_start: dict | None = None
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

    def _set(self, state: health_wire.State, now: float) -> None:
        if state is not self.state:
            log(f"state {self.state.value} -> {state.value}")
            self.state, self.since = state, now

    def _tick(self, now: float) -> None:
        self.world_refusals = self.world.agent_refusals()
        self._read_skew()
        self.guard.check(now)
        if self._observe(now):
            return
        if self._guard_trips(now):
            return
        if self.state is health_wire.State.BUDGET_SPENT:
            self._check_reset(now)
            return
        if self.step is health_wire.Step.MEMORY_WAIT:
            self._memory_wait(now)
            return
        probe = self._probe()
        # Whatever follows is decided now, after the probe's wait (up to its deadline), not at the
        # tick's start: a recorded time is the decision's.
        now = self.clock()
        if probe.ok:
            self._answered(now, probe)
            return
        if self.state is health_wire.State.MEMORY_HELD:
            return  # stopped acting: an operator frees the memory (reboots the node)
        if self.step in (health_wire.Step.RESTART_SERVER, health_wire.Step.RESTART_CLUSTER):
            if now >= self.step_deadline:
                log(f"not ready {self.s.ready_s:g} s after {self.step.value}: restarting the cluster")
                self._recover(now, "not_ready", health_wire.Step.RESTART_CLUSTER)
            return
        if not self.ever_ready and now - self.grace_from < self.s.startup_s:
            self._set(health_wire.State.STARTING, now)
            return
        self.failures += 1
        self._failed(now, self.failures, REASONS.get(probe.kind, "error"), "probes")

    def _failed(self, now: float, count: int, reason: str, what: str) -> None:
        """`count` failed `what` in a row: a recovery at `failures` (report mode: one per run)."""
        self._set(health_wire.State.FAILING, now)
        if count < self.s.failures:
            self.next_step = f"{count} of {self.s.failures} failed {what} in a row before a recovery"
        elif count == self.s.failures or self.s.mode != health_wire.Mode.REPORT.value:
            self._recover(now, reason, health_wire.Step.RESTART_SERVER)

    def _probe(self) -> Probe:
        self.probes += 1
        probe = self.world.probe_health(self.s.deadline_s)
        self.last_probe = probe
        if not probe.ok:
            log(f"probe failed ({probe.kind}: {probe.detail})")
        return probe

    def _healthy(self, now: float) -> None:
        self.last_ready, self.next_step = now, "nothing to do"
        self._set(health_wire.State.HEALTHY, now)
        self._measure_start()

    def _measure_start(self) -> None:
        """Once per start of the server (its container's `started_at`), when it first answers: the
        start's milestones from vLLM's log (weights loaded, engine and API ready). The first
        completion is the readiness gate's to time: the watchdog's completions run on their own
        schedule, so it records none."""
        server = self.seen.get((self.s.server.node, self.s.server.name)) or {}
        text = str(server.get("started_at") or "")
        started = cold_start.parse_stamp(text)
        if started is None or (self.cold_start or {}).get("started_at") == round(started, 3):
            return
        try:
            # A start's milestones fall within the wait any start is given: the log after it is not read.
            window = max(self.s.startup_s, self.s.ready_s) + CALL_TIMEOUT_S
            lines = self.world.start_lines(self.s.server, started, started + window)
        except OSError as exc:
            self.cold_start = {"started_at": round(started, 3), "error": str(exc)}
            return
        self.cold_start = cold_start.cold_start(text, lines)
        log(f"server start {text}: {cold_start.summary(self.cold_start)}")

    def _answered(self, now: float, probe: Probe) -> None:
        """/health answered: the server is ready (the first time, or after a restart); while it serves,
        /health proves the API server alive only, and the engine's progress and completions decide."""
        self.failures = 0
        if not self.ever_ready or self.step is not None or self.state is health_wire.State.MEMORY_HELD:
            log(f"the server is ready ({probe.latency_s:.2f} s)")
            self.step, self.held, self.ever_ready = None, None, True
            self.completion_failures, self.stall_since, self.progress = 0, None, None
            self._healthy(now)
            return
        before = self._progress(now)
        if self.stall_since is not None and now - self.stall_since >= self.s.stall_s:
            log(
                f"no token computed for {now - self.stall_since:.0f} s with "
                f"{self.progress and self.progress['running']:g} request(s) running and "
                f"{self.progress and self.progress['waiting']:g} waiting: the engine is hung"
            )
            self.stall_since = None  # report mode: the next verdict after another stall_s
            self._recover(now, "stall", health_wire.Step.RESTART_SERVER)
            return
        idle = before is not None and before[0] + before[1] <= 0
        if not idle and not self.completion_failures and self.probes % self.s.completion_every:
            self._healthy(now)
            return
        self._completion(now, before, self.s.idle_deadline_s() if idle else self.s.completion_deadline_s)

    def _completion(self, now: float, before: tuple[float, float, float] | None, deadline_s: float) -> None:
        """One chat completion: due on every probe while the engine is idle (its short deadline: an idle
        engine answers one token at once), else every `completion_every` probes, and on every probe
        after one failed. One that timed out while the engine computed tokens (prompt or generated) is
        an overloaded engine, not a hung one."""
        probe = self.world.probe_completion(deadline_s)
        self.last_probe = probe
        now = self.clock()  # after the completion's wait (up to its deadline): the decision's time
        if probe.ok:
            self.completion_failures, self.last_ttft = 0, probe.latency_s
            self._healthy(now)
            return
        if probe.kind == "timeout" and before is not None:
            after = self._progress(now)
            if after is not None and after[2] > before[2]:
                self.next_step = "a completion timed out while the engine computed tokens: busy, not hung"
                log(self.next_step)
                return
        self.completion_failures += 1
        log(f"completion failed ({probe.kind}: {probe.detail}) while /health answers")
        self._failed(now, self.completion_failures, REASONS.get(probe.kind, "error"), "completions")

    def _progress(self, now: float) -> tuple[float, float, float] | None:
        """vLLM's /metrics: (requests running, waiting, tokens computed), and since when requests have
        been in the engine without a token computed (`stall_since`); None when /metrics does not say."""
        text = self.world.probe_metrics(self.s.deadline_s)
        found = engine_progress(text) if text else None
        last, self.progress = self.progress, None
        if found is None:
            self.stall_since = None
            return None
        running, waiting, tokens = found
        if running + waiting <= 0:
            self.stall_since = None
        elif self.stall_since is None or last is None or tokens != last["tokens"]:
            self.stall_since = now
        stalled = 0.0 if self.stall_since is None else now - self.stall_since
        self.progress = {"running": running, "waiting": waiting, "tokens": tokens, "stalled_s": stalled}
        return found

    # -- the serving containers: new ones, ones being replaced, Docker's own restarts --

    def _read_serving(self) -> dict[tuple[str, str], dict]:
        """Each serving container's facts by (node, name); state `unknown` where its node did not say."""
        targets = self.s.serving()
        found: dict[tuple[str, str], dict] = {}
        for node in dict.fromkeys(t.node for t in targets):
            by_name = {c.get("name"): c for c in self.world.containers(node)}
            for t in (t for t in targets if t.node == node):
                found[(node, t.name)] = by_name.get(t.name) or {"name": t.name, "state": "unknown"}
        return found

    def _observe(self, now: float) -> bool:
        """Read the serving containers. True when this tick ends here: they are being replaced (no
        verdict, no action), or Docker restarted one and the watchdog acted on it."""
        found = self._read_serving()
        before = self.seen
        known = {key: facts for key, facts in found.items() if facts.get("state") != "unknown"}
        self.seen = {**before, **known}
        if not before:
            self._first_grace(found)
        if self.state is health_wire.State.BUDGET_SPENT:
            return False
        replacing = sorted(f"{n} {c['state']}" for (_, n), c in known.items() if c["state"] in REPLACING)
        if replacing:
            self._fresh_grace(now, f"{', '.join(replacing)}: the serving containers are being replaced")
            return True
        new, restarted = self._changes(before, known)
        if new:
            self._fresh_grace(now, f"new serving container(s) {', '.join(sorted(new))}")
            return False
        return self._docker_restarts(now, restarted)

    def _first_grace(self, found: dict[tuple[str, str], dict]) -> None:
        """The grace runs from the server container's start: a watchdog replaced (an upgrade) while
        the server has run for an hour gives it no new hour; after a boot both started together. After
        a reboot the server's container may not have been started again yet: its StartedAt is then the
        last boot's, and counts for nothing."""
        server = found.get((self.s.server.node, self.s.server.name)) or {}
        started, boot = parse_started_at(str(server.get("started_at") or "")), self.world.boot_time()
        if started is not None and (boot is None or started >= boot) and started < self.grace_from:
            self.grace_from = started

    def _changes(self, before: dict, known: dict) -> tuple[list[str], dict[tuple[str, str], int]]:
        """The serving containers new since the last read (another ID; or started again, not by the
        watchdog nor by Docker's restart policy), and how often Docker's policy restarted the others."""
        new, restarted = [], {}
        for key, facts in known.items():
            was = before.get(key)
            if was is None:
                continue
            if facts.get("id") != was.get("id"):
                new.append(key[1])
                continue
            count, earlier = facts.get("restarts"), was.get("restarts")
            if isinstance(count, int) and isinstance(earlier, int) and count > earlier:
                restarted[key] = count - earlier
            elif facts.get("started_at") != was.get("started_at") and self.step is None:
                new.append(key[1])  # started by someone else than the watchdog (`up`, an operator)
        return new, restarted

    def _fresh_grace(self, now: float, why: str) -> None:
        """A new server (or rank set), whatever made it: no verdict before it is ready or startup_s has
        passed, and no step of an earlier recovery goes on."""
        said = f"wait: {why}; no verdict before it is ready or {self.s.startup_s:g} s have passed"
        if said != self.next_step:
            log(said)
        self.grace_from, self.ever_ready, self.failures, self.completion_failures = now, False, 0, 0
        self.stall_since, self.progress, self.step, self.pending, self.held = None, None, None, [], None
        self.next_step = said
        self._set(health_wire.State.STARTING, now)

    def _docker_restarts(self, now: float, restarted: dict[tuple[str, str], int]) -> bool:
        """Docker's own restart policy (`unless-stopped`) restarted a serving container at once, with no
        memory check. Under mp the watchdog restarts the world (a rank cannot rejoin the others): one
        restart of the budget. Under Ray each restart of the head's containers spends one, as the
        watchdog's own restarts do (the one that finds the budget spent stops the cluster), and the
        server gets `ready_s` to be ready. True when the tick ends here."""
        if self.s.executor != "mp":
            restarted = {key: n for key, n in restarted.items() if key[0] == self.s.head}
        if not restarted:
            return False
        names = ", ".join(f"{name} on {node}" for node, name in sorted(restarted))
        log(f"Docker restarted {names} {sum(restarted.values())} time(s) on its own")
        if self.s.executor == "mp" and self.step in (health_wire.Step.DIAGNOSE, health_wire.Step.MEMORY_WAIT):
            # The watchdog has stopped the world and not yet started it again (its stop broke the world:
            # a rank that lost its peers crashed and Docker's policy restarted it): part of that
            # recovery, which starts every rank again; its diagnosis and its one restart of the budget
            # stand. Once it started the world, a restart is a crash again, counted as one.
            log(f"part of the world restart under way ({self.reason}): not a recovery of its own")
            return False
        report = self.s.mode == health_wire.Mode.REPORT.value
        if self.s.executor == "mp" and not report:
            self._recover(now, "docker_restart", health_wire.Step.RESTART_CLUSTER)
            return True
        for _ in range(sum(restarted.values())):
            if not report and self.budget_left(now) <= 0:
                self.reason = "docker_restart"
                self.diagnosis = self._diagnose(now, "docker_restart")
                self._spend(now, "docker_restart", health_wire.Step.RESTART_SERVER)
                return True
            self._record_restart(now, "docker_restart", health_wire.Step.RESTART_SERVER)
        if report:
            if self.s.executor == "mp":
                self._recover(now, "docker_restart", health_wire.Step.RESTART_CLUSTER)
            return False
        self.reason, self.step = "docker_restart", health_wire.Step.RESTART_SERVER
        self.step_deadline, self.completion_failures = now + self.s.ready_s, 0
        self.next_step = f"Docker restarted {names}: waiting up to {self.s.ready_s:g} s for ready"
        self._set(health_wire.State.RECOVERING, now)
        return False

    # -- the memory guard: the head's own, and each agent's (read with its containers) --

    def _head_running(self) -> list[str]:
        """The head's serving containers that run, in stop order (the reverse of the start order)."""
        running = {c.get("name") for c in self.world.containers(self.s.head) if c.get("state") == "running"}
        return [t.name for t in reversed(self.s.serving()) if t.node == self.s.head and t.name in running]

    def _guard_stop(self, name: str) -> dict:
        target = next(t for t in self.s.serving() if t.node == self.s.head and t.name == name)
        # The guard's own short bound, not the container's grace: SIGKILL after guard_stop_s.
        bounded = replace(target, stop_timeout_s=self.s.guard_stop_s)
        done = self.world.stop(bounded)
        found = next((c for c in self.world.containers(target.node) if c.get("name") == name), {})
        done = health_wire.guard_stopped(done, found, self.s.guard_stop_s)
        log(f"memory guard: stop {name} on {target.node}: {health_wire.guard_stop_said(done)}")
        return done

    def _guard_trips(self, now: float) -> bool:
        """A node's guard stopped its serving containers (or would have, under report): the world is
        broken (a Ray node or a rank gone), so the answer is a cluster restart, memory-checked, one of
        the budget (reason `memory_floor`); a spent budget stops everything. True when the tick ends."""
        tripped = []
        for node, report in {self.s.head: self.guard.report(), **self.world.memory_guards()}.items():
            if isinstance(report.get("available_bytes"), int):
                self.mem[node] = report["available_bytes"]
            trips, seen = report.get("trips"), self.guard_seen.get(node)
            if not isinstance(trips, int):
                continue
            self.guard_seen[node] = (
                trips  # first sight of an agent: trips before this watchdog are shown only
            )
            if report.get("last"):
                self.memory_guard[node] = report["last"]
            if seen is not None and trips > seen and report.get("last"):
                self.guard_trips[node] = self.guard_trips.get(node, 0) + trips - seen
                tripped.append(report["last"])
        for event in tripped:
            log(f"memory guard: {event.get('message')}")
        busy = (
            self.state in (health_wire.State.BUDGET_SPENT, health_wire.State.MEMORY_HELD)
            or self.step is health_wire.Step.MEMORY_WAIT
        )
        if not tripped or busy:
            return False
        self.tripped = tripped[0]
        self._recover(now, "memory_floor", health_wire.Step.RESTART_CLUSTER)
        self.tripped = None
        return True

    def _read_skew(self) -> None:
        """Each agent's clock against the head's: beyond the signature window every request is refused."""
        skew = self.world.agent_clock_skew()
        window = health_wire.SIGNATURE_WINDOW_S
        for node, value in skew.items():
            if abs(value) > window and abs(self.skew.get(node, 0.0)) <= window:
                log(health_wire.skew_message(node, value))
        self.skew = skew

    # -- recovery --

    def _targets(self, step: health_wire.Step) -> list[Target]:
        """What `step` starts, in order (stopped in the reverse order); under mp always the world."""
        if step is health_wire.Step.RESTART_SERVER and self.s.executor != "mp":
            return [self.s.server]
        return list(self.s.cluster)

    def _recover(self, now: float, reason: str, step: health_wire.Step) -> None:
        if self.s.executor == "mp":
            step = health_wire.Step.RESTART_CLUSTER  # the ranks of one world live and die together
        self.reason = reason
        self.step = health_wire.Step.DIAGNOSE
        self._set(health_wire.State.RECOVERING, now)
        self.diagnosis = self._diagnose(now, reason)
        if self.s.mode == health_wire.Mode.REPORT.value:
            self.step = None
            self.would = {"at": now, "step": step.value, "reason": reason}
            self.next_step = f"report mode: would {step.value.replace('_', ' ')} ({reason}); acting is off"
            self._set(health_wire.State.FAILING, now)
            return
        if self.budget_left(now) <= 0:
            self._spend(now, reason, step)
            return
        targets = self._targets(step)
        for target in reversed(targets):
            self._do("stop", target)
        self.pending, self.after = targets, step
        self.memory_nodes = [n.name for n in self.s.nodes]  # what the stop frees
        self.rule_passed, self.rule_next = set(), {}
        self.step, self.step_deadline = health_wire.Step.MEMORY_WAIT, now + self.s.memory_wait_s
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
        refused = [] if short else self._startup_rule(now)
        if not short and not refused:
            for target in self.pending:
                self._do("start", target)
            self.completion_failures, self.stall_since, self.progress = 0, None, None
            self._record_restart(now, self.reason, self.after)
            self.step, self.step_deadline = self.after, now + self.s.ready_s
            self.next_step = f"{self.after.value}: waiting up to {self.s.ready_s:g} s for ready"
            self.pending = []
            return
        if now < self.step_deadline:
            names = ", ".join(item[0] for item in short or refused)
            rule = "" if short else " (vLLM's start-up rule)"
            self.next_step = f"waiting for memory on {names} before the restart{rule}"
            return
        if short:
            name, available, need, why = short[0]
            message = (
                health_wire.held_message(name, available, need)
                if available is not None
                else f"{name}: MemAvailable unknown ({why}), {health_wire.gb(need)} needed: check the node"
            )
            held = {"node": name, "available_bytes": available, "need_bytes": need, "message": message}
        else:
            name, rule = refused[0]
            message = gpu_memory.rule_message(name, rule)
            held = {
                "node": name,
                "available_bytes": rule.get("mem_available_bytes"),
                "need_bytes": None,
                "rule": rule,
                "message": message,
            }
        log(message)
        self.held = held
        self.step, self.pending, self.next_step = None, [], message
        self._set(health_wire.State.MEMORY_HELD, now)

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
        for name in self.memory_nodes:
            if name in self.rule_passed:
                continue
            if now < self.rule_next.get(name, 0.0):
                refused.append((name, self.rules[name]))
            else:
                due.append(name)
        for name, done in self._probe_all(due).items():
            if done.get("error"):
                # The probe's own output goes to this log only; /state keeps the bounded reason.
                if done.get("output"):
                    log(f"{name}: the memory probe's last lines: {done['output']}")
                rule = {"checked": False, "why": str(done["error"])[:200]}
            else:
                try:
                    rule = gpu_memory.startup_rule(done.get("report"), float(util), self.mem.get(name))
                except Exception as exc:  # a report of an unforeseen shape: not judged, never held
                    rule = {"checked": False, "why": f"the probe's report could not be read: {exc!r}"[:300]}
            rule.update(at=now, took_s=done.get("took_s"))
            self.rules[name] = rule
            if rule.get("checked") and not rule.get("ok"):
                log(gpu_memory.rule_message(name, rule))
                self.rule_next[name] = now + RULE_RETRY_S
                refused.append((name, rule))
                continue
            if rule.get("checked"):
                log(
                    f"{name}: vLLM's start-up rule passes: {health_wire.gb1(rule['free_bytes'])} free "
                    f"({rule['free_from']}), {health_wire.gb1(rule['requested_bytes'])} requested"
                )
            else:
                log(f"{name}: vLLM's start-up rule not checked: {rule['why']}")
            self.rule_passed.add(name)
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

    def _record_restart(self, now: float, reason: str, step: health_wire.Step) -> None:
        self.p.restarts.append({"at": now, "reason": reason, "step": step.value})
        self.p.restarts = [r for r in self.p.restarts if now - r["at"] < self.s.window_s][-RESTART_KEEP:]
        self.p.restarts_total[reason] = self.p.restarts_total.get(reason, 0) + 1
        self._persist()

    def _spend(self, now: float, reason: str, step: health_wire.Step) -> None:
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
        self._set(health_wire.State.BUDGET_SPENT, now)

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
            self._set(health_wire.State.STARTING, now)

    def _episode_from(self, now: float) -> float:
        """Since when a fault belongs to this failure: the last time the server answered (less one
        interval of slack for the clocks), within the budget's window. A fault the server answered
        after did not cause this."""
        since = now - self.s.window_s
        if self.last_ready is not None:
            since = max(since, self.last_ready - self.s.interval_s)
        return since

    def _diagnose(self, now: float, reason: str) -> dict:
        """What an operator needs to see after the fact; every read bounded, every failure recorded."""
        found: dict[str, Any] = {"at": now, "reason": reason, "containers": {}, "mem_available_bytes": {}}
        for node in self.s.nodes:
            found["containers"][node.name] = self.world.containers(node.name)
            available, why = self.world.mem_available(node.name)
            self.mem[node.name] = available
            found["mem_available_bytes"][node.name] = available if why is None else why
        found["ray_nodes"] = self.world.ray_nodes() if self.s.executor == "ray" else None
        found["progress"] = self.progress
        # The server's last lines go to this program's log only: /state answers anyone who can reach it.
        for line in self.world.logs(self.s.server, LOG_TAIL):
            log(f"{self.s.server.name}: {line}")
        found["server_logs"] = (
            f"not in /state: the watchdog's own log on {self.s.head}, "
            f"or `docker logs {self.s.server.name}` on {self.s.server.node}"
        )
        found["kernel"] = {
            n.name: self.world.kernel_faults(n.name, self._episode_from(now)) for n in self.s.nodes
        }
        if self.tripped:
            found["memory_guard"] = self.tripped
        found["fault"] = health_wire.fault_summary(found)
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
            "consecutive_completion_failures": self.completion_failures,
            "progress": None if self.progress is None else dict(self.progress),
            "hang_bound_s": self.s.hang_bound_s(),
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
            "memory_rule": {node: dict(rule) for node, rule in self.rules.items()},
            "last_probe": None
            if self.last_probe is None
            else {
                "ok": self.last_probe.ok,
                "kind": self.last_probe.kind,
                "latency_s": self.last_probe.latency_s,
            },
            "last_ttft_s": self.last_ttft,
            "cold_start": None if self.cold_start is None else dict(self.cold_start),
            "agent_refusals": dict(getattr(self, "world_refusals", {}) or {}),
            "agent_clock_skew_s": dict(self.skew),
            "memory_guard": dict(self.memory_guard),
            "memory_guard_trips": dict(self.guard_trips),
            "clock_skew": [
                health_wire.skew_message(node, value)
                for node, value in sorted(self.skew.items())
                if abs(value) > health_wire.SIGNATURE_WINDOW_S
            ],
        }

    def _persist(self) -> None:
        self._save(self.p.as_dict())


def parse_started_at(text: str) -> float | None:
    """Docker's `State.StartedAt` (RFC 3339, UTC, nanoseconds) as unix seconds; None for none."""
    return cold_start.parse_stamp(text or "")


# ---- the process -------------------------------------------------------------------------------------


def main(argv: list[str]) -> int:
    try:
        raw = os.environ[health_wire.CONFIG_ENV]
        if json.loads(raw).get("mode") == health_wire.Mode.OFF.value:
            log("health.mode is off: nothing to watch")
            return health_wire.Exit.MODE_OFF
        settings = Settings.from_json(raw)
    except (KeyError, ValueError, TypeError, AttributeError) as exc:
        log(f"{health_wire.CONFIG_ENV} missing or not the watchdog's config ({type(exc).__name__}: {exc})")
        return health_wire.Exit.BAD_CONFIG
    secret = health_wire.read_secret()
    if not secret and any(n.agent for n in settings.nodes):
        log(
            f"no secret in {health_wire.SECRET_FILE} (nor {health_wire.SECRET_ENV}): "
            "the agents would refuse every request"
        )
        return health_wire.Exit.NO_SECRET
    state_dir = os.environ.get("QWEN35_HEALTH_STATE_DIR", health_wire.STATE_DIR)
    state_path = os.path.join(state_dir, health_wire.STATE_FILE)
    world = RealWorld(
        settings,
        secret,
        os.environ.get(health_wire.API_KEY_ENV) or None,
        os.environ.get(health_wire.MEMINFO_ENV, health_wire.DEFAULT_MEMINFO),
        health_wire.DOCKER_SOCKET_MOUNT,
    )
    dog = Watchdog(settings, world, time.time, load_saved(state_path), saver(state_path))
    try:
        serve_http(dog.snapshot, settings.metrics_host, settings.port)
    except OSError as exc:
        log(f"cannot listen on {settings.metrics_host}:{settings.port}: {exc}")
        return health_wire.Exit.CANNOT_LISTEN
    where = f"{settings.metrics_host}:{settings.port}"
    log(f"watching {settings.vllm_url} ({settings.mode}); /metrics and /state on {where}")
    health_wire.guard_thread(dog.guard, log)
    while True:
        started = time.monotonic()
        try:
            dog.tick()
        except Exception as exc:  # a tick that fails is logged and the next one runs: never exit
            log(f"tick failed: {type(exc).__name__}: {exc}")
        if "--once" in argv:
            return health_wire.Exit.OK
        time.sleep(max(settings.interval_s - (time.monotonic() - started), 0.1))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
