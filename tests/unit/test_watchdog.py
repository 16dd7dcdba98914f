"""The watchdog's decisions (components/node_programs/watchdog.py), driven tick by tick with a fake
clock and a fake World: probes, grace, recovery steps, the memory check, the budget, report mode."""

from __future__ import annotations

import json
import time

import pytest

from components.config import parse_stack_config
from components.health.containers import health_config
from components.node_programs import health_wire
from components.node_programs.watchdog import Watchdog
from components.node_programs.watchdog_policy import engine_progress, parse_started_at
from components.node_programs.watchdog_report import metrics_text
from components.node_programs.watchdog_settings import Settings, Target
from components.node_programs.watchdog_world import Probe, World
from tests.support.program import config_from, mp_raw

GB = 10**9


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


SERVER = ("spark-1", "qwen35-vllm")
RANK1 = ("spark-2", "qwen35-vllm-rank1")


def rfc3339(at: float) -> str:
    """A unix time as Docker's State.StartedAt writes it."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(at)) + ".123456789Z"


class FakeWorld(World):
    """Probes answer from a script; memory per node; containers' facts per (node, name); every action
    recorded. Given the clock, a probe that fails by its deadline takes that long on it."""

    def __init__(self, clock: Clock | None = None) -> None:
        self.clock = clock
        self.health: list[Probe] = []  # consumed one per probe; empty: the default
        self.default = Probe(True, 0.01)
        self.completion = Probe(True, 0.5)
        self.completions: list[Probe] = []  # consumed one per completion; empty: `completion`
        self.metrics: list[str | None] = []  # consumed one per /metrics read; the last one stays
        self.memory: dict[str, int | None] = {}
        self.running: dict[tuple[str, str], bool] = {}
        self.box: dict[tuple[str, str], dict] = {}  # facts beyond running: id, started_at, restarts, state
        self.actions: list[tuple[str, str, str]] = []
        self.stop_bounds: list[int] = []  # each stop's SIGTERM grace before SIGKILL
        self.booted: float | None = None
        self.skew: dict[str, float] = {}
        self.guards: dict[str, dict] = {}  # each agent's memory guard report
        self.kernel: dict[str, dict] = {}  # each node's kernel faults ({faults, error})
        # Docker's event log per node, as the daemon writes it (`docker events` JSON); None: it cannot
        # be read (the watchdog then counts Docker's restarts from RestartCount). Needs the clock.
        self.docker_log: list[tuple[str, dict]] | None = None

    def facts(self, key: tuple[str, str], **facts) -> None:
        self.box.setdefault(key, {}).update(facts)

    def emit(self, key: tuple[str, str], action: str, at: float | None = None, **attributes: str) -> None:
        """One event of the container `key` as Docker 20.10 writes it, now (or `at`)."""
        if self.docker_log is None:
            return
        assert self.clock is not None, "Docker's events need the fake clock"
        at = self.clock.now if at is None else at
        cid = self.box.get(key, {}).get("id") or f"id-{key[1]}"
        message = {"status": action, "id": cid, "from": "sha256:" + "b" * 64, "Type": "container",
                   "Action": action, "Actor": {"ID": cid, "Attributes": {**attributes, "name": key[1]}},
                   "scope": "local", "time": int(at), "timeNano": round(at * 1e6) * 1000}  # fmt: skip
        self.docker_log.append((key[0], message))

    def crash(self, key: tuple[str, str], at: float | None = None, exit_code: int = 1) -> None:
        """The container's main process exits and Docker's restart policy starts it again at once."""
        self.emit(key, "die", at, exitCode=str(exit_code))
        self.emit(key, "start", at)
        facts = self.box.setdefault(key, {})
        facts["restarts"] = facts.get("restarts", 0) + 1

    def events(self, node: str, since: float, until: float) -> tuple[list[dict], str | None]:
        if self.docker_log is None:
            return [], "cannot connect to the Docker daemon"
        found = [m for n, m in self.docker_log if n == node and since <= m["timeNano"] / 1e9 <= until]
        body = b"".join(json.dumps(m).encode() + b"\n" for m in found)
        names = {m["Actor"]["Attributes"]["name"] for m in found}
        return health_wire.parse_events(body, names), None

    def boot_time(self) -> float | None:
        return self.booted

    def agent_clock_skew(self) -> dict[str, float]:
        return dict(self.skew)

    def memory_guards(self) -> dict[str, dict]:
        return {node: dict(report) for node, report in self.guards.items()}

    def kernel_faults(self, node: str, since: float) -> dict:
        return self.kernel.get(node, {"faults": [], "error": None})

    def probe_health(self, deadline_s: float) -> Probe:
        return self.health.pop(0) if self.health else self.default

    def probe_completion(self, deadline_s: float) -> Probe:
        probe = self.completions.pop(0) if self.completions else self.completion
        if self.clock is not None and probe.kind == "timeout":
            self.clock.now += deadline_s
        return probe

    def probe_metrics(self, deadline_s: float) -> str | None:
        return self.metrics.pop(0) if len(self.metrics) > 1 else (self.metrics or [None])[0]

    def mem_available(self, node: str):
        value = self.memory.get(node, 100 * GB)
        return value, None if value is not None else "unreadable"

    def containers(self, node: str) -> list[dict]:
        found = []
        for n, name in dict.fromkeys([*self.running, *self.box]):
            if n == node:
                facts = {"name": name, "state": "running" if self.running.get((n, name), True) else "exited"}
                found.append({**facts, **self.box.get((n, name), {})})
        return found

    def stop(self, target: Target) -> dict:
        key = (target.node, target.name)
        self.actions.append(("stop", *key))
        self.stop_bounds.append(target.stop_timeout_s)
        if self.running.get(key, True):  # Docker's stop: SIGTERM, the exit, then its own `stop` event
            self.emit(key, "kill", signal="15")
            self.emit(key, "die", exitCode="143")
            self.emit(key, "stop")
        self.running[key] = False
        return {"ok": True}

    def start(self, target: Target) -> dict:
        key = (target.node, target.name)
        self.actions.append(("start", *key))
        if not self.running.get(key, True):
            self.emit(key, "start")
            if self.docker_log is not None and "restarts" in self.box.get(key, {}):
                self.box[key]["restarts"] = 0  # Docker resets RestartCount on a start through its API
        self.running[key] = True
        return {"ok": True}

    def logs(self, target: Target, tail: int) -> list[str]:
        return ["last line"]

    def ray_nodes(self) -> dict:
        return {"alive": 2, "nodes": 2}


HANG = Probe(False, 5.0, "timeout", "no answer")
DOWN = Probe(False, 0.0, "refused", "connection refused")
HEALTH = {"interval_s": 10, "deadline_s": 5, "failures": 3, "startup_s": 600, "ready_s": 100,
          "memory_wait_s": 30, "max_restarts": 2, "window_s": 3600, "completion_every": 6}  # fmt: skip


def settings(executor: str = "ray", need: dict | None = None, **health) -> Settings:
    if executor == "mp":
        raw = mp_raw()
        raw["health"] = {**HEALTH, **health}
        cfg = parse_stack_config(raw)
    else:
        cfg = config_from("dev", health={**HEALTH, **health})
    return Settings.from_json(health_config(cfg, cfg.head, need))


def dog(world: FakeWorld, clock: Clock, saved: dict | None = None, **kw) -> tuple[Watchdog, list[dict]]:
    saves: list[dict] = []
    built = Watchdog(settings(**kw), world, clock, saved, lambda d: saves.append(json.loads(json.dumps(d))))
    return built, saves


def ticks(watchdog: Watchdog, clock: Clock, count: int, step: float = 10.0) -> None:
    for _ in range(count):
        watchdog.tick()
        clock.now += step


def test_a_healthy_server_is_left_alone_and_its_ready_time_recorded():
    world, clock = FakeWorld(), Clock()
    watchdog, _ = dog(world, clock)
    ticks(watchdog, clock, 12)
    state = watchdog.snapshot()
    assert state["state"] == "healthy" and world.actions == [] and state["last_ttft_s"] == 0.5
    assert set(health_wire.STATE_KEYS) <= set(state)


def test_no_verdict_during_start_up_grace_before_the_first_ready():
    world, clock = FakeWorld(), Clock()
    world.default = DOWN
    watchdog, _ = dog(world, clock, startup_s=600)
    ticks(watchdog, clock, 59)  # 590 s of a server that never answered: JIT tuning, say
    assert watchdog.snapshot()["state"] == "starting" and world.actions == []
    ticks(watchdog, clock, 4)  # past startup_s: now failures count
    assert world.actions, "no recovery after startup_s"


def test_the_grace_runs_from_the_server_container_s_start():
    """A watchdog replaced (an upgrade) an hour after the server started gives it no new hour."""
    world, clock = FakeWorld(), Clock()
    world.default = DOWN
    world.facts(SERVER, started_at=rfc3339(clock.now - 3600))
    watchdog, _ = dog(world, clock, startup_s=600)
    ticks(watchdog, clock, 3)
    assert world.actions, "the grace ran from the watchdog's own start"


def test_after_a_reboot_a_start_time_from_the_last_boot_gives_no_verdict_early():
    """The watchdog's container came back before the server's: the server's StartedAt is still the
    last boot's, days ago. The grace runs from this boot, not from then."""
    world, clock = FakeWorld(), Clock()
    world.booted = clock.now - 5
    world.default = DOWN
    world.facts(SERVER, started_at=rfc3339(clock.now - 3 * 86400))
    watchdog, _ = dog(world, clock, startup_s=600)
    ticks(watchdog, clock, 30)  # 300 s of a server loading again after the boot
    assert watchdog.snapshot()["state"] == "starting" and world.actions == []
    ticks(watchdog, clock, 35)
    assert world.actions, "no recovery once startup_s passed"


def test_docker_s_own_restarts_spend_the_budget_and_then_stop_the_cluster():
    """`unless-stopped` restarts a crashing server at once, with no memory check: each such restart
    counts, and the one past the budget stops everything (eugr #257: 35 such restarts)."""
    world, clock = FakeWorld(), Clock()
    world.facts(SERVER, restarts=4)  # Docker's count before the watchdog started: not its to judge
    watchdog, _ = dog(world, clock, max_restarts=2)
    ticks(watchdog, clock, 3)
    assert watchdog.snapshot()["state"] == "healthy" and watchdog.snapshot()["budget_left"] == 2
    world.facts(SERVER, restarts=5)
    ticks(watchdog, clock, 1)
    state = watchdog.snapshot()
    assert state["budget_left"] == 1 and state["restarts_total"] == {"docker_restart": 1}
    assert world.actions == []  # the server answers again: nothing to do yet
    world.facts(SERVER, restarts=7)
    ticks(watchdog, clock, 1)
    state = watchdog.snapshot()
    assert state["state"] == "budget_spent" and "docker_restart" in state["spent"]["why"]
    assert ("stop", "spark-1", "qwen35-vllm") in world.actions


def test_docker_s_restarts_are_recorded_but_never_acted_on_in_report_mode():
    world, clock = FakeWorld(), Clock()
    world.facts(SERVER, restarts=0)
    watchdog, _ = dog(world, clock, max_restarts=1, mode="report")
    ticks(watchdog, clock, 1)
    world.facts(SERVER, restarts=3)
    ticks(watchdog, clock, 2)
    state = watchdog.snapshot()
    assert state["restarts_total"] == {"docker_restart": 3} and world.actions == []
    assert state["state"] != "budget_spent"


@pytest.mark.parametrize(
    ("text", "expected"),
    [("2026-12-02T01:40:56.123456789Z", 1796175656.123456), ("0001-01-01T00:00:00Z", None), ("", None)],
)
def test_docker_start_times(text, expected):
    assert parse_started_at(text) == expected


def test_after_a_first_ready_the_grace_is_over():
    world, clock = FakeWorld(), Clock()
    world.health = [Probe(True, 0.1)] + [HANG] * 3
    watchdog, _ = dog(world, clock)
    ticks(watchdog, clock, 4)
    assert ("stop", "spark-1", "qwen35-vllm") in world.actions


@pytest.mark.parametrize(
    ("probes", "restarted"),
    [
        ([Probe(True, 0.1), HANG, HANG], False),  # two failures: below `failures`
        ([Probe(True, 0.1), HANG, HANG, Probe(True, 0.1), HANG, HANG], False),  # not in a row
        ([Probe(True, 0.1), HANG, HANG, HANG], True),
        ([Probe(True, 0.1), DOWN, DOWN, DOWN], True),
        # Slow but answering (4.9 s of a 5 s deadline): never a failure.
        ([Probe(True, 0.1)] + [Probe(True, 4.9)] * 20, False),
    ],
)
def test_consecutive_failures_decide(probes, restarted):
    world, clock = FakeWorld(), Clock()
    world.health = list(probes)
    watchdog, _ = dog(world, clock)
    ticks(watchdog, clock, len(probes))
    assert bool(world.actions) is restarted, world.actions


def test_a_hang_restarts_only_the_server_then_waits_for_ready():
    world, clock = FakeWorld(), Clock()
    world.health = [Probe(True, 0.1), HANG, HANG, HANG]
    watchdog, saves = dog(world, clock)
    ticks(watchdog, clock, 4)
    assert world.actions == [("stop", "spark-1", "qwen35-vllm"), ("start", "spark-1", "qwen35-vllm")]
    state = watchdog.snapshot()
    assert state["state"] == "recovering" and state["step"] == "restart_server"
    assert state["restarts"][0]["reason"] == "hang" and state["budget_left"] == 1
    assert state["last_diagnosis"]["containers"] and state["last_diagnosis"]["ray_nodes"] == {
        "alive": 2,
        "nodes": 2,
    }
    assert saves[-1]["restarts_total"] == {"hang": 1}
    ticks(watchdog, clock, 1)
    assert watchdog.snapshot()["state"] == "healthy"


def test_not_ready_within_ready_s_restarts_the_cluster_in_order():
    world, clock = FakeWorld(), Clock()
    world.health = [Probe(True, 0.1)] + [DOWN] * 20
    watchdog, _ = dog(world, clock, ready_s=50, max_restarts=3)
    ticks(watchdog, clock, 4 + 5)  # 3 failures, the restart, 50 s of waiting
    cluster = [a for a in world.actions[2:]]
    assert cluster == [
        ("stop", "spark-1", "qwen35-vllm"),
        ("stop", "spark-2", "qwen35-ray-worker"),
        ("stop", "spark-1", "qwen35-ray-head"),
        ("start", "spark-1", "qwen35-ray-head"),
        ("start", "spark-2", "qwen35-ray-worker"),
        ("start", "spark-1", "qwen35-vllm"),
    ]
    assert [r["step"] for r in watchdog.snapshot()["restarts"]] == ["restart_server", "restart_cluster"]


def test_under_mp_a_cluster_restart_starts_the_headless_ranks_before_the_head():
    """Issue 41 item 2: under mp every recovery restarts the world (the first one too: a rank 0
    restarted alone finds the other ranks in the old world), the headless ranks before the head."""
    world, clock = FakeWorld(), Clock()
    world.health = [Probe(True, 0.1)] + [DOWN] * 20
    watchdog, _ = dog(world, clock, executor="mp", ready_s=50)
    ticks(watchdog, clock, 9)
    starts = [a for a in world.actions if a[0] == "start"]
    world_start = [("start", "spark-2", "qwen35-vllm-rank1"), ("start", "spark-1", "qwen35-vllm")]
    assert starts == world_start * 2


def test_memory_below_the_need_blocks_the_restart_and_says_which_node():
    world, clock = FakeWorld(), Clock()
    world.health, world.default = [Probe(True, 0.1)], HANG
    world.memory = {"spark-1": 100 * GB, "spark-2": 61 * GB}
    watchdog, _ = dog(world, clock, need={"spark-1": 70 * GB, "spark-2": 70 * GB}, memory_wait_s=30)
    ticks(watchdog, clock, 4)
    assert watchdog.snapshot()["step"] == "memory_wait"
    ticks(watchdog, clock, 4)
    state = watchdog.snapshot()
    assert state["state"] == "memory_held"
    assert state["held"]["message"] == (
        "spark-2: MemAvailable 61 GB, 70 GB needed: unified memory is held; reboot spark-2"
    )
    assert [a[0] for a in world.actions] == ["stop"] and state["restarts"] == []
    ticks(watchdog, clock, 10)
    assert [a[0] for a in world.actions] == ["stop"], "it acted after the memory was held"


def test_memory_that_comes_back_within_the_wait_lets_the_restart_go_on():
    world, clock = FakeWorld(), Clock()
    world.health = [Probe(True, 0.1)] + [HANG] * 3
    world.memory = {"spark-2": 61 * GB}
    watchdog, _ = dog(world, clock, need={"spark-1": 70 * GB, "spark-2": 70 * GB}, memory_wait_s=30)
    ticks(watchdog, clock, 5)
    world.memory = {"spark-2": 80 * GB}
    ticks(watchdog, clock, 1)
    assert world.actions[-1] == ("start", "spark-1", "qwen35-vllm")


def test_a_spent_budget_stops_everything_and_persists():
    world, clock = FakeWorld(), Clock()
    world.default = DOWN
    world.health = [Probe(True, 0.1)]
    watchdog, saves = dog(world, clock, max_restarts=1, ready_s=30)
    ticks(watchdog, clock, 4 + 4)  # one restart, not ready, the next restart finds the budget spent
    state = watchdog.snapshot()
    assert state["state"] == "budget_spent" and state["budget_left"] == 0
    assert "1 restarts in 3600 s spent" in state["spent"]["why"]
    assert {("spark-1", "qwen35-vllm"), ("spark-1", "qwen35-ray-head"), ("spark-2", "qwen35-ray-worker")} == {
        (a[1], a[2]) for a in world.actions[-3:]
    }
    assert saves[-1]["spent"] == state["spent"]
    actions = list(world.actions)
    ticks(watchdog, clock, 10)
    assert world.actions == actions, "a spent watchdog acted"
    # A replaced watchdog (an upgrade, a reboot) reads the spent budget and does nothing.
    world2 = FakeWorld()
    world2.running = dict(world.running)
    again, _ = dog(world2, clock, saved=saves[-1], max_restarts=1)
    ticks(again, clock, 5)
    assert again.snapshot()["state"] == "budget_spent" and world2.actions == []
    # The operator starts them: the budget resets, recorded.
    for key in world2.running:
        world2.running[key] = True
    ticks(again, clock, 2)
    state = again.snapshot()
    assert state["spent"] is None and state["budget_left"] == 1 and state["budget_resets"]


def test_a_healthy_cluster_s_reboot_still_comes_back():
    """A saved history with restarts but no spent budget: the new watchdog waits and finds it healthy."""
    world, clock = FakeWorld(), Clock()
    saved = {"restarts": [{"at": clock.now - 100, "reason": "hang", "step": "restart_server"}], "spent": None}
    watchdog, _ = dog(world, clock, saved=saved)
    ticks(watchdog, clock, 2)
    state = watchdog.snapshot()
    assert state["state"] == "healthy" and state["budget_left"] == 1 and world.actions == []


def test_restarts_leave_the_window():
    world, clock = FakeWorld(), Clock()
    saved = {"restarts": [{"at": clock.now - 4000, "reason": "hang", "step": "restart_server"}] * 2}
    watchdog, _ = dog(world, clock, saved=saved)
    assert watchdog.snapshot()["budget_left"] == 2


def test_report_mode_records_what_it_would_do_and_never_acts():
    world, clock = FakeWorld(), Clock()
    world.health = [Probe(True, 0.1)]
    world.default = HANG
    watchdog, _ = dog(world, clock, mode="report")
    ticks(watchdog, clock, 20)
    state = watchdog.snapshot()
    assert world.actions == [] and state["would"]["step"] == "restart_server"
    assert "report mode: would restart server" in state["next_step"]


def test_metrics_are_prometheus_text():
    world, clock = FakeWorld(), Clock()
    world.memory = {"spark-1": 123456789012}
    world.health = [Probe(True, 0.1)] + [HANG] * 3
    watchdog, _ = dog(world, clock)
    ticks(watchdog, clock, 4)
    text = metrics_text(watchdog.snapshot())
    assert 'qwen35_health_restarts_total{reason="hang"} 1' in text
    assert 'qwen35_health_mem_available_bytes{node="spark-1"} 123456789012' in text
    assert "qwen35_health_budget_left 1" in text
    assert 'qwen35_health_state{state="recovering"} 1' in text
    for line in text.splitlines():
        assert line.startswith("#") or len(line.split(" ")) == 2, line


# ---- issue 41: the hang /health hides, one world under mp, Docker's restarts, `pulumi up` ---------------


def run(watchdog: Watchdog, clock: Clock, seconds: float) -> None:
    """The watchdog's own loop (`main`) on the fake clock: a tick, then sleep out the interval."""
    end = clock.now + seconds
    while clock.now < end:
        started = clock.now
        watchdog.tick()
        clock.now += max(watchdog.s.interval_s - (clock.now - started), 0.1)


def first_stop(world: FakeWorld) -> int:
    return next(i for i, a in enumerate(world.actions) if a[0] == "stop")


@pytest.mark.parametrize(
    "health",
    [
        {},  # this file's defaults: interval 10, deadline 5, completion every 6th, its deadline 60
        {"interval_s": 2, "deadline_s": 1, "completion_every": 3, "completion_deadline_s": 10},  # the lab's
        {"interval_s": 30, "deadline_s": 5, "completion_every": 1, "completion_deadline_s": 10},
    ],
)
def test_a_hang_that_health_hides_is_declared_within_the_bound(health):
    """vLLM's /health answers 200 in a millisecond while its worker is stopped (SIGSTOP) and every
    completion times out: the completions decide, within `hang_bound_s`, whatever /health says. Its
    /metrics still answer, with the figures of the idle engine it was (the engine core sends none)."""
    clock = Clock()
    world = FakeWorld(clock)
    world.metrics = [metrics(0, 100)]
    watchdog, _ = dog(world, clock, **health)
    run(watchdog, clock, 200)
    assert watchdog.snapshot()["state"] == "healthy"
    hung_at, stops = clock.now, []
    world.completion = Probe(False, watchdog.s.completion_deadline_s, "timeout", "no answer")
    world.stop = lambda target: stops.append(clock.now) or {"ok": True}  # type: ignore[method-assign]
    run(watchdog, clock, 2 * watchdog.s.hang_bound_s())
    assert stops, "a hang behind a passing /health was never recovered"
    bound = watchdog.s.hang_bound_s()
    assert 0 < stops[0] - hung_at <= bound, (stops[0] - hung_at, bound)
    state = watchdog.snapshot()
    assert state["restarts"][0]["reason"] == "hang" and state["hang_bound_s"] == watchdog.s.hang_bound_s()


def test_a_hang_s_records_carry_the_time_of_the_decision_not_of_the_tick_s_start():
    """The third completion times out 60 s after its tick began: the diagnosis and the restart are
    stamped when the watchdog decided, after that wait (else a measured detection time reads ~60 s low)."""
    clock = Clock()
    world = FakeWorld(clock)
    watchdog, _ = dog(world, clock, completion_every=1, completion_deadline_s=60)
    run(watchdog, clock, 100)
    world.completion = Probe(False, 60.0, "timeout", "no answer")
    decided: list[tuple[float, float]] = []

    def stop(target):
        # As the first stop finds it: the diagnosis the recovery just made.
        decided.append((clock.now, watchdog.snapshot()["last_diagnosis"]["at"]))
        return {"ok": True}

    world.stop = stop  # type: ignore[method-assign]
    run(watchdog, clock, 400)
    assert decided, "the hang was never recovered"
    stopped_at, diagnosed_at = decided[0]
    assert diagnosed_at == stopped_at, decided[0]
    # The restart is recorded when the stopped containers start again, no earlier than the decision.
    assert watchdog.snapshot()["restarts"][0]["at"] >= stopped_at


def test_the_bound_with_the_defaults_is_under_a_minute_idle_and_stall_s_under_load():
    cfg = config_from("dev")
    found = Settings.from_json(health_config(cfg, cfg.head))
    # Idle: a completion every probe, 10 s each (+2 s for the reads), 3 in a row.
    assert found.hang_bound_s() == 3 * 12 + 10 <= 60
    # Under load, the stall rule (300 s) seen at the next tick, which may wait out a 60 s completion.
    assert found.stall_bound_s() == 300 + 62
    # With no /metrics to read, a completion every 6th probe: the old bound.
    assert found.unread_bound_s() == 6 * 10 + 2 * 70 + 70


def test_an_idle_engine_gets_a_completion_every_probe_with_the_short_deadline_and_a_busy_one_every_nth():
    clock = Clock()
    world = FakeWorld(clock)
    asked: list[float] = []
    world.probe_completion = lambda deadline_s: asked.append(deadline_s) or Probe(True, 0.2)  # type: ignore[method-assign]
    world.metrics = [metrics(0, 100)]
    watchdog, _ = dog(world, clock)
    ticks(watchdog, clock, 12)
    assert asked == [10.0] * 11, asked  # the first probe finds the server ready; then one per probe
    asked.clear()
    world.metrics = [metrics(3, 100 + 40 * i) for i in range(40)]  # busy: tokens move
    ticks(watchdog, clock, 12)
    assert asked == [60.0] * 2, asked  # every 6th probe, with the busy deadline


def test_a_hang_under_load_is_declared_within_the_stall_bound():
    clock = Clock()
    world = FakeWorld(clock)
    world.metrics = [metrics(3, 100 + 40 * i) for i in range(30)] + [metrics(3, 1300)]
    watchdog, _ = dog(world, clock, stall_s=120)
    run(watchdog, clock, 300)
    assert watchdog.snapshot()["state"] == "healthy" and not watchdog.snapshot()["restarts"]
    hung_at = clock.now  # the counters stop moving: requests in the engine, no token counted
    world.completion = Probe(False, 60.0, "timeout", "no answer")
    stops: list[float] = []
    world.stop = lambda target: stops.append(clock.now) or {"ok": True}  # type: ignore[method-assign]
    run(watchdog, clock, 2 * watchdog.s.stall_bound_s())
    assert stops and stops[0] - hung_at <= watchdog.s.stall_bound_s(), (stops, hung_at)


def test_a_long_prefill_moves_the_prompt_counter_and_is_not_a_stall():
    prefill = (
        "vllm:num_requests_running 1\nvllm:num_requests_waiting 0\n"
        "vllm:generation_tokens_total 100\nvllm:prompt_tokens_total {p}\n"
    )
    world, clock = FakeWorld(), Clock()
    world.metrics = [prefill.format(p=1000 + 2048 * i) for i in range(60)]
    watchdog, _ = dog(world, clock, stall_s=60)
    ticks(watchdog, clock, 40)
    assert world.actions == [] and not watchdog.snapshot()["restarts"]


OK = Probe(True, 0.5)
SLOW = Probe(False, 60.0, "timeout", "no answer")


@pytest.mark.parametrize(
    ("completions", "restarted"),
    [
        ([SLOW, SLOW, SLOW], True),  # three in a row, /health passing every time in between
        ([SLOW, SLOW, OK, SLOW, SLOW], False),  # a passing completion clears them; /health does not
        ([SLOW, SLOW, OK, SLOW, SLOW, SLOW], True),
        ([Probe(False, 0.1, "status", "HTTP 500")] * 3, True),
    ],
)
def test_failed_completions_are_counted_on_their_own(completions, restarted):
    world, clock = FakeWorld(), Clock()
    world.completions = list(completions)
    watchdog, _ = dog(world, clock)
    # A completion every 6th probe, and on every probe after a failed one; then they pass.
    ticks(watchdog, clock, 30)
    assert bool(world.actions) is restarted, (world.actions, watchdog.snapshot()["next_step"])
    if not restarted:
        assert watchdog.snapshot()["consecutive_failures"] == 0


def metrics(running: float, tokens: float) -> str:
    return (
        "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
        "# TYPE vllm:num_requests_running gauge\n"
        f'vllm:num_requests_running{{engine="0",model_name="qwen"}} {running}\n'
        "# TYPE vllm:generation_tokens_total counter\n"
        f'vllm:generation_tokens_total{{engine="0",model_name="qwen"}} {tokens}\n'
        f'vllm:generation_tokens_created{{engine="0",model_name="qwen"}} 1.7e9\n'
    )


@pytest.mark.parametrize(
    ("samples", "reason"),
    [
        # Requests running, the token counter still for stall_s (60 s here): a hang.
        ([metrics(2, 100)] * 8, "stall"),
        # Tokens move: a busy engine.
        ([metrics(2, 100 + 7 * i) for i in range(12)], None),
        # Nothing running: an idle engine generates nothing.
        ([metrics(0, 100)] * 12, None),
        # Stalled for 50 s, then a token: the clock starts again.
        ([metrics(2, 100)] * 6 + [metrics(2, 101)] * 6, None),
        # No vLLM figures (another server): no verdict from /metrics.
        (["# nothing here\n"] * 12, None),
    ],
)
def test_requests_running_without_a_token_for_stall_s_are_a_hang(samples, reason):
    world, clock = FakeWorld(), Clock()
    watchdog, _ = dog(world, clock, stall_s=60, completion_every=1000)
    ticks(watchdog, clock, 1)  # ready
    world.metrics = list(samples)
    ticks(watchdog, clock, len(samples))
    state = watchdog.snapshot()
    assert [r["reason"] for r in state["restarts"]] == ([reason] if reason else []), state["next_step"]


def test_a_completion_that_times_out_while_tokens_are_generated_is_busy_not_hung():
    world, clock = FakeWorld(), Clock()
    world.completion = SLOW
    world.metrics = [metrics(8, 1000 + 50 * i) for i in range(40)]
    watchdog, _ = dog(world, clock, completion_every=1)
    ticks(watchdog, clock, 20)
    state = watchdog.snapshot()
    assert world.actions == [] and state["consecutive_completion_failures"] == 0
    assert "busy, not hung" in state["next_step"]
    world.metrics = [metrics(8, 3000)]  # the counter stops: the same timeouts now count
    ticks(watchdog, clock, 4)
    assert watchdog.snapshot()["restarts"][0]["reason"] == "hang"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (metrics(3, 12345), (3.0, 0.0, 12345.0)),
        ("vllm:num_requests_running 1\nvllm:generation_tokens_total 5\n", (1.0, 0.0, 5.0)),
        (metrics(1, 2) + metrics(2, 3).replace('engine="0"', 'engine="1"'), (3.0, 0.0, 5.0)),
        (
            "vllm:num_requests_running 0\nvllm:num_requests_waiting 4\n"
            "vllm:generation_tokens_total 5\nvllm:prompt_tokens_total 70\n",
            (0.0, 4.0, 75.0),
        ),
        ("vllm:num_requests_running 1\n", None),
    ],
)
def test_engine_progress_reads_vllm_s_metrics(text, expected):
    assert engine_progress(text) == expected


def test_under_mp_every_recovery_restarts_the_world():
    world, clock = FakeWorld(), Clock()
    world.health = [Probe(True, 0.1), HANG, HANG, HANG]
    watchdog, _ = dog(world, clock, executor="mp")
    ticks(watchdog, clock, 4)
    assert world.actions == [
        ("stop", "spark-1", "qwen35-vllm"),
        ("stop", "spark-2", "qwen35-vllm-rank1"),
        ("start", "spark-2", "qwen35-vllm-rank1"),
        ("start", "spark-1", "qwen35-vllm"),
    ]
    (restart,) = watchdog.snapshot()["restarts"]
    assert restart == {"at": clock.now - 10, "reason": "hang", "step": "restart_cluster"}


@pytest.mark.parametrize("rank", [RANK1, SERVER])
def test_under_mp_a_rank_docker_restarted_on_its_own_means_a_world_restart(rank):
    world, clock = FakeWorld(), Clock()
    for key in (SERVER, RANK1):
        world.facts(key, id=f"id-{key[1]}", restarts=0)
    watchdog, _ = dog(world, clock, executor="mp", max_restarts=2)
    ticks(watchdog, clock, 3)
    world.facts(rank, restarts=1)
    ticks(watchdog, clock, 1)
    assert world.actions == [
        ("stop", "spark-1", "qwen35-vllm"),
        ("stop", "spark-2", "qwen35-vllm-rank1"),
        ("start", "spark-2", "qwen35-vllm-rank1"),
        ("start", "spark-1", "qwen35-vllm"),
    ]
    state = watchdog.snapshot()
    assert state["restarts_total"] == {"docker_restart": 1} and state["budget_left"] == 1


def test_docker_s_restarts_during_start_up_spend_the_budget_as_recoveries_do():
    """max_restarts 3: three restarts are made (Docker's or the watchdog's), the fourth spends it."""
    world, clock = FakeWorld(), Clock()
    world.default = DOWN  # crashing while it loads: never ready
    world.facts(SERVER, restarts=0)
    watchdog, _ = dog(world, clock, max_restarts=3, startup_s=3600)
    ticks(watchdog, clock, 1)
    for count in (1, 2, 3):
        world.facts(SERVER, restarts=count)
        ticks(watchdog, clock, 1)
        state = watchdog.snapshot()
        assert state["state"] != "budget_spent" and state["budget_left"] == 3 - count, (count, state)
    assert world.actions == []
    world.facts(SERVER, restarts=4)
    ticks(watchdog, clock, 1)
    assert watchdog.snapshot()["state"] == "budget_spent"


@pytest.mark.parametrize(
    "change",
    [
        {"id": "new-container"},  # `pulumi up` replaced it (serve.max_num_seqs changed)
        {"started_at": "later"},  # same container, started again by someone else (`up --refresh`)
    ],
)
def test_a_new_server_container_gets_a_fresh_start_up_grace(change):
    world, clock = FakeWorld(), Clock()
    world.facts(SERVER, id="old", started_at=rfc3339(clock.now - 7200), restarts=0)
    watchdog, _ = dog(world, clock, startup_s=600)
    ticks(watchdog, clock, 3)
    assert watchdog.snapshot()["state"] == "healthy"
    if change.get("started_at"):
        change = {"started_at": rfc3339(clock.now)}
    world.facts(SERVER, **change)
    world.default = DOWN  # loading its weights
    ticks(watchdog, clock, 58)
    state = watchdog.snapshot()
    assert world.actions == [] and state["state"] == "starting" and state["budget_left"] == 2, state
    assert "new serving container" in state["next_step"]
    ticks(watchdog, clock, 6)  # past startup_s and never ready: now it is judged
    assert world.actions


@pytest.mark.parametrize("state", ["missing", "created", "removing"])
def test_no_verdict_and_no_action_while_the_serving_containers_are_replaced(state):
    world, clock = FakeWorld(), Clock()
    world.facts(SERVER, id="old", restarts=0)
    watchdog, _ = dog(world, clock, executor="mp")
    ticks(watchdog, clock, 2)
    world.default = DOWN
    world.box[SERVER] = {"state": state}
    ticks(watchdog, clock, 20)
    snapshot = watchdog.snapshot()
    assert world.actions == [] and snapshot["state"] == "starting" and snapshot["consecutive_failures"] == 0
    assert f"qwen35-vllm {state}" in snapshot["next_step"]
    world.box[SERVER] = {"id": "new", "restarts": 0}
    ticks(watchdog, clock, 20)
    assert world.actions == [] and watchdog.snapshot()["state"] == "starting"


def test_a_clock_skew_beyond_the_window_is_named_in_state_and_metrics():
    world, clock = FakeWorld(), Clock()
    world.skew = {"spark-2": 75.4}
    watchdog, _ = dog(world, clock)
    ticks(watchdog, clock, 1)
    state = watchdog.snapshot()
    assert state["clock_skew"] == [
        "spark-2's clock is 75 s ahead of the head's, beyond the agents' 60 s window: its agent refuses "
        "every request; synchronise the clocks (chrony or systemd-timesyncd on both nodes)"
    ]
    assert 'qwen35_health_agent_clock_skew_seconds{node="spark-2"} 75.4' in metrics_text(state)
    world.skew = {"spark-2": 0.2}
    ticks(watchdog, clock, 1)
    assert watchdog.snapshot()["clock_skew"] == []


def test_state_carries_no_server_log_line():
    """/state answers anyone who reaches it: the server's lines stay in the watchdog's own log."""
    world, clock = FakeWorld(), Clock()
    world.logs = lambda target, tail: ["secret-looking line"]  # type: ignore[method-assign]
    world.health = [Probe(True, 0.1)] + [HANG] * 3
    watchdog, _ = dog(world, clock)
    ticks(watchdog, clock, 4)
    state = watchdog.snapshot()
    assert state["last_diagnosis"] and "secret-looking line" not in json.dumps(state)


# ---- the memory guard (issue 41 item 6) and what a diagnosis names (item 8) ---------------------------

RAY_HEAD = ("spark-1", "qwen35-ray-head")
RAY_WORKER = ("spark-2", "qwen35-ray-worker")
NEED = {"spark-1": 70 * GB, "spark-2": 70 * GB}


def ray_world(clock: Clock) -> FakeWorld:
    world = FakeWorld(clock)
    for key in (RAY_HEAD, RAY_WORKER, SERVER):
        world.facts(key, id=f"id-{key[1]}", restarts=0)
    return world


def test_the_head_s_memory_guard_stops_its_serving_containers_once_and_the_world_restarts():
    """MemAvailable below memory_floor_gb (2 GB) for memory_floor_s (5 s) on the head: its guard stops
    the head's serving containers (server first), once; the watchdog answers with a cluster restart,
    memory-checked, one of the budget (`memory_floor`), and /state says why."""
    world, clock = ray_world(Clock()), Clock()
    watchdog, _ = dog(world, clock, need=NEED, memory_wait_s=60)
    ticks(watchdog, clock, 3)
    world.memory["spark-1"] = int(1.5 * GB)
    ticks(watchdog, clock, 1)  # below the floor for 0 s: nothing yet
    assert world.actions == [] and watchdog.snapshot()["state"] == "healthy"
    ticks(watchdog, clock, 1)  # 10 s below: the guard trips
    assert world.actions == [
        ("stop", "spark-1", "qwen35-vllm"),
        ("stop", "spark-1", "qwen35-ray-head"),  # the guard's own stop, then the recovery's (a no-op)
        ("stop", "spark-1", "qwen35-vllm"),
        ("stop", "spark-2", "qwen35-ray-worker"),
        ("stop", "spark-1", "qwen35-ray-head"),
    ]
    state = watchdog.snapshot()
    assert state["step"] == "memory_wait" and state["state"] == "recovering"
    trip = state["memory_guard"]["spark-1"]
    assert trip["acted"] and trip["stopped"] == ["qwen35-vllm", "qwen35-ray-head"]
    # The guard's two stops get health.guard_stop_s (10 s) before SIGKILL; the recovery's their own grace.
    assert world.stop_bounds[:2] == [10, 10] and world.stop_bounds[2] > 10, world.stop_bounds
    assert set(trip["stops"]) == {"qwen35-vllm", "qwen35-ray-head"}
    assert all(stop["stop_s"] == 10 for stop in trip["stops"].values()), trip["stops"]
    assert trip["message"] == (
        "spark-1: MemAvailable 1.5 GB below the memory floor 2.0 GB for 10 s: stopped qwen35-vllm, "
        "qwen35-ray-head before the kernel's OOM killer or a hang"
    )
    assert state["last_diagnosis"]["fault"] == {"kind": "memory", "says": trip["message"]}
    world.memory["spark-1"] = 100 * GB  # the stop gave the memory back
    ticks(watchdog, clock, 1)
    assert [a for a in world.actions if a[0] == "start"] == [
        ("start", "spark-1", "qwen35-ray-head"),
        ("start", "spark-2", "qwen35-ray-worker"),
        ("start", "spark-1", "qwen35-vllm"),
    ]
    state = watchdog.snapshot()
    assert state["restarts_total"] == {"memory_floor": 1} and state["budget_left"] == 1
    assert state["memory_guard_trips"] == {"spark-1": 1}
    text = metrics_text(state)
    assert 'qwen35_health_restarts_total{reason="memory_floor"} 1' in text
    assert 'qwen35_health_memory_guard_trips_total{node="spark-1"} 1' in text


@pytest.mark.parametrize(
    ("memory_gb", "trips"),
    [
        # (MemAvailable each tick of 10 s, in GB) -> the guard's trips
        ([50, 1.5, 1.5, 1.5, 1.5, 1.5, 1.5], 1),  # low and staying low: once, not every tick
        ([50, 1.5, 1.5, 50, 1.5, 1.5], 2),  # back above the floor re-arms it
        ([50, 1.5, 50, 1.5, 50, 1.5], 0),  # dips shorter than memory_floor_s (5 s; 0 s seen here)
        ([50, 2.0, 2.0, 2.0], 0),  # at the floor is not below it
        ([50, None, None, None], 0),  # unreadable: nothing judged
        ([50, 1.5, None, 1.5, 1.5], 1),  # an unreadable sample restarts the clock, does not re-arm
    ],
)
def test_the_memory_guard_trips_once_per_episode_below_the_floor(memory_gb, trips):
    world, clock = ray_world(Clock()), Clock()
    watchdog, _ = dog(world, clock, max_restarts=5)
    for value in memory_gb:
        world.memory["spark-1"] = None if value is None else int(value * GB)
        ticks(watchdog, clock, 1)
    state = watchdog.snapshot()
    assert state["memory_guard_trips"].get("spark-1", 0) == trips, state["memory_guard"]
    assert state["restarts_total"].get("memory_floor", 0) == trips


@pytest.mark.parametrize(("health", "acts"), [({}, True), ({"memory_floor_gb": 0}, False)])
def test_memory_floor_gb_0_turns_the_guard_off(health, acts):
    world, clock = ray_world(Clock()), Clock()
    watchdog, _ = dog(world, clock, **health)
    world.memory["spark-1"] = 0
    ticks(watchdog, clock, 3)
    assert bool(world.actions) is acts


def test_under_report_the_memory_guard_records_what_it_would_do_and_stops_nothing():
    world, clock = ray_world(Clock()), Clock()
    watchdog, _ = dog(world, clock, mode="report")
    ticks(watchdog, clock, 2)
    world.memory["spark-1"] = GB
    ticks(watchdog, clock, 3)
    state = watchdog.snapshot()
    assert world.actions == [] and state["restarts_total"] == {}
    assert state["would"] == {"at": clock.now - 20, "step": "restart_cluster", "reason": "memory_floor"}
    trip = state["memory_guard"]["spark-1"]
    assert not trip["acted"] and "report mode: would stop qwen35-vllm, qwen35-ray-head" in trip["message"]


def guard_report(trips: int, node: str = "spark-2", name: str = "qwen35-vllm-rank1", at: float = 0.0) -> dict:
    last = {"node": node, "at": at, "available_bytes": GB, "floor_bytes": 2 * GB, "acted": True,
            "stopped": [name], "message": f"{node}: MemAvailable 1.0 GB below the memory floor"}  # fmt: skip
    return {"trips": trips, "last": last if trips else None, "available_bytes": GB, "floor_bytes": 2 * GB}


def test_under_mp_a_rank_stopped_by_its_node_s_guard_means_a_world_restart_within_the_budget():
    """Stopping one rank breaks the world: the watchdog stops the rest and starts the world again,
    headless ranks first, one restart of the budget (reason memory_floor)."""
    world, clock = FakeWorld(clock=None), Clock()
    for key in (SERVER, RANK1):
        world.facts(key, id=f"id-{key[1]}", restarts=0)
    world.guards = {"spark-2": guard_report(0)}
    watchdog, _ = dog(world, clock, executor="mp", max_restarts=2)
    ticks(watchdog, clock, 3)
    world.guards = {"spark-2": guard_report(1, at=clock.now)}
    world.running[RANK1] = False  # the agent's guard stopped it
    ticks(watchdog, clock, 1)
    assert world.actions == [
        ("stop", "spark-1", "qwen35-vllm"),
        ("stop", "spark-2", "qwen35-vllm-rank1"),
        ("start", "spark-2", "qwen35-vllm-rank1"),
        ("start", "spark-1", "qwen35-vllm"),
    ]
    state = watchdog.snapshot()
    assert state["restarts_total"] == {"memory_floor": 1} and state["budget_left"] == 1
    assert state["memory_guard"]["spark-2"]["stopped"] == ["qwen35-vllm-rank1"]
    assert state["last_diagnosis"]["fault"]["kind"] == "memory"
    ticks(watchdog, clock, 5)
    assert len(world.actions) == 4, "the same trip was answered twice"


def test_under_mp_a_guard_trip_that_finds_the_budget_spent_stops_the_world():
    world, clock = FakeWorld(), Clock()
    world.guards = {"spark-2": guard_report(0)}
    watchdog, _ = dog(world, clock, executor="mp", max_restarts=0)
    ticks(watchdog, clock, 2)
    world.guards = {"spark-2": guard_report(1)}
    ticks(watchdog, clock, 1)
    state = watchdog.snapshot()
    assert state["state"] == "budget_spent" and "(restart cluster, memory_floor)" in state["spent"]["why"]
    assert [a[0] for a in world.actions] == ["stop", "stop"]


def test_an_agent_s_trip_from_before_the_watchdog_started_is_shown_not_answered():
    world, clock = FakeWorld(), Clock()
    world.guards = {"spark-2": guard_report(3, name="qwen35-ray-worker")}
    watchdog, _ = dog(world, clock)
    ticks(watchdog, clock, 3)
    state = watchdog.snapshot()
    assert world.actions == [] and state["memory_guard"]["spark-2"]["stopped"] == ["qwen35-ray-worker"]
    assert state["memory_guard_trips"] == {}


@pytest.mark.parametrize(
    ("kernel", "box", "fault"),
    [
        ({}, {}, None),  # a plain crash: nothing names a cause
        ({}, {"oom_killed": True}, ("memory", "spark-1: qwen35-vllm was OOM-killed (Docker's OOMKilled)")),
        (
            {"spark-2": {"faults": [{"kind": "xid", "xid": 79, "meaning": "GPU has fallen off the bus"}]}},
            {},
            ("gpu", "spark-2: NVRM Xid 79 (GPU has fallen off the bus)"),
        ),
        (
            {"spark-1": {"faults": [{"kind": "oom_kill", "pid": 4242, "process": "python3"}]}},
            {},
            ("memory", "spark-1: the kernel's OOM killer killed python3 (pid 4242)"),
        ),
        ({"spark-2": {"faults": [], "error": "cannot read the kernel's log at /dev/kmsg"}}, {}, None),
    ],
)
def test_a_diagnosis_names_a_memory_or_gpu_fault(kernel, box, fault):
    world, clock = FakeWorld(), Clock()
    world.kernel = kernel
    world.health = [Probe(True, 0.1)] + [DOWN] * 3
    world.facts(SERVER, **box)
    watchdog, _ = dog(world, clock)
    ticks(watchdog, clock, 4)
    diagnosis = watchdog.snapshot()["last_diagnosis"]
    assert diagnosis["kernel"]["spark-2"] == kernel.get("spark-2", {"faults": [], "error": None})
    found = diagnosis["fault"]
    assert (found and (found["kind"], found["says"])) == (fault or None)


def test_an_xid_from_before_the_server_last_answered_does_not_name_a_later_crash():
    """The kernel's faults are read for this episode only: from the last time the server answered (less
    one interval of slack), not the whole budget window. An Xid an hour ago, after which the server
    served, is not what killed it now; the OOM kill since is."""
    world, clock = FakeWorld(), Clock()
    asked: list[float] = []
    faults = [
        {"kind": "xid", "xid": 79, "meaning": "GPU has fallen off the bus", "at": clock.now - 1800},
        {"kind": "oom_kill", "pid": 4242, "process": "python3", "at": None},  # stamped when the crash comes
    ]

    def kernel_faults(node: str, since: float) -> dict:
        asked.append(since)
        found = [f for f in faults if node == "spark-1" and f["at"] is not None and f["at"] >= since]
        return {"faults": found, "error": None}

    world.kernel_faults = kernel_faults  # type: ignore[method-assign]
    watchdog, _ = dog(world, clock)
    ticks(watchdog, clock, 30)  # 300 s of a healthy server after the Xid
    answered = watchdog.snapshot()["last_ready"]
    faults[1]["at"] = clock.now
    world.health = [DOWN] * 3
    ticks(watchdog, clock, 3)
    diagnosis = watchdog.snapshot()["last_diagnosis"]
    assert asked and min(asked) >= answered - watchdog.s.interval_s, (asked, answered)
    assert diagnosis["fault"] == {
        "kind": "memory",
        "says": "spark-1: the kernel's OOM killer killed python3 (pid 4242)",
    }


def test_under_mp_a_rank_docker_restarts_during_the_watchdog_s_own_world_restart_keeps_the_diagnosis():
    """The watchdog stops the world for a hang; a headless rank that lost its peers crashes and Docker's
    policy restarts it while the world waits for memory. That restart is part of the recovery under way:
    no second recovery, no second restart of the budget, and the diagnosis still says why it began."""
    world, clock = FakeWorld(clock=None), Clock()
    for key in (SERVER, RANK1):
        world.facts(key, id=f"id-{key[1]}", restarts=0)
    watchdog, _ = dog(world, clock, executor="mp", max_restarts=3, need=NEED, memory_wait_s=300)
    ticks(watchdog, clock, 3)
    world.memory["spark-2"] = NEED["spark-2"] // 2  # the stop frees it slowly: the world waits
    world.health = [DOWN] * 3
    ticks(watchdog, clock, 3)
    first = watchdog.snapshot()
    assert first["step"] == "memory_wait" and first["last_diagnosis"]["reason"] != "docker_restart", first
    reason = first["last_diagnosis"]["reason"]
    world.facts(RANK1, restarts=2)  # Docker restarted the rank twice meanwhile
    ticks(watchdog, clock, 2)
    world.memory["spark-2"] = 100 * GB
    ticks(watchdog, clock, 2)
    state = watchdog.snapshot()
    assert state["last_diagnosis"]["reason"] == reason, state["last_diagnosis"]
    assert state["restarts_total"] == {reason: 1}, state["restarts_total"]


# ---- issue 53: Docker's events instead of its counters -------------------------------------------------


def events_world(executor: str = "ray") -> tuple[FakeWorld, Clock]:
    """A world whose Docker event log can be read, its serving containers running with their IDs."""
    clock = Clock()
    world = FakeWorld(clock)
    world.docker_log = []
    keys = (SERVER, RANK1) if executor == "mp" else (RAY_HEAD, RAY_WORKER, SERVER)
    for key in keys:
        world.facts(key, id=f"id-{key[1]}", restarts=0)
    return world, clock


def test_under_mp_a_crash_loop_is_counted_restart_by_restart_though_restart_count_is_reset():
    """Docker resets RestartCount when a container is started through its API (the watchdog's own
    starts): a rank that crashes again right after the watchdog started the world reads 1 restart, as
    before its start, and the count missed it. Each `start` Docker's policy makes after a `die`, with no
    `stop` between them and not the watchdog's own, is one restart: each is answered with a world
    restart until the budget is spent."""
    world, clock = events_world("mp")
    watchdog, _ = dog(world, clock, executor="mp", max_restarts=3)
    ticks(watchdog, clock, 3)
    assert watchdog.snapshot()["state"] == "healthy"
    real_start = world.start

    def start(target: Target) -> dict:
        done = real_start(target)
        if (target.node, target.name) == RANK1:  # it crashes half a second after each start
            world.crash(RANK1, at=clock.now + 0.5)
        return done

    world.start = start  # type: ignore[method-assign]
    world.crash(RANK1, at=clock.now - 1)
    ticks(watchdog, clock, 6)
    state = watchdog.snapshot()
    assert state["restarts_total"] == {"docker_restart": 3}, (state["restarts_total"], state["next_step"])
    assert state["state"] == "budget_spent" and "docker_restart" in state["spent"]["why"]
    assert [a[0] for a in world.actions].count("start") == 2 * 3  # three world restarts, no fourth
    assert state["docker_events"]["nodes"]["spark-2"] == {
        "read_until": state["docker_events"]["nodes"]["spark-2"]["read_until"],
        "error": None,
        "restarts_from": "events",
    }


def test_the_watchdog_s_own_stops_and_starts_are_neither_docker_s_restarts_nor_someone_else_s():
    world, clock = events_world()
    world.health = [Probe(True, 0.1), HANG, HANG, HANG]
    watchdog, _ = dog(world, clock)
    ticks(watchdog, clock, 6)
    state = watchdog.snapshot()
    assert world.actions == [("stop", "spark-1", "qwen35-vllm"), ("start", "spark-1", "qwen35-vllm")]
    assert state["state"] == "healthy" and state["restarts_total"] == {"hang": 1}, state
    recent = [(e["action"], e["by"]) for e in state["docker_events"]["recent"]]
    assert recent == [("kill", "watchdog"), ("die", "watchdog"), ("stop", "watchdog"), ("start", "watchdog")]


def test_without_docker_s_events_restarts_are_counted_from_restart_count_and_state_says_so():
    world, clock = FakeWorld(), Clock()
    world.facts(SERVER, restarts=0)
    watchdog, _ = dog(world, clock, max_restarts=3)
    ticks(watchdog, clock, 2)
    world.facts(SERVER, restarts=2)
    ticks(watchdog, clock, 1)
    state = watchdog.snapshot()
    assert state["restarts_total"] == {"docker_restart": 2}
    read = state["docker_events"]["nodes"]["spark-1"]
    assert read["error"] == "cannot connect to the Docker daemon" and read["restarts_from"] == "RestartCount"
    assert 'qwen35_health_docker_events_read{node="spark-1"} 0' in metrics_text(state)


def test_docker_s_oom_event_of_a_container_that_kept_running_names_memory_in_the_diagnosis():
    """The OOM killer killed a process inside the server's container (a worker, say), not its main
    process: the container keeps running and OOMKilled stays false. Docker's `oom` event says so."""
    world, clock = events_world()
    watchdog, _ = dog(world, clock)
    ticks(watchdog, clock, 3)
    world.emit(SERVER, "oom")
    ticks(watchdog, clock, 1)
    world.default = DOWN
    ticks(watchdog, clock, 3)
    diagnosis = watchdog.snapshot()["last_diagnosis"]
    assert world.box[SERVER].get("oom_killed") is None and diagnosis["containers"]["spark-1"]
    assert [(e["node"], e["name"]) for e in diagnosis["docker_oom"]] == [SERVER]
    assert diagnosis["fault"] == {
        "kind": "memory",
        "says": "spark-1: Docker's oom event: the kernel's OOM killer killed a process in qwen35-vllm",
    }


def test_an_oom_event_the_server_answered_after_names_no_later_crash():
    world, clock = events_world()
    watchdog, _ = dog(world, clock)
    ticks(watchdog, clock, 2)
    world.emit(SERVER, "oom")
    ticks(watchdog, clock, 30)  # it served on for 300 s
    world.default = DOWN
    ticks(watchdog, clock, 3)
    diagnosis = watchdog.snapshot()["last_diagnosis"]
    assert diagnosis["docker_oom"] == [] and diagnosis["fault"] is None


def someone_else_stops(world: FakeWorld, key: tuple[str, str] = SERVER) -> float:
    """`pulumi up`'s delete (or an operator's `docker stop -t 120`): SIGTERM, from no one the watchdog
    knows. The container reads `running` until its process exits; /health is refused meanwhile."""
    assert world.clock is not None
    world.emit(key, "kill", signal="15")
    world.default = DOWN
    return world.clock.now


def exits(world: FakeWorld, key: tuple[str, str] = SERVER) -> None:
    world.emit(key, "die", exitCode="0")
    world.emit(key, "stop")
    world.running[key] = False


@pytest.mark.parametrize("successor", ["replaced", "started again"])
def test_a_slow_stop_someone_else_sent_spends_nothing_and_its_successor_gets_a_fresh_grace(successor):
    """Issue 53 item 4: the Docker provider deletes a container by stopping it first with a 120 s
    grace, and vLLM takes 45 s to exit: the container reads `running` all that time while /health is
    refused. The watchdog did not send that SIGTERM (its `kill` event is no one's it knows): it stands
    back, neither judging nor acting, until the container is removed or started again, and never
    starts the old one itself; what follows gets a fresh start-up grace."""
    world, clock = events_world()
    watchdog, _ = dog(world, clock, startup_s=600)
    ticks(watchdog, clock, 3)
    kill_at = someone_else_stops(world)
    ticks(watchdog, clock, 4)  # 40 s of a container that drains: `running`, /health refused
    state = watchdog.snapshot()
    assert world.actions == [] and state["state"] == "starting", state
    assert "qwen35-vllm on spark-1" in state["next_step"] and "SIGTERM" in state["next_step"]
    assert "someone else than the watchdog" in state["next_step"], state["next_step"]
    (standing,) = state["standing_back"]
    assert (standing["node"], standing["name"], standing["since"]) == (*SERVER, kill_at)
    assert standing["until"] == kill_at + 120 + 60  # the server's stop timeout plus a minute
    clock.now += 5
    exits(world)  # 45 s after the SIGTERM
    clock.now += 5
    ticks(watchdog, clock, 2)  # exited: `up` has not removed it yet
    assert world.actions == [] and watchdog.snapshot()["state"] == "starting"
    if successor == "replaced":  # `up` removes it and creates its replacement
        world.emit(SERVER, "destroy")
        world.box[SERVER] = {"state": "missing"}
        ticks(watchdog, clock, 1)
        world.box[SERVER] = {"id": "id-new", "restarts": 0}
        world.emit(SERVER, "create")
    world.emit(SERVER, "start")
    world.running[SERVER] = True
    ticks(watchdog, clock, 50)  # 500 s of a new server loading: within its grace
    state = watchdog.snapshot()
    assert world.actions == [] and state["state"] == "starting", state
    assert state["budget_left"] == 2 and state["restarts_total"] == {} and state["standing_back"] == []
    (stood,) = state["stand_backs"]
    assert stood["how"] == ("destroy" if successor == "replaced" else "start"), stood
    assert "qwen35_health_stand_backs_total 1" in metrics_text(state)
    ticks(watchdog, clock, 14)  # past startup_s and never ready: now it is judged
    assert ("stop", "spark-1", "qwen35-vllm") in world.actions


def test_standing_back_ends_at_the_stop_timeout_plus_a_minute_and_the_watchdog_judges_again():
    """Nothing acts on its own beyond a bound: a stop someone else began that neither ends in a removal
    nor in a start (a caller that died, a stop that hung) is waited out for the container's stop
    timeout plus 60 s; then the server is judged as before."""
    world, clock = events_world()
    watchdog, _ = dog(world, clock)
    ticks(watchdog, clock, 3)
    kill_at = someone_else_stops(world)
    while clock.now < kill_at + 120 + 60:
        ticks(watchdog, clock, 1)
    assert world.actions == [] and watchdog.snapshot()["standing_back"], watchdog.snapshot()
    ticks(watchdog, clock, 4)
    state = watchdog.snapshot()
    assert world.actions == [("stop", "spark-1", "qwen35-vllm"), ("start", "spark-1", "qwen35-vllm")], state
    assert state["restarts_total"] == {"down": 1} and state["standing_back"] == []
    assert [s["how"] for s in state["stand_backs"]] == ["bound"]


def test_a_sigkill_someone_else_sent_is_judged_at_once_not_waited_out():
    """`docker kill` (SIGKILL) ends the container at once: there is no stop to wait out, so the watchdog
    does not stand back; the server down is judged as any crash."""
    world, clock = events_world()
    watchdog, _ = dog(world, clock)
    ticks(watchdog, clock, 3)
    world.emit(SERVER, "kill", signal="9")
    exits(world)
    world.default = DOWN
    ticks(watchdog, clock, 5)
    state = watchdog.snapshot()
    assert state["standing_back"] == [] and state["stand_backs_total"] == 0, state
    assert ("start", "spark-1", "qwen35-vllm") in world.actions, world.actions


def test_an_operator_s_docker_restart_is_a_fresh_grace_not_a_stand_back():
    world, clock = events_world()
    watchdog, _ = dog(world, clock)
    ticks(watchdog, clock, 3)
    for action, attributes in (("kill", {"signal": "15"}), ("die", {"exitCode": "0"}), ("stop", {}),
                               ("start", {}), ("restart", {})):  # fmt: skip
        world.emit(SERVER, action, **attributes)
    world.default = DOWN
    ticks(watchdog, clock, 10)
    state = watchdog.snapshot()
    assert world.actions == [] and state["state"] == "starting" and state["standing_back"] == []
    assert "new serving container(s) qwen35-vllm" in state["next_step"], state["next_step"]
    assert [s["how"] for s in state["stand_backs"]] == ["start"] and state["restarts_total"] == {}


@pytest.mark.parametrize("late", [False, True])
def test_an_agent_s_memory_guard_stop_is_no_one_else_s_stop(late):
    """A node's guard stops its rank with its own SIGTERM: not a stop to stand back for, but a trip the
    watchdog answers with a world restart. Its trip may reach the watchdog a tick after the stop's
    `kill` event (the agent records the trip once its stops are done): the watchdog then stands back
    for that tick only."""
    world, clock = events_world("mp")
    world.guards = {"spark-2": guard_report(0)}
    watchdog, _ = dog(world, clock, executor="mp", max_restarts=2)
    ticks(watchdog, clock, 3)
    tripped_at = clock.now
    world.emit(RANK1, "kill", signal="15")
    exits(world, RANK1)
    if late:
        ticks(watchdog, clock, 1)
        assert world.actions == [] and watchdog.snapshot()["standing_back"]
    world.guards = {"spark-2": guard_report(1, at=tripped_at)}
    ticks(watchdog, clock, 1)
    state = watchdog.snapshot()
    assert [a[0] for a in world.actions] == ["stop", "stop", "start", "start"], world.actions
    assert state["restarts_total"] == {"memory_floor": 1} and state["standing_back"] == []
    assert [s["how"] for s in state["stand_backs"]] == (["guard"] if late else [])
