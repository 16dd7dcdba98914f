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
watchdog's do; under mp one of any rank means the world is restarted. They are read from Docker's
event log (each `start` its restart policy makes after a `die`), which every tick reads for the
serving containers, telling the watchdog's own stops and starts from others' by when it made them;
RestartCount, which Docker resets on every start through its API, only where the events cannot be
read. A serving container someone else is stopping (a `kill` event the watchdog did not send, other
than SIGKILL: `pulumi up`'s delete, an operator) makes it stand back, neither judging nor acting,
until that container is removed or started again (then a fresh grace), at most its stop timeout plus
a minute. Docker's `oom` events go into the next diagnosis. After `failures` failures in a row:

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
fault: Docker's OOMKilled and `oom` events, the kernel's OOM kills and NVRM Xids where the kernel's log
can be read.
Every restart spends one of `max_restarts` per `window_s`; a recovery that finds the budget
spent stops the server and the cluster's containers (their memory is freed), records why and waits
for an operator: `budget_spent` is kept in the state volume, so neither a reboot nor a replaced
watchdog container restarts such a cluster. It resets when the watchdog sees every container it
stopped running again (the operator started them). In `report` mode it records what it would do and
never acts. The head's Docker is the mounted socket; other nodes' only through their agents.

Here: the process and the loop. The parts are libraries beside it, packed with it (docs/health.md):
`watchdog_settings` (the config and its bounds), `watchdog_world` (the only I/O: observe and act),
`watchdog_checks` (what a tick checks), `watchdog_policy` (the decisions, pure), `watchdog_recovery`
and `watchdog_memory` (the acts: a recovery, the memory check before a restart), `watchdog_state`
and `watchdog_report` (what it knows and keeps; /state and /metrics).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Callable

from components.node_programs import health_wire
from components.node_programs.watchdog_checks import EventWatch, GuardWatch, ServerChecks, ServingWatch
from components.node_programs.watchdog_policy import SPENT_NEXT_STEP
from components.node_programs.watchdog_recovery import Recovery
from components.node_programs.watchdog_report import serve_http, snapshot
from components.node_programs.watchdog_settings import Settings
from components.node_programs.watchdog_state import DockerEvents, Persisted, Status, load_saved, log, saver
from components.node_programs.watchdog_world import RealWorld, World


class Watchdog:
    """The controller, one `tick()` at a time: it reads the serving containers, the memory guards and
    the server (`watchdog_checks`), which judge by the policy and act through the recovery; the clock
    and the World are given, so tests drive it."""

    def __init__(
        self,
        settings: Settings,
        world: World,
        clock: Callable[[], float] = time.time,
        saved: dict | None = None,
        save: Callable[[dict], None] = lambda _: None,
    ):
        self.s, self.world, self.clock = settings, world, clock
        self.p = Persisted.load(saved)
        now = clock()
        self.st = Status(
            state=health_wire.State.BUDGET_SPENT if self.p.spent else health_wire.State.STARTING,
            since=now,
            grace_from=now,
            next_step=SPENT_NEXT_STEP
            if self.p.spent
            else "wait: no verdict before the server is first ready or startup_s has passed",
            docker=DockerEvents(started=now),
        )
        self.recovery = Recovery(settings, world, self.st, self.p, save, clock)
        self.events = EventWatch(settings, world, clock, self.st)
        self.serving = ServingWatch(settings, world, self.st, self.recovery, self.events)
        self.guards = GuardWatch(settings, world, self.st, self.recovery)
        self.server = ServerChecks(settings, world, clock, self.st, self.recovery)
        self.guard = self.guards.guard  # the head's memory guard: its thread checks it every second
        self.lock = threading.Lock()

    def tick(self) -> None:
        with self.lock:
            self._tick(self.clock())

    def _tick(self, now: float) -> None:
        self.st.refusals = self.world.agent_refusals()
        self.guards.read_skew()
        self.guard.check(now)
        if self.serving.observe(now):
            return
        if self.guards.answer_trips(now):
            return
        if self.st.state is health_wire.State.BUDGET_SPENT:
            self.recovery.check_reset(now)
            return
        if self.st.step is health_wire.Step.MEMORY_WAIT:
            self.recovery.memory_wait(now)
            return
        self.server.check()

    def snapshot(self) -> dict:
        """/state (`watchdog_report.snapshot`)."""
        # Without the lock: a tick may be in a stop that takes minutes, and /state must answer then.
        for _ in range(5):
            try:
                return snapshot(self.s, self.st, self.p, self.clock())
            except RuntimeError:  # a list or dict changed size while copied: read again
                continue
        return snapshot(self.s, self.st, self.p, self.clock())


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
