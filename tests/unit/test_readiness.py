"""The readiness probe without a node: `ray status` parsing, each stage against the stand-in server on
this machine, the timeout message, and the gate's command line (the secret stays off argv)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from components.node_programs import readiness, wire
from components.node_programs.readiness import ReadinessError, parse_ray_status, wait_ready
from components.readiness_gate import probe_argv, probe_program
from tests.support.standin_openai import StandinServer

MODEL = "qwen3.5-test"

RAY_STATUS_V2 = """\
======== Autoscaler status: 2026-11-30 10:00:00.000000 ========
Node status
---------------------------------------------------------------
Active:
 (no active nodes)
Idle:
 1 node_6f2c1e0f8d0a4b0c9e3c7b1c2d3e4f5a6b7c8d9e0f1a2b3c4d5e6f7a
 1 node_0a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5
Pending:
 (no pending nodes)
Recent failures:
 (no failures)

Resources
---------------------------------------------------------------
Usage:
 0.0/40.0 CPU
 0.0/2.0 GPU
 0B/78.05GiB memory
 0B/37.45GiB object_store_memory

Demands:
 (no resource demands)
"""

RAY_STATUS_V1_ONE_NODE = """\
======== Autoscaler status: 2026-11-30 10:00:00.000000 ========
Node status
---------------------------------------------------------------
Healthy:
Active:
 1 node_6f2c1e0f8d0a4b0c9e3c7b1c2d3e4f5a6b7c8d9e0f1a2b3c4d5e6f7a
Pending:
 (no pending nodes)

Resources
---------------------------------------------------------------
Usage:
 2.0/20.0 CPU
 1.0/1.0 GPU
"""


@pytest.mark.parametrize(
    ("text", "nodes", "gpus"),
    [
        (RAY_STATUS_V2, 2, 2.0),
        (RAY_STATUS_V1_ONE_NODE, 1, 1.0),
        ("", 0, 0.0),
        ("Active:\n (no active nodes)\nIdle:\n (no idle nodes)\n", 0, 0.0),
    ],
    ids=["idle-section", "active-section", "empty", "no-nodes"],
)
def test_parse_ray_status(text, nodes, gpus):
    assert parse_ray_status(text) == readiness.RayStatus(nodes, gpus)


@pytest.fixture
def server():
    srv = StandinServer("127.0.0.1", 0, MODEL, api_key="sk-test").start()
    yield srv
    srv.shutdown()
    srv.server_close()


def probe(server, deadline=5.0, **kwargs):
    kwargs.setdefault("ray_check", None)
    kwargs.setdefault("api_key", "sk-test")
    return wait_ready(server.url, 2, 2, MODEL, deadline, interval_s=0.05, **kwargs)


def test_healthy_with_ray(server):
    report = probe(server, ray_check=lambda: RAY_STATUS_V2)
    assert (report.ray_nodes, report.ray_gpus, report.completion_tokens) == (2, 2.0, 2)
    assert server.requests == ["GET /health", "GET /v1/models", "POST /v1/chat/completions"]


def test_waits_for_a_loading_server(server):
    import time

    server.ready_at = time.monotonic() + 0.5
    report = probe(server)
    assert report.elapsed_s >= 0.4


def test_missing_ray_node_times_out_at_the_ray_stage(server):
    with pytest.raises(ReadinessError) as caught:
        probe(server, deadline=0.3, ray_check=lambda: RAY_STATUS_V1_ONE_NODE, log_tail=lambda: "l1\nl2")
    err = caught.value
    assert err.stage == "ray"
    assert "1/2 nodes, 1/2 GPUs joined" in str(err)
    assert "    | l2" in str(err)
    assert server.requests == []


@pytest.mark.parametrize(
    ("mode", "stage", "detail"),
    [
        ("unhealthy", "health", "/health answered 500"),
        ("loading", "health", "/health answered 503"),
        ("no-tokens", "completion", "no tokens"),
    ],
)
def test_not_ready_modes(server, mode, stage, detail):
    server.mode = mode
    with pytest.raises(ReadinessError) as caught:
        probe(server, deadline=0.3)
    assert caught.value.stage == stage
    assert detail in str(caught.value)


def test_wrong_model_is_reported(server):
    server.model = "other"
    with pytest.raises(ReadinessError, match="'qwen3.5-test' not among served models"):
        probe(server, deadline=0.3)


def test_wrong_api_key_fails_at_once(server):
    with pytest.raises(ReadinessError, match="API key does not match") as caught:
        probe(server, deadline=30, api_key="sk-wrong")
    assert caught.value.rejected


def test_nothing_listening():
    with pytest.raises(ReadinessError, match="stuck at stage 'connect'"):
        wait_ready("http://127.0.0.1:9", 1, 1, MODEL, 0.2, ray_check=None, interval_s=0.05)


def test_ray_check_must_be_chosen_explicitly(server):
    with pytest.raises(TypeError):
        wait_ready(server.url, 1, 1, MODEL, 1)  # type: ignore[call-arg]


PROPS = {
    "node": {"name": "spark-1", "host": "h", "port": 22, "user": "u", "known_hosts": "/k"},
    "url": "http://127.0.0.1:8000",
    "model": MODEL,
    "expect_nodes": 2,
    "expect_gpus": 2,
    "ray_container": "qwen35-ray-head",
    "log_container": "qwen35-vllm",
    "api_key": "sk-very-secret",
}


def test_probe_argv_keeps_the_key_off_the_command_line():
    argv = probe_argv(PROPS, 3600)
    assert argv == [
        "python3", "-",
        "--url", "http://127.0.0.1:8000",
        "--model", MODEL,
        "--nodes", "2",
        "--gpus", "2",
        "--deadline", "3600",
        "--ray-container", "qwen35-ray-head",
        "--node", "spark-1",
        "--log-container", "qwen35-vllm",
    ]  # fmt: skip
    assert "sk-very-secret" not in " ".join(argv)
    assert probe_argv({**PROPS, "ray_container": None}, 10)[-5:] == [
        "--no-ray-check",
        "--node",
        "spark-1",
        "--log-container",
        "qwen35-vllm",
    ]


def test_probe_program_sets_the_key_in_its_environment():
    program = probe_program("sk-'quoted\"").decode()
    namespace: dict = {}
    exec(program.split("\n", 2)[0] + "\n" + program.split("\n", 2)[1], namespace)  # the prelude only
    import os

    assert os.environ.pop(wire.PROBE_API_KEY_ENV) == "sk-'quoted\""
    assert not probe_program(None).decode().startswith("import os")  # no key, no prelude


def test_the_shipped_probe_runs_on_stdin_with_its_key_from_the_prelude(server):
    argv = probe_argv({"url": server.url, "model": MODEL, "expect_nodes": 1, "expect_gpus": 1}, 10)
    env = {k: v for k, v in os.environ.items() if k != wire.PROBE_API_KEY_ENV}
    run = {"capture_output": True, "env": env, "cwd": "/", "timeout": 60}
    done = subprocess.run([sys.executable, *argv[1:]], input=probe_program("sk-test"), **run)
    assert done.returncode == 0 and b'"completion_tokens": 2' in done.stdout, done.stderr
    refused = subprocess.run([sys.executable, *argv[1:]], input=probe_program(None), **run)
    assert refused.returncode == readiness.Exit.REJECTED, refused.stderr


def test_cli_runs_against_the_standin(server, capsys, monkeypatch):
    monkeypatch.setenv(wire.PROBE_API_KEY_ENV, "sk-test")
    argv = ["--url", server.url, "--model", MODEL, "--nodes", "1", "--gpus", "1", "--deadline", "5"]
    assert readiness.main([*argv, "--no-ray-check"]) == 0
    assert '"completion_tokens": 2' in capsys.readouterr().out
    server.mode = "unhealthy"
    assert (
        readiness.main([*argv[:-1], "0.2", "--no-ray-check", "--interval", "0.05"]) == readiness.Exit.TIMEOUT
    )
    assert "/health answered 500" in capsys.readouterr().err


RAY_LIST_ONE_ALIVE = (
    '[{"node_id": "a1", "node_ip": "192.168.200.12", "state": "ALIVE"},'
    ' {"node_id": "b2", "node_ip": "192.168.200.13", "state": "DEAD"}]'
)
EXPECTED_IPS = {"spark-1": "192.168.200.12", "spark-2": "192.168.200.13"}


def test_missing_ray_node_is_named(server):
    with pytest.raises(ReadinessError) as caught:
        probe(
            server,
            deadline=0.3,
            ray_check=lambda: RAY_STATUS_V1_ONE_NODE,
            ray_nodes=lambda: RAY_LIST_ONE_ALIVE,
            expected_ips=EXPECTED_IPS,
        )
    assert "1/2 nodes, 1/2 GPUs joined; not joined: spark-2 (192.168.200.13)" in str(caught.value)


@pytest.mark.parametrize("answer", ["not json", OSError("ray list: no dashboard")])
def test_missing_node_names_are_best_effort(server, answer):
    def ray_nodes():
        if isinstance(answer, Exception):
            raise answer
        return answer

    with pytest.raises(ReadinessError) as caught:
        probe(
            server,
            deadline=0.2,
            ray_check=lambda: RAY_STATUS_V1_ONE_NODE,
            ray_nodes=ray_nodes,
            expected_ips=EXPECTED_IPS,
        )
    assert "1/2 nodes, 1/2 GPUs joined" in str(caught.value)
    assert "not joined" not in str(caught.value)


def test_exited_server_fails_at_once_with_its_log(server):
    server.mode = "unhealthy"
    calls = []
    with pytest.raises(ReadinessError) as caught:
        probe(
            server, deadline=60, server_state=lambda: calls.append(1) or "exited 137", log_tail=lambda: "boom"
        )
    message = str(caught.value)
    assert caught.value.stage == "server" and len(calls) == 1
    assert "has exited (exit code 137)" in message and "stage 'health'" in message and "    | boom" in message


def test_running_or_restarting_server_is_waited_for(server):
    server.mode = "unhealthy"
    with pytest.raises(ReadinessError) as caught:
        probe(server, deadline=0.3, server_state=lambda: "restarting 1")
    assert caught.value.stage == "health"


def test_probe_argv_names_the_expected_nodes():
    argv = probe_argv({**PROPS, "expect_node_ips": EXPECTED_IPS}, 10)
    assert argv[-4:] == ["--expect-node", "spark-1=192.168.200.12", "--expect-node", "spark-2=192.168.200.13"]


# Two nodes joined, but one of them brought no GPU: the cluster is one GPU short of TP×PP.
RAY_STATUS_ONE_GPU_SHORT = RAY_STATUS_V2.replace("0.0/2.0 GPU", "0.0/1.0 GPU")


def test_a_cluster_one_gpu_short_does_not_pass(server):
    with pytest.raises(ReadinessError) as caught:
        probe(server, deadline=0.3, ray_check=lambda: RAY_STATUS_ONE_GPU_SHORT)
    assert caught.value.stage == "ray"
    assert "2/2 nodes, 1/2 GPUs joined" in str(caught.value)
    # Nothing was asked of the server: Ray is the first stage and it never passed.
    assert server.requests == []


@pytest.mark.parametrize(
    ("nodes", "gpus", "passes"),
    [(2, 2.0, True), (2, 1.0, False), (1, 2.0, False), (3, 4.0, True)],
    ids=["exact", "one-gpu-short", "one-node-short", "more-than-declared"],
)
def test_check_ray_needs_every_node_and_every_gpu(nodes, gpus, passes):
    text = f"Active:\n {nodes} node_x\nResources\nUsage:\n 0.0/{gpus:g} GPU\n"
    if passes:
        assert readiness.check_ray(lambda: text, 2, 2.0).nodes == nodes
    else:
        with pytest.raises(readiness.NotReady, match=f"{nodes}/2 nodes, {gpus:g}/2 GPUs joined"):
            readiness.check_ray(lambda: text, 2, 2.0)


GATE_INPUTS = {**PROPS, "server_id": "c0ffee", "expect_node_ips": EXPECTED_IPS, "deadline_s": 3600}


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("expect_nodes", 3),
        ("expect_gpus", 3),
        ("expect_node_ips", {**EXPECTED_IPS, "spark-3": "192.168.200.14"}),
        ("server_id", "deadbeef"),
        ("url", "http://127.0.0.1:8001"),
        ("model", "other"),
        ("ray_container", "other-ray-head"),
        ("log_container", "other-vllm"),
        # A Ray worker created again behind a running server: probe again.
        ("container_ids", {"spark-2/qwen35-ray-worker": "new"}),
    ],
)
def test_gate_diff_probes_again_in_place_when_what_it_probes_changes(key, value):
    """In place (update), not a replacement: the update still sees what the gate last passed with."""
    from components.readiness_gate import ReadinessGateProvider

    diff = ReadinessGateProvider().diff("gate", GATE_INPUTS, {**GATE_INPUTS, key: value})
    assert diff.changes and not diff.replaces


def test_a_failed_probe_after_an_upgrade_says_how_to_go_back():
    from components.readiness_gate import rollback_hint

    before = {
        "image": "app:1",
        "revision": "a" * 40,
        "lines": {"image": "image.prebuilt: app:1", "revision": "model.revision: " + "a" * 40},
    }
    now = {**before, "image": "app:2", "lines": {}}
    assert rollback_hint(before, now) == (
        "to go back to what served before, set image.prebuilt: app:1 (now app:2) in the stack config "
        "and run `pulumi up` (the previous image is still on every node)"
    )
    assert rollback_hint(before, before) == ""
    assert rollback_hint(None, now) == ""


@pytest.mark.parametrize(
    ("key", "value"), [("api_key", "sk-new"), ("deadline_s", 60), ("node", {**PROPS["node"], "port": 2222})]
)
def test_gate_diff_updates_in_place_for_key_deadline_and_access(key, value):
    from components.readiness_gate import ReadinessGateProvider

    diff = ReadinessGateProvider().diff("gate", GATE_INPUTS, {**GATE_INPUTS, key: value})
    assert diff.changes and not diff.replaces


def test_gate_diff_of_unchanged_inputs_is_no_change():
    from components.readiness_gate import ReadinessGateProvider

    diff = ReadinessGateProvider().diff("gate", GATE_INPUTS, dict(GATE_INPUTS))
    assert not diff.changes and not diff.replaces


@pytest.mark.parametrize(
    ("change", "probes"),
    [
        ({"server_id": "deadbeef"}, True),
        ({"container_ids": {"spark-2/qwen35-ray-worker": "new"}}, True),
        ({"api_key": "sk-new"}, False),
        ({"deadline_s": 60}, False),
        ({"node": {**PROPS["node"], "port": 2222}}, False),
        ({"deployed": {"image": "app:2"}}, False),
    ],
)
def test_an_update_probes_again_only_when_what_it_probes_changed(change, probes):
    from components.readiness_gate.plan import plan_change, probes_again

    planned = plan_change(GATE_INPUTS, {**GATE_INPUTS, **change})
    assert planned.changes and not planned.replaces and probes_again(planned) is probes


@pytest.mark.parametrize(("deadline", "expected"), [(3600, 60), (20, 20), (None, 60), (0, 60)])
def test_refresh_waits_at_most_a_minute(deadline, expected):
    from components.readiness_gate.plan import refresh_deadline

    assert refresh_deadline({"deadline_s": deadline}) == expected


@pytest.mark.parametrize(
    ("exit_hint", "previous", "expected"),
    [
        ("fix it", None, "fix it"),
        ("", None, ""),
        ("fix it", {"image": "app:1", "lines": {"image": "image.prebuilt: app:1"}},
         "fix it; to go back to what served before, set image.prebuilt: app:1 (now app:2)"),
    ],
)  # fmt: skip
def test_a_failure_hint_says_what_the_exit_means_then_how_to_go_back(exit_hint, previous, expected):
    from components.readiness_gate.plan import failure_hint

    assert failure_hint(exit_hint, previous, {"image": "app:2"}).startswith(expected)
    assert bool(failure_hint(exit_hint, previous, {"image": "app:2"})) == bool(expected)


def test_gate_provider_pickles_by_reference_to_its_old_path():
    import pickle

    from components.readiness_gate import ReadinessGateProvider

    provider = pickle.loads(pickle.dumps(ReadinessGateProvider()))
    assert type(provider).__module__ == "components.readiness_gate" and vars(provider) == {}


class FakeClock:
    """A clock that moves only when the probe sleeps."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_a_long_wait_reports_its_stage_periodically(server):
    clock, lines = FakeClock(), []
    with pytest.raises(ReadinessError):
        wait_ready(
            server.url, 2, 2, MODEL, 100, "sk-test", ray_check=lambda: RAY_STATUS_V1_ONE_NODE,
            interval_s=5, clock=clock, sleep=clock.sleep, progress=lines.append, report_every_s=30,
        )  # fmt: skip
    # At the start, then every 30 s while the stage stays the same (not every 5 s poll).
    assert [line.split(" s at")[0] for line in lines] == [
        "waiting 0",
        "waiting 30",
        "waiting 60",
        "waiting 90",
    ]
    assert lines[0] == "waiting 0 s at stage 'ray': 1/2 nodes, 1/2 GPUs joined"


def test_a_new_stage_is_reported_at_once(server):
    clock, lines, answers = FakeClock(), [], iter([RAY_STATUS_V1_ONE_NODE] + [RAY_STATUS_V2] * 50)
    server.mode = "unhealthy"
    with pytest.raises(ReadinessError):
        wait_ready(
            server.url, 2, 2, MODEL, 20, "sk-test", ray_check=lambda: next(answers),
            interval_s=5, clock=clock, sleep=clock.sleep, progress=lines.append,
        )  # fmt: skip
    assert [line.split(": ")[0] for line in lines] == [
        "waiting 0 s at stage 'ray'",
        "waiting 5 s at stage 'health'",
    ]


def test_progress_file_is_written_for_status_and_removed_at_the_end(tmp_path, capsys):
    import json

    progress = readiness.ProgressFile("readiness", "spark-1", folder=str(tmp_path / "p"))
    progress.report("waiting 0 s at stage 'ray': 1/2 nodes")
    record = json.loads((tmp_path / "p" / "readiness.json").read_text())
    assert {k: record[k] for k in ("operation", "node", "stage", "bytes_done")} == {
        "operation": "readiness",
        "node": "spark-1",
        "stage": "waiting 0 s at stage 'ray': 1/2 nodes",
        "bytes_done": None,
    }
    assert record["pid"] == os.getpid() and record["updated_at"] >= record["started_at"]
    assert capsys.readouterr().err == "waiting 0 s at stage 'ray': 1/2 nodes\n"
    progress.remove()
    assert not (tmp_path / "p" / "readiness.json").exists()


def test_the_gate_relays_progress_lines_while_the_probe_still_runs():
    import sys
    import time

    from components.node_programs.wire import PROBE_PROGRESS_PREFIX
    from components.remote import lines_marked, run_relaying

    script = (
        "import sys, time\n"
        "print('waiting 0 s at stage \\'ray\\'', file=sys.stderr, flush=True)\n"
        "print('other noise', file=sys.stderr, flush=True)\n"
        "time.sleep(1.0)\n"
        "print(sys.stdin.read().upper())\n"
    )
    relayed = []
    started = time.monotonic()
    result = run_relaying(
        "spark-1", [sys.executable, "-c", script], ["probe"], b"report", 30,
        lines_marked(PROBE_PROGRESS_PREFIX, lambda line: relayed.append((line, time.monotonic() - started))),
    )  # fmt: skip
    finished = time.monotonic() - started
    assert result.ok and result.out == "REPORT"
    assert [line for line, _ in relayed] == ["waiting 0 s at stage 'ray'"]
    # Relayed as it came, not when the probe ended.
    assert relayed[0][1] < finished - 0.5
    assert "other noise" in result.err


def test_the_gate_gives_up_on_a_probe_past_its_timeout():
    import sys

    from components.remote import RemoteError, run_relaying

    with pytest.raises(RemoteError, match="timed out after 0.5 s"):
        run_relaying(
            "spark-1", [sys.executable, "-c", "import time; time.sleep(30)"], ["probe"], b"", 0.5, print
        )


def test_ensure_returns_the_gates_outputs_and_observe_none_once_it_no_longer_answers(monkeypatch):
    from components.readiness_gate import GateFailed, ensure, execute, observe

    asked = []

    def answering(props, deadline_s, previous=None):
        asked.append((deadline_s, previous))
        return {"completion_tokens": 2}

    monkeypatch.setattr(execute, "_probe", answering)
    props = {**PROPS, "deadline_s": 900}
    assert ensure(props, {"deployed": {"image": "app:1"}}) == {
        **props,
        "ready": True,
        "report": {"completion_tokens": 2},
        "serving_transport": {},  # no serving_logs given: nothing read
    }
    assert observe(props) == props
    assert asked == [(900.0, {"image": "app:1"}), (60, None)]  # refresh waits at most a minute

    def failing(props, deadline_s, previous=None):
        raise GateFailed("spark-1", ["python3", "-"], 1, "not ready", "")

    monkeypatch.setattr(execute, "_probe", failing)
    assert observe(props) is None
    with pytest.raises(GateFailed):
        ensure(props)
