"""The watchdog and its agent for real: the programs in containers started from their
specs (components/health/containers.py) on node-a (head) and node-b, watching the stand-in vLLM under
executor mp (a head rank and a headless rank, no Ray), with a prefix of their own, `enforce`, small
intervals and crafted meminfo files. Faults come from the stand-in (lab/standin_vllm.py FAULT_PATH)."""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import lab
from components.health.containers import watchdog_container_name
from components.node_programs import gpu_memory, health_wire
from status.watchdog import _guard_trips, judge_watchdog
from tests.lab.test_mp_standin import standin_image
from tests.support.health_lab import (
    DEADLINE,
    FAILURES,
    GB,
    INTERVAL,
    MEMINFO,
    Stack,
    free_ports,
    http,
    wait_for,
)

pytestmark = pytest.mark.lab


@pytest.fixture(scope="module")
def images(node_a, node_b) -> dict[str, str]:
    """The lab's Debian with the stand-in as `vllm` (and python3 for the watchdog and the agent)."""
    found = {node.name: standin_image(node) for node in (node_a, node_b)}
    python = lab.docker(node_a, "run", "--rm", "--entrypoint", "python3", found["node-a"], "-c", "print(1)")
    assert python.out.strip() == "1"
    return found


@pytest.fixture
def stack(node_a, node_b, images, request) -> Iterator[Stack]:
    marker = request.node.get_closest_marker("health")
    built = Stack(node_a, node_b, images, **(marker.kwargs if marker else {}))
    try:
        yield built
    finally:
        built.remove()


def signed(
    secret: str, path: str, body: dict, node: str = "node-b", nonce: str | None = None
) -> tuple[bytes, dict]:
    """A request signed for `node`'s agent (the stack's agent runs on node-b)."""
    data = json.dumps(body).encode()
    return data, health_wire.signed_headers(secret, "POST", path, data, time.time(), node=node, nonce=nonce)


def refused_with(url: str, data: bytes, headers: dict) -> int:
    request = urllib.request.Request(url, data, {"Content-Type": "application/json", **headers})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    return refused.value.code


def test_an_agent_refuses_a_restart_without_or_with_a_wrong_secret_and_changes_nothing(stack):
    stack.start_ranks()
    stack.start_agent()
    before = stack.inspect("node-b", stack.rank)
    url = f"{stack.agent_url}{health_wire.AGENT_RESTART}"
    body = {"name": stack.rank}
    assert http(url, body)[0] == 401
    data, headers = signed("not-the-secret", health_wire.AGENT_RESTART, body)
    request = urllib.request.Request(url, data, {"Content-Type": "application/json", **headers})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    assert refused.value.code == 401
    # Signed, but not one of this stack's containers: refused too (the agent acts on its own only).
    data, headers = signed(stack.secret, health_wire.AGENT_STOP, {"name": "qwen35-vllm-rank1"})
    request = urllib.request.Request(f"{stack.agent_url}{health_wire.AGENT_STOP}", data, headers)
    with pytest.raises(urllib.error.HTTPError) as other:
        urllib.request.urlopen(request, timeout=10)
    assert other.value.code == 403
    time.sleep(1)
    assert stack.inspect("node-b", stack.rank) == before, "a refused request changed the container"
    metrics = http(f"{stack.agent_url}/metrics")[1].decode()
    assert 'qwen35_health_agent_refusals_total{node="node-b"} 2' in metrics, metrics
    assert 'qwen35_health_agent_actions_total{node="node-b"} 0' in metrics, metrics
    # The same agent does act for the watchdog's secret: the refusals were the signature's doing.
    data, headers = signed(stack.secret, health_wire.AGENT_CONTAINERS, {})
    request = urllib.request.Request(f"{stack.agent_url}{health_wire.AGENT_CONTAINERS}", data, headers)
    with urllib.request.urlopen(request, timeout=10) as answer:
        (found,) = json.loads(answer.read())["containers"]
    assert found["name"] == stack.rank and found["state"] == "running"


def test_an_agent_refuses_a_replayed_request_and_one_signed_for_another_node(stack):
    stack.start_ranks()
    stack.start_agent()
    url = f"{stack.agent_url}{health_wire.AGENT_CONTAINERS}"
    data, headers = signed(stack.secret, health_wire.AGENT_CONTAINERS, {}, nonce="ab" * 16)
    request = urllib.request.Request(url, data, {"Content-Type": "application/json", **headers})
    with urllib.request.urlopen(request, timeout=10) as answer:
        assert answer.status == 200
    # The same bytes again, within the time window: a replay.
    assert refused_with(url, data, headers) == 401
    # Signed with the right secret, for node-a's agent: not this agent's request.
    data, headers = signed(stack.secret, health_wire.AGENT_CONTAINERS, {}, node="node-a")
    assert refused_with(url, data, headers) == 401


def test_a_hang_is_detected_in_time_and_the_world_is_restarted(stack):
    """Under executor mp a rank restarted alone would find the others in the old world: the hang
    restarts every rank, the headless one too."""
    stack.up(rejoin=True)
    rank_before = stack.inspect("node-b", stack.rank)
    server_before = stack.inspect("node-a", stack.server)
    at = stack.fault("hang")
    assert stack.inspect("node-a", stack.server)[0] == "running"  # Docker sees nothing wrong
    state = stack.wait_state(lambda s: s["state"] == "healthy" and s["restarts"], 60, "not recovered")
    (restart,) = state["restarts"]
    assert (restart["step"], restart["reason"]) == ("restart_cluster", "hang"), restart
    detected = state["last_diagnosis"]["at"] - at
    # The hang begins 0.2 s after the request; each probe starts within an interval of the last.
    assert detected <= INTERVAL * FAILURES + DEADLINE + 0.5, f"detected after {detected:.2f} s"
    assert stack.inspect("node-b", stack.rank)[1] != rank_before[1], "the headless rank was left alone"
    assert stack.inspect("node-a", stack.server)[1] != server_before[1]
    print(f"\nhang detected after {detected:.2f} s; ready {state['last_ready'] - at:.2f} s after the hang")


def test_a_crashed_head_restarts_the_world_the_headless_rank_first(stack):
    # Without rejoin the headless rank exits with its head, as vLLM's does: the head alone cannot
    # come back, so the first recovery is already the world's (no server-only step under mp).
    stack.up(rejoin=False)
    rank_before = stack.inspect("node-b", stack.rank)
    stack.fault("crash")
    state = stack.wait_state(lambda s: s["state"] == "healthy" and s["restarts"], 60, "no world restart")
    assert [(r["step"], r["reason"]) for r in state["restarts"]] == [("restart_cluster", "down")], state
    status, started = stack.inspect("node-b", stack.rank)
    assert status == "running" and started != rank_before[1], "the agent did not restart the rank"
    # Before the start, vLLM's start-up rule was asked of each node's image (issue 41 item 4): the
    # head's by the watchdog through its socket, node-b's by its agent. The stand-in image has no
    # torch: the probe says so, the rule is not checked, the restart went on; no probe is left.
    rules = state["memory_rule"]
    assert set(rules) == {"node-a", "node-b"}, rules
    for node, rule in rules.items():
        assert rule["checked"] is False and rule["why"].startswith("torch does not import"), (node, rule)
        left = stack.docker(node, "ps", "-a", "--filter", "label=qwen35.memory-probe", "-q").out.strip()
        assert left == "", f"a probe container left on {node}"


@pytest.mark.health(max_restarts=1)
def test_a_spent_budget_stops_everything_says_why_and_survives_the_watchdog_s_replacement(stack):
    stack.up(rejoin=True)
    stack.fault("crash")
    stack.wait_state(lambda s: s["state"] == "healthy" and s["restarts"], 40, "first restart missing")
    stack.fault("crash")
    state = stack.wait_state(lambda s: s["state"] == "budget_spent", 30, "budget never spent")
    assert "1 restarts in 3600 s spent" in state["spent"]["why"], state["spent"]
    assert state["budget_left"] == 0 and "pulumi up --refresh" in state["next_step"]
    assert stack.inspect("node-a", stack.server)[0] == "exited"
    assert stack.inspect("node-b", stack.rank)[0] == "exited"
    # An upgrade replaces the watchdog's container: the spent budget is in its volume, nothing restarts.
    stack.docker("node-a", "rm", "--force", watchdog_container_name(stack.cfg))
    stack.start_watchdog()
    time.sleep(3 * INTERVAL)
    again = stack.wait_state(lambda s: s["state"] == "budget_spent", 10, "the new watchdog forgot")
    assert again["spent"] == state["spent"]
    assert stack.inspect("node-a", stack.server)[0] == "exited"
    # The operator starts them again: the watchdog sees it, resets its budget and records that.
    stack.docker("node-b", "start", stack.rank)
    stack.docker("node-a", "start", stack.server)
    reset = stack.wait_state(lambda s: s["state"] == "healthy", 40, "no reset after the operator's start")
    assert reset["spent"] is None and reset["budget_left"] == 1
    assert reset["budget_resets"] and "run again" in reset["budget_resets"][-1]["why"]


def test_a_slow_stop_by_someone_else_spends_nothing_and_is_not_started_again(stack):
    """Issue 53 item 4 against the lab's dockerd: `pulumi up` deletes a container by stopping it with
    its 120 s grace; this server traps that SIGTERM, closes its port and exits 45 s later, reading
    `running` meanwhile. The watchdog did not send that SIGTERM (Docker's `kill` event says someone
    did): it stands back, spends no budget and never starts the container itself; once the container
    is started again (as `up --refresh` or an operator would), it gives it a fresh grace."""
    stack.up(rejoin=True)
    stack.fault("slow_stop", stop_s=45)
    stopped: dict = {}

    def stop() -> None:
        started = time.monotonic()
        stopped["result"] = stack.docker("node-a", "stop", "--time", "120", stack.server)
        stopped["took_s"] = time.monotonic() - started

    stopper = threading.Thread(target=stop, daemon=True)
    stopper.start()
    state = stack.wait_state(
        lambda s: [e["name"] for e in s.get("standing_back") or []] == [stack.server], 15, "never stood back"
    )
    assert state["state"] == "starting" and stack.server in state["next_step"], state["next_step"]
    assert stack.inspect("node-a", stack.server)[0] == "running"  # draining, its port closed
    stopper.join(120)
    assert stopped.get("took_s", 0) >= 40, stopped  # the SIGTERM was trapped: it drained 45 s
    assert stack.inspect("node-a", stack.server)[0] == "exited", "the watchdog started it again"
    state = stack.state()
    assert state["restarts"] == [] and state["budget_left"] == 3 and state["standing_back"], state
    started = stack.docker("node-a", "start", stack.server)  # within the stop timeout plus a minute
    assert started.out.strip() == stack.server
    state = stack.wait_state(lambda s: s["state"] == "healthy", 60, "not healthy after the start")
    assert state["restarts"] == [] and state["budget_left"] == 3, state
    assert [s["how"] for s in state["stand_backs"]] == ["start"] and state["stand_backs_total"] == 1
    log = stack.docker("node-a", "logs", watchdog_container_name(stack.cfg)).out
    assert f"start {stack.server} on node-a" not in log, "the watchdog started the server itself"
    assert f"{stack.server} on node-a was sent SIGTERM by someone else" in log, log[-3000:]


@pytest.fixture(scope="module")
def real_vllm_image(node_a) -> str:
    """The real-vLLM lab image on node-a (lab/vllm_cpu_image.py; loaded from its cache)."""
    from lab.vllm_cpu_image import vllm_cpu_image

    return vllm_cpu_image(node_a)[1]


def test_the_memory_probe_asks_the_real_vllm_image_s_own_torch(node_a, real_vllm_image):
    """vLLM's start-up rule's probe (issue 41 item 4) run for real beside a container of the lab's
    vLLM image, with its environment: the image's own torch answers. The lab has no GPU, so it sees
    no CUDA device and the rule is not checked (the GPU side is tests/unit/test_gpu_memory.py's).
    The probe container is gone afterwards."""
    template = f"qwen35-probe-template-{uuid.uuid4().hex[:8]}"
    lab.docker(node_a, "create", "--name", template, "--entrypoint", "true", real_vllm_image)
    try:
        done = gpu_memory.run_probe(node_a.docker_host.removeprefix("unix://"), template, 120)
    finally:
        lab.docker(node_a, "rm", "-f", template)
    assert done["error"] is None, done
    report = done["report"]
    # PyPI's torch for vLLM 0.32.0 is a CUDA build (cu130): on a node without a GPU it finds none.
    assert report["torch"].startswith("2.13.0") and report["cuda"] is False, report
    assert report["python"].startswith("3.11"), report
    rule = gpu_memory.startup_rule(report, 0.85, 100 * GB)
    assert rule["checked"] is False and "sees no CUDA device" in rule["why"], rule
    left = lab.docker(node_a, "ps", "-a", "--filter", f"name={gpu_memory.probe_name(template)}", "-q")
    assert left.out.strip() == ""


def test_memavailable_below_the_need_blocks_the_restart(stack):
    need = {"node-a": 70 * GB, "node-b": None}
    # 100 GB free; every start of the head leaks 20 GB: 80 after the first, 60 after the restart.
    stack.up(rejoin=True, leak_gb=20, need=need)
    stack.fault("crash")
    stack.wait_state(lambda s: s["state"] == "healthy" and s["restarts"], 40, "first restart missing")
    stack.fault("crash")
    state = stack.wait_state(lambda s: s["state"] == "memory_held", 30, "memory never held")
    assert (
        state["held"]["message"]
        == "node-a: MemAvailable 60 GB, 70 GB needed: unified memory is held; reboot node-a"
    )
    assert len(state["restarts"]) == 1
    time.sleep(2 * INTERVAL)
    assert stack.inspect("node-a", stack.server)[0] == "exited", "restarted despite the held memory"
    metrics = http(f"{stack.watchdog_url}/metrics")[1].decode()
    assert f'qwen35_health_mem_available_bytes{{node="node-a"}} {60 * GB}' in metrics, metrics


@pytest.mark.health(memory_floor_gb=2, memory_floor_s=2)
def test_the_memory_guard_stops_the_rank_below_the_floor_once_and_status_says_why(stack):
    stack.up(rejoin=True)
    before = stack.inspect("node-b", stack.rank)[1]
    # node-b's MemAvailable falls to 1.5 GB and stays there: the guard stops its rank once (it re-arms
    # only when memory is back above the floor), and the watchdog restarts the world for it, once.
    stack.meminfo["node-b"].write_text(MEMINFO.format(kb=int(1.5 * GB) // 1024))
    tripped = stack.wait_state(lambda s: "node-b" in (s.get("memory_guard") or {}), 30, "no guard trip")
    trip = tripped["memory_guard"]["node-b"]
    assert trip["acted"] is True and stack.rank in trip["stopped"], trip
    assert trip["message"].startswith("node-b: MemAvailable 1.5 GB below the memory floor 2.0 GB"), trip
    state = stack.wait_state(
        lambda s: s["state"] == "healthy" and s["restarts"], 60, "no world restart for the trip"
    )
    assert [r["reason"] for r in state["restarts"]] == ["memory_floor"], state["restarts"]
    assert stack.inspect("node-b", stack.rank)[1] != before, "the rank was not started again"
    time.sleep(4 * INTERVAL)  # still below the floor: no second trip, no second restart
    again = stack.state()
    assert [r["reason"] for r in again["restarts"]] == ["memory_floor"], again["restarts"]
    assert stack.inspect("node-b", stack.rank)[0] == "running"
    agent = http(f"{stack.agent_url}/metrics")[1].decode()
    assert 'qwen35_health_agent_memory_guard_trips_total{node="node-b"} 1' in agent, agent
    watchdog = http(f"{stack.watchdog_url}/metrics")[1].decode()
    assert 'restarts_total{reason="memory_floor"} 1' in watchdog, watchdog
    (problem,) = _guard_trips(stack.cfg, again, time.time())  # status's problem line for the trip
    assert problem.node == "node-b" and "the memory guard stopped the serving containers" in problem.what
    assert trip["message"] in problem.what and "health.memory_floor_gb" in problem.next, problem


def oom_events(state: dict, name: str) -> list[dict]:
    """The `oom` events of container `name` the watchdog's last diagnosis holds."""
    return [e for e in (state.get("last_diagnosis") or {}).get("docker_oom") or [] if e.get("name") == name]


@pytest.mark.health(max_restarts=1)
def test_real_oom_kills_in_a_child_then_in_the_server_are_named_memory_in_the_diagnosis_and_status(stack):
    """Issue 53 item 3 with the kernel's own OOM killer: the head rank runs under `--memory 160m` (the
    lab has no swap). First a child of the server (as vLLM's engine core under its API server) takes
    512 MB and is killed; the container runs on until the server, its engine core gone, exits 1: only
    Docker's `oom` event says memory. Then the server process itself: the container ends with 137."""
    stack.up(rejoin=False, memory={"node-a": "160m"})
    stack.fault("oom", bytes=512 << 20, child=True)
    state = stack.wait_state(
        lambda s: s["state"] == "healthy" and s["restarts"], 90, "no restart after the OOM"
    )
    assert [r["step"] for r in state["restarts"]] == ["restart_cluster"], state["restarts"]
    fault = state["last_diagnosis"]["fault"]
    assert fault and fault["kind"] == "memory", state["last_diagnosis"]
    assert (
        f"node-a: Docker's oom event: the kernel's OOM killer killed a process in {stack.server}"
        in fault["says"]
    )
    assert oom_events(state, stack.server), state["last_diagnosis"]
    # The server itself now: its restart budget (1) is spent, and status names the memory fault.
    stack.fault("oom", bytes=512 << 20)
    spent = stack.wait_state(lambda s: s["state"] == "budget_spent", 60, "the OOM-killed server was not seen")
    assert (
        stack.docker("node-a", "inspect", "--format", "{{.State.ExitCode}}", stack.server).out.strip()
        == "137"
    )
    fault = spent["last_diagnosis"]["fault"]
    assert fault and fault["kind"] == "memory" and stack.server in fault["says"], spent["last_diagnosis"]
    cluster: dict = {}
    head_report = {
        "reachable": True,
        "watchdog": {"state": spent},
        "containers": {watchdog_container_name(stack.cfg): {"present": True, "state": "running"}},
        "now": time.time(),
    }
    problems = judge_watchdog(stack.cfg, cluster, head_report)
    assert cluster["watchdog"].endswith("; memory fault"), cluster
    named = [p for p in problems if "names a memory fault" in p.what]
    assert named and stack.server in named[0].what and "gpu_memory_utilization" in named[0].next, problems


@pytest.mark.health(completion_every=1)
def test_a_slow_server_is_never_restarted_and_prometheus_scrapes_the_targets(stack, tmp_path):
    stack.up(rejoin=True)
    # /health within its deadline, every completion (each probe's) 2 s: slow, but it answers.
    stack.fault("slow", delay_s=2.0, health_delay_s=DEADLINE / 2)
    prometheus = start_prometheus(stack, tmp_path)
    try:
        time.sleep(10)
        state = stack.state()
        assert state["state"] == "healthy" and not state["restarts"], state
        assert state["consecutive_failures"] == 0 and state["last_ttft_s"] >= 2.0, state
        query = f"{prometheus}/api/v1/query?query="
        wait_for(lambda: len(up_targets(query)) == 2, 30, lambda: f"targets not up: {http(query + 'up')}")
        status, body = http(query + "qwen35_health_completion_ttft_seconds")
        (sample,) = json.loads(body)["data"]["result"]
        assert float(sample["value"][1]) >= 2.0
    finally:
        if stack.prometheus is not None:
            stack.prometheus.terminate()
            stack.prometheus.wait(timeout=10)


def up_targets(query: str) -> list[str]:
    status, body = http(query + "up")
    if status != 200:
        return []
    return [r["metric"]["instance"] for r in json.loads(body)["data"]["result"] if r["value"][1] == "1"]


def start_prometheus(stack: Stack, folder: Path) -> str:
    """Debian's prometheus on a free loopback port, scraping the file_sd targets every second."""
    binary = shutil.which("prometheus")
    assert binary, "prometheus is not installed: `make setup` (LAB_DEBS) installs Debian's package"
    (port,) = free_ports(1, ("127.0.0.1",))
    targets = [
        {"targets": [stack.watchdog_url.removeprefix("http://")], "labels": {"job": "qwen35-watchdog"}},
        {"targets": [stack.vllm_url.removeprefix("http://")], "labels": {"job": "vllm"}},
    ]
    (folder / "targets.json").write_text(json.dumps(targets))
    (folder / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s, scrape_timeout: 1s}\n"
        "scrape_configs:\n"
        "  - job_name: qwen35\n"
        f"    file_sd_configs: [{{files: ['{folder / 'targets.json'}'], refresh_interval: 1s}}]\n"
    )
    with open(folder / "prometheus.log", "w") as log:
        stack.prometheus = subprocess.Popen(
            [binary, f"--config.file={folder / 'prometheus.yml'}", f"--storage.tsdb.path={folder / 'data'}",
             f"--web.listen-address=127.0.0.1:{port}"],
            stdout=subprocess.DEVNULL, stderr=log,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    wait_for(
        lambda: http(f"{url}/-/ready")[0] == 200, 30, lambda: (folder / "prometheus.log").read_text()[-2000:]
    )
    return url
