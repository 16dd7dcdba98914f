"""A server start's cold-start figures (components/node_programs/cold_start.py) from vLLM's own log
lines: the real vLLM 0.32.0 CPU build's log as the lab's head and rank 1 printed it (2026-12-06,
`docker logs --timestamps`, kept in tests/support/vllm_logs/), read by the readiness gate, kept by
its provider, shown by `status` and exported by the watchdog."""

from __future__ import annotations

from pathlib import Path

import pytest

from components.node_programs import cold_start
from components.node_programs.cold_start import milestones, parse_stamp, summary
from components.node_programs.watchdog_report import metrics_text
from components.node_programs.watchdog_world import Probe
from components.readiness_gate.plan import kept_cold_start
from status.serving import cold_start_line

LOGS = Path(__file__).resolve().parents[1] / "support" / "vllm_logs"
# Docker timestamps each line that ends in `\n`: a progress bar's `\r` stays inside its line.
HEAD = (LOGS / "vllm-0.32.0-cpu-lab-head-2026-12-06.log").read_text().rstrip("\n").split("\n")
RANK1 = (LOGS / "vllm-0.32.0-cpu-lab-rank1-2026-12-06.log").read_text().rstrip("\n").split("\n")
# `docker inspect -f '{{.State.StartedAt}}'` of each container, read with its log.
HEAD_STARTED = "2026-12-06T06:18:28.154076306Z"
RANK1_STARTED = "2026-12-06T06:18:27.391599984Z"


def at(text: str) -> float:
    value = parse_stamp(text)
    assert value is not None
    return value


def test_the_real_head_log_gives_every_milestone():
    record = cold_start.cold_start(HEAD_STARTED, HEAD)
    assert record is not None
    # 06:18:56.30 `Loading weights took 0.01 seconds`, 06:18:57.86 `init engine … took 0.64 s`,
    # 06:18:59.50 `Application startup complete.`
    assert (record["weights_loaded_s"], record["engine_ready_s"], record["api_ready_s"]) == (28.2, 29.7, 31.3)
    assert record["vllm"] == {"load_weights_s": 0.01, "init_engine_s": 0.64}
    assert record["missing"] == [] and record["first_completion_s"] is None
    assert record["started_at"] == round(at(HEAD_STARTED), 3)


def test_a_headless_rank_logs_its_weights_only():
    found = milestones(RANK1, at(RANK1_STARTED))
    assert set(found["at"]) == {"weights_loaded"} and found["vllm"] == {"load_weights_s": 0.02}
    assert found["missing"] == ["engine_ready", "api_ready"]


def test_the_first_completion_counts_only_for_a_wait_begun_before_the_api_was_ready():
    api = at("2026-12-06T06:18:59.502743716Z")
    waited = cold_start.cold_start(HEAD_STARTED, HEAD, completion_at=api + 1.7, waited_from=api - 20)
    late = cold_start.cold_start(HEAD_STARTED, HEAD, completion_at=api + 60, waited_from=api + 50)
    assert waited["first_completion_s"] == 33.0
    assert late["first_completion_s"] is None, "a server that answered before the wait: not its first"


def test_an_earlier_run_of_the_same_container_is_not_this_start():
    """`docker logs` of a restarted container holds every run: lines before this start are older."""
    earlier = [line.replace("2026-12-06T06:18", "2026-12-06T05:18", 1) for line in HEAD]
    loaded = next(i for i, line in enumerate(HEAD) if "Loading weights took" in line)
    record = cold_start.cold_start(HEAD_STARTED, earlier + HEAD[: loaded + 1])
    assert record["weights_loaded_s"] == 28.2
    assert record["engine_ready_s"] is None and record["missing"] == ["engine_ready", "api_ready"]


def test_vllm_s_gpu_lines_give_the_compile_time_and_the_model_s_memory():
    """The lines as vLLM's format strings print them on a GPU (core.py, gpu_model_runner.py)."""
    worker, core = "(Worker_TP0 pid=3) INFO", "(EngineCore pid=2) INFO [core.py:396]"
    lines = [
        f"2026-12-06T07:00:40.000000000Z {worker} [default_loader.py:501] "
        "Loading weights took 512.30 seconds",
        f"2026-12-06T07:00:41.500000000Z {worker} [gpu_model_runner.py:5150] "
        "Model loading took 59.8 GiB memory and 530.123456 seconds",
        # A progress bar's `\r` before the line in Docker's one timestamped line.
        f"2026-12-06T07:02:10.000000000Z Capturing: 100%\r{core} "
        "init engine (profile, create kv cache, warmup model) took 88.20 s (compilation: 61.50 s)",
        "2026-12-06T07:02:12.000000000Z INFO:     Application startup complete.",
    ]
    record = cold_start.cold_start("2026-12-06T06:51:00Z", lines)
    assert record["weights_loaded_s"] == 580.0 and record["engine_ready_s"] == 670.0
    assert record["vllm"] == {
        "load_weights_s": 512.3,
        "model_memory_gib": 59.8,
        "model_loading_s": 530.123456,
        "init_engine_s": 88.2,
        "compile_s": 61.5,
    }
    assert summary(record) == (
        "weights 580.0 s, engine 670.0 s, API 672.0 s after the container's start (compile 61.5 s)"
    )


@pytest.mark.parametrize(
    "line",
    [
        "Model loading took 59.8 GiB memory and 530.123456 seconds",  # gpu_model_runner.py, older
        "Model loading took 59.8 GiB and 530.123456 seconds",  # newer: no "memory"
    ],
)
def test_both_forms_of_vllm_s_model_loading_line(line):
    stamped_line = f"2026-12-06T07:00:41.500000000Z (Worker_TP0 pid=3) INFO [gpu_model_runner.py:4100] {line}"
    record = cold_start.cold_start("2026-12-06T06:51:00Z", [stamped_line])
    assert record["vllm"] == {"model_memory_gib": 59.8, "model_loading_s": 530.123456}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-12-06T06:18:28.154076306Z", 1796537908.154076),
        ("2026-12-06T07:18:28+01:00", 1796537908.0),
        ("0001-01-01T00:00:00Z", None),
        ("yesterday", None),
        ("2026-13-06T06:18:28Z", None),
    ],
)
def test_docker_timestamps(text, expected):
    assert parse_stamp(text) == expected


def test_no_start_time_no_record():
    assert cold_start.cold_start("0001-01-01T00:00:00Z", HEAD) is None
    assert summary(None) == "not measured"
    assert summary({"weights_loaded_s": None}) == "no vLLM milestone in the server's log"


# ---- the gate keeps what its first probe of a start measured ---------------------------------------


def test_a_re_probe_of_the_same_start_keeps_the_first_completion():
    first = {"cold_start": {"started_at": 5.0, "api_ready_s": 31.3, "first_completion_s": 33.0}}
    again = {"model": "m", "cold_start": {"started_at": 5.0, "api_ready_s": 31.3, "first_completion_s": None}}
    assert kept_cold_start(first, again) == {"model": "m", "cold_start": first["cold_start"]}
    restarted = {"cold_start": {"started_at": 9.0, "first_completion_s": None}}
    assert kept_cold_start(first, restarted) == restarted, "a new start is its own record"
    assert kept_cold_start(None, again) == again


def test_the_provider_update_keeps_it(monkeypatch):
    from components.readiness_gate import provider as gate

    old_start = {"started_at": 5.0, "first_completion_s": 33.0}
    monkeypatch.setattr(
        gate,
        "ensure",
        lambda news, previous=None: {**news, "ready": True, "report": {"cold_start": {"started_at": 5.0}}},
    )
    olds = {"container_ids": {"a": "1"}, "report": {"cold_start": old_start}, "deployed": None}
    news = {"container_ids": {"a": "2"}, "deployed": None}
    outs = gate.ReadinessGateProvider().update("id", olds, news).outs
    assert outs["report"]["cold_start"] == old_start


# ---- status: the newest start, the gate's or the watchdog's ----------------------------------------


GATE = {"output": {"started_at": 1796537908.154, "weights_loaded_s": 28.2, "engine_ready_s": 29.7,
                   "api_ready_s": 31.3, "first_completion_s": 33.0, "vllm": {}}}  # fmt: skip


def test_status_shows_the_gate_s_start():
    line = cold_start_line(GATE, None, 1796537908.154 + 600)
    assert line == (
        "weights 28.2 s, engine 29.7 s, API 31.3 s, first completion 33.0 s after the container's start; "
        "started 2026-12-06 06:18 UTC (10m00s ago), measured by the readiness gate of `pulumi up`"
    )


def test_status_shows_a_later_start_the_watchdog_saw():
    watched = {
        "started_at": 1796539000.0,
        "weights_loaded_s": 20.0,
        "engine_ready_s": 22.0,
        "api_ready_s": 23.0,
    }
    line = cold_start_line(GATE, watched, None)
    assert line.startswith("weights 20.0 s, engine 22.0 s, API 23.0 s after") and line.endswith(
        "by the watchdog"
    )
    older = {**watched, "started_at": 1.0}
    assert cold_start_line(GATE, older, None).endswith("`pulumi up`")


def test_status_says_why_nothing_was_measured():
    assert cold_start_line({"error": "no stack output `cold_start`"}, None, None) == (
        "not measured (no stack output `cold_start`)"
    )
    assert cold_start_line({"output": {"error": "OSError: docker logs exited 1"}}, None, None) == (
        "not measured (OSError: docker logs exited 1)"
    )


# ---- the watchdog: every start it sees ready, once ------------------------------------------------


def test_the_watchdog_measures_each_start_once_and_exports_it():
    from tests.unit.test_watchdog import SERVER, Clock, FakeWorld, dog, ticks

    class LoggingWorld(FakeWorld):
        def __init__(self, clock):
            super().__init__(clock)
            self.reads: list[tuple[float, float]] = []

        def start_lines(self, target, since, until):
            assert (target.node, target.name) == SERVER
            self.reads.append((since, until))
            return HEAD

    clock = Clock()
    clock.now = at(HEAD_STARTED) + 40
    world = LoggingWorld(clock)
    world.facts(SERVER, started_at=HEAD_STARTED)
    watchdog, _ = dog(world, clock)
    ticks(watchdog, clock, 5)
    state = watchdog.snapshot()
    assert state["cold_start"]["engine_ready_s"] == 29.7 and len(world.reads) == 1
    since, until = world.reads[0]
    assert since == at(HEAD_STARTED) and until > since + 600, "the start's window: the longest wait given"
    text = metrics_text(state)
    assert 'qwen35_health_server_start_seconds{milestone="weights_loaded"} 28.2' in text
    assert 'qwen35_health_server_start_seconds{milestone="api_ready"} 31.3' in text
    assert f"qwen35_health_server_started_timestamp_seconds {round(at(HEAD_STARTED), 3)!r}" in text
    # Docker restarted the server: a new start, measured once more.
    restarted = "2026-12-06T06:30:00.000000000Z"
    world.facts(SERVER, started_at=restarted, restarts=1)
    world.health = [Probe(True, 0.1)] * 3
    ticks(watchdog, clock, 3)
    assert len(world.reads) == 2 and watchdog.snapshot()["cold_start"]["started_at"] == round(
        at(restarted), 3
    )


def test_a_log_the_watchdog_cannot_read_is_said_once():
    from tests.unit.test_watchdog import SERVER, Clock, FakeWorld, dog, ticks

    clock, world = Clock(), FakeWorld()
    world.facts(SERVER, started_at=HEAD_STARTED)
    watchdog, _ = dog(world, clock)
    ticks(watchdog, clock, 3)
    record = watchdog.snapshot()["cold_start"]
    assert record == {
        "started_at": round(at(HEAD_STARTED), 3),
        "error": "no log with timestamps in this world",
    }
    assert "server_start_seconds{" not in metrics_text(watchdog.snapshot())


def test_the_library_travels_with_the_gate_s_probe_and_the_watchdog():
    """Both import it on one line beside another library (`import cold_start, health_wire`)."""
    from components.node_programs import libraries

    assert "cold_start" in libraries("readiness")
    assert {"cold_start", "health_wire", "engine_api"} <= set(libraries("watchdog"))


def test_status_says_why_the_watchdog_could_not_measure_a_newer_start():
    watched = {"started_at": 1796539000.0, "error": "OSError: the daemon answered 500"}
    line = cold_start_line(GATE, watched, None)
    assert line.startswith("not measured (OSError: the daemon answered 500); started 2026-12-06"), line
    assert line.endswith("read by the watchdog"), line


def test_the_gate_reads_only_the_start_s_window_of_the_log(tmp_path, monkeypatch):
    """`docker logs --since <start> --until <start + the longest wait>`: a server that has logged
    for weeks is not read whole; only the milestone lines are kept."""
    from components.node_programs import readiness

    called = tmp_path / "argv"
    docker = tmp_path / "docker"
    docker.write_text(
        f'#!/bin/sh\nprintf "%s\\n" "$@" > {called}\ncat {LOGS / "vllm-0.32.0-cpu-lab-head-2026-12-06.log"}\n'
    )
    docker.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{__import__('os').environ['PATH']}")
    lines = readiness.milestone_lines("qwen35-vllm", HEAD_STARTED)
    argv = called.read_text().split("\n")
    until = float(argv[argv.index("--until") + 1])
    assert argv[argv.index("--since") + 1] == HEAD_STARTED
    assert until == pytest.approx(at(HEAD_STARTED) + readiness.START_WINDOW_S, abs=0.01)
    assert len(lines) == 3 and all(cold_start.stamped(line)[0] for line in lines), lines
    assert cold_start.cold_start(HEAD_STARTED, lines)["api_ready_s"] == 31.3
