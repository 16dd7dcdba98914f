"""vLLM's start-up memory rule (issue 41 item 4; components/node_programs/gpu_memory.py): the rule on
the probe's figures, the probe container's body, the probe program itself (run here against a small
fake torch and vLLM: what the image's would answer on a GB10), and the watchdog's decisions with it."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from components.node_programs import gpu_memory
from components.node_programs.watchdog_report import metrics_text
from components.node_programs.watchdog_world import Probe
from status.watchdog import _memory_held
from tests.support.standin_engine import StandinEngine
from tests.unit.test_watchdog import GB, HANG, Clock, FakeWorld, dog, ticks

GIB = 1 << 30
# A GB10 as the reading has it: CUDA reports the unified memory's total, and a free figure
# that leaves out the page cache; MemAvailable counts the cache.
TOTAL = 119 * GIB


def snapshot(free_gib: int, version: str = "0.17.1") -> dict:
    """A report with vLLM's own MemorySnapshot figures (free, and CUDA's total)."""
    return report(vllm=version, vllm_free_bytes=free_gib * GIB, vllm_total_bytes=TOTAL)


def report(**over) -> dict:
    base = {"python": "3.12.3", "torch": "2.11.0+cu130", "cuda": True, "device": "NVIDIA GB10",
            "capability": "12.1", "integrated": True, "cuda_free_bytes": 60 * GIB,
            "cuda_total_bytes": TOTAL}  # fmt: skip
    return {**base, **(over or {})}


@pytest.mark.parametrize(
    ("probe", "mem_available", "ok", "free_from", "page_cache"),
    [
        # vLLM's own snapshot (a release that reads MemAvailable on a UMA GPU): it is what is compared.
        (snapshot(110), 110 * GIB, True, "vllm", False),
        (snapshot(90), 90 * GIB, False, "vllm", False),
        # No vLLM figure (it did not import) on a unified-memory GPU: a release counts CUDA's free or
        # MemAvailable, so only both short is held.
        (report(vllm_error="ImportError: no vllm"), 110 * GIB, True, "cuda_or_memavailable", False),
        (report(vllm_error="ImportError: no vllm"), 95 * GIB, False, "cuda_or_memavailable", False),
        (report(cuda_free_bytes=105 * GIB), 90 * GIB, True, "cuda_or_memavailable", False),
        # A discrete GPU: CUDA's figure, whatever the host's MemAvailable (not the GPU's memory).
        (report(integrated=False), 110 * GIB, False, "cuda", False),
        (report(integrated=False, cuda_free_bytes=105 * GIB), 10 * GIB, True, "cuda", False),
        # A release whose snapshot keeps CUDA's figure on GB10 (vllm #35313): refused for page cache.
        (snapshot(60, "0.11.0"), 112 * GIB, False, "vllm", True),
    ],
)  # fmt: skip
def test_the_rule_compares_vllm_s_free_figure_with_utilization_times_total(
    probe, mem_available, ok, free_from, page_cache
):
    rule = gpu_memory.startup_rule(probe, 0.85, mem_available)
    assert rule["checked"] is True and rule["ok"] is ok
    assert rule["free_from"] == free_from and rule["page_cache"] is page_cache
    assert rule["requested_bytes"] == -(-TOTAL * 85 // 100)  # ceil, as vLLM's request_memory


@pytest.mark.parametrize(
    ("probe", "why"),
    [
        (None, "no report from the probe"),
        ({"python": "3.11.2", "error": "torch does not import: ModuleNotFoundError: No module named 'torch'"},
         "torch does not import"),
        ({"python": "3.11.2", "torch": "2.13.0+cpu", "cuda": False}, "(2.13.0+cpu) sees no CUDA device"),
    ],
)  # fmt: skip
def test_a_probe_that_cannot_judge_says_why_and_is_not_checked(probe, why):
    rule = gpu_memory.startup_rule(probe, 0.85, 100 * GB)
    assert rule["checked"] is False and why in rule["why"]


def test_the_message_names_both_figures_and_what_frees_the_page_cache():
    rule = gpu_memory.startup_rule(snapshot(60, "0.11.0"), 0.85, 110 * GIB)
    said = gpu_memory.rule_message("spark-2", rule)
    assert said.startswith("spark-2: vLLM would refuse to start: 64.4 GB free as vLLM counts it, below ")
    assert "0.85 × 127.8 GB = 108.6 GB (serve.gpu_memory_utilization)" in said
    assert "MemAvailable is 118.1 GB: the page cache holds the difference" in said
    assert gpu_memory.DROP_CACHES in said
    held = gpu_memory.rule_message("spark-2", gpu_memory.startup_rule(snapshot(60), 0.85, 70 * GIB))
    assert "something else holds the memory" in held and gpu_memory.DROP_CACHES not in held


def test_the_probe_container_has_the_server_s_gpu_and_nothing_else():
    template = {
        "Name": "/qwen35-vllm",
        "Image": "sha256:" + "a" * 64,
        "Config": {"Env": ["PATH=/opt/venv/bin:/usr/bin", "NCCL_SOCKET_IFNAME=enp1s0f0np0"], "User": ""},
        "HostConfig": {
            "Runtime": "nvidia",
            "DeviceRequests": [{"Driver": "", "Count": -1, "Capabilities": [["gpu"]]}],
            "Devices": [{"PathOnHost": "/dev/infiniband", "PathInContainer": "/dev/infiniband"}],
            "Binds": ["/models:/models:ro"],
            "NetworkMode": "host",
            "PortBindings": {"8000/tcp": [{"HostPort": "8000"}]},
            "RestartPolicy": {"Name": "unless-stopped"},
            "IpcMode": "host",
        },
    }
    body = gpu_memory.probe_body(template)
    assert body["Image"] == template["Image"] and body["Entrypoint"] == ["python3", "-c"]
    assert body["Cmd"] == [gpu_memory.PROBE] and body["Env"] == template["Config"]["Env"]
    assert body["Labels"] == {gpu_memory.PROBE_LABEL: "qwen35-vllm"} and body["NetworkDisabled"] is True
    assert body["HostConfig"] == {
        "Runtime": "nvidia",
        "DeviceRequests": template["HostConfig"]["DeviceRequests"],
        "Devices": template["HostConfig"]["Devices"],
        "NetworkMode": "none",
        "RestartPolicy": {"Name": "no"},
    }


FAKE_TORCH = """
__version__ = "2.11.0+cu130"
class _Props:
    name, major, minor, is_integrated = "NVIDIA GB10", 12, 1, True
class cuda:
    @staticmethod
    def is_available(): return True
    @staticmethod
    def get_device_properties(i): return _Props()
    @staticmethod
    def mem_get_info(i): return (60 * 2**30, 119 * 2**30)
def device(kind, index): return (kind, index)
"""
FAKE_SNAPSHOT_NEW = """
class MemorySnapshot:
    def __init__(self, device=None):
        assert device == ("cuda", 0)
        self.free_memory, self.total_memory = 111 * 2**30, 119 * 2**30
"""
FAKE_SNAPSHOT_OLD = """
class MemorySnapshot:
    def __init__(self):
        self.free_memory, self.total_memory = 61 * 2**30, 119 * 2**30
"""


def run_probe_program(tmp_path: Path, vllm: dict[str, str] | None) -> dict:
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text(FAKE_TORCH)
    for rel, text in (vllm or {}).items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    done = subprocess.run(
        [sys.executable, "-c", gpu_memory.PROBE],
        capture_output=True, text=True, timeout=60, env={"PYTHONPATH": str(tmp_path)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    found = gpu_memory.last_report(done.stdout.splitlines())
    assert found is not None, done.stdout
    return found


@pytest.mark.parametrize(
    ("vllm", "expect"),
    [
        # vLLM ≥ 0.10: vllm.utils.mem_utils, MemorySnapshot(device=…)
        ({"vllm/__init__.py": "__version__ = '0.17.1'\n", "vllm/utils/__init__.py": "",
          "vllm/utils/mem_utils.py": FAKE_SNAPSHOT_NEW},
         {"vllm": "0.17.1", "vllm_free_bytes": 111 * GIB, "vllm_total_bytes": 119 * GIB}),
        # an older layout: vllm.utils.MemorySnapshot(), no device argument
        ({"vllm/__init__.py": "__version__ = '0.9.2'\n", "vllm/utils/__init__.py": FAKE_SNAPSHOT_OLD},
         {"vllm": "0.9.2", "vllm_free_bytes": 61 * GIB, "vllm_total_bytes": 119 * GIB}),
        (None, {"vllm_error": "ModuleNotFoundError: No module named 'vllm'"}),
    ],
)  # fmt: skip
def test_the_probe_program_reports_torch_s_and_vllm_s_own_figures(tmp_path, vllm, expect):
    found = run_probe_program(tmp_path, vllm)
    assert found["torch"] == "2.11.0+cu130" and found["cuda"] is True and found["capability"] == "12.1"
    assert found["cuda_free_bytes"] == 60 * GIB and found["cuda_total_bytes"] == 119 * GIB
    assert found["integrated"] is True and found["device"] == "NVIDIA GB10"
    assert {key: found.get(key) for key in expect} == expect


def test_the_probe_program_without_torch_says_so():
    # -S: no site packages, so no torch whatever this machine has.
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-c", gpu_memory.PROBE], capture_output=True, text=True, timeout=60
    )
    found = gpu_memory.last_report(done.stdout.splitlines())
    assert done.returncode == 0 and found is not None, done
    assert found["error"].startswith("torch does not import: ModuleNotFoundError"), found
    assert gpu_memory.startup_rule(found, 0.85, GB)["checked"] is False


def test_only_the_marked_line_is_the_report():
    lines = [
        '{"level": "info", "msg": "a library logs JSON"}',
        gpu_memory.MARKER + '{"cuda": false}',
        '{"x": 1}',
    ]
    assert gpu_memory.last_report(lines) == {"cuda": False}
    assert gpu_memory.last_report(lines[:1]) is None
    assert gpu_memory.last_report([gpu_memory.MARKER + "not json"]) is None


# ---- the watchdog with the rule ------------------------------------------------------------------------


class ProbedWorld(FakeWorld):
    """FakeWorld whose nodes answer the memory probe from `reports` (the last one stays)."""

    def __init__(self, clock: Clock, reports: dict[str, list[dict]]) -> None:
        super().__init__(clock)
        self.reports = reports
        self.probed: list[tuple[str, float]] = []

    def memory_probe(self, node: str) -> dict:
        self.probed.append((node, self.clock.now))
        queue = self.reports[node]
        found = queue.pop(0) if len(queue) > 1 else queue[0]
        return {"report": found, "error": None, "took_s": 4.2}


def hung(world: FakeWorld) -> None:
    world.health, world.default = [Probe(True, 0.1)], HANG


def test_a_node_vllm_would_refuse_holds_the_restart_and_says_page_cache():
    """MemAvailable passes the fit; the image's vLLM counts CUDA's free figure and would refuse: the
    watchdog holds the restart (today it started the server into vLLM's ValueError, again and again)."""
    clock = Clock()
    world = ProbedWorld(clock, {"spark-1": [snapshot(110)], "spark-2": [snapshot(60)]})
    world.memory = {"spark-1": 112 * GIB, "spark-2": 112 * GIB}
    hung(world)
    watchdog, _ = dog(world, clock, need={"spark-1": 70 * GB, "spark-2": 70 * GB}, memory_wait_s=30)
    ticks(watchdog, clock, 4)
    state = watchdog.snapshot()
    assert state["step"] == "memory_wait" and "(vLLM's start-up rule)" in state["next_step"]
    ticks(watchdog, clock, 4)
    state = watchdog.snapshot()
    assert state["state"] == "memory_held" and world.actions == [("stop", "spark-1", "qwen35-vllm")]
    held = state["held"]
    assert held["node"] == "spark-2" and held["rule"]["page_cache"] is True
    assert held["message"].startswith("spark-2: vLLM would refuse to start: 64.4 GB free as vLLM counts it")
    assert gpu_memory.DROP_CACHES in held["message"]
    assert state["memory_rule"]["spark-1"]["ok"] is True and state["memory_rule"]["spark-2"]["ok"] is False
    # spark-1 passed once and was not asked again; spark-2 again every RULE_RETRY_S within the wait.
    assert [n for n, _ in world.probed].count("spark-1") == 1
    times = [at for n, at in world.probed if n == "spark-2"]
    assert len(times) == 2 and times[1] - times[0] >= 15
    text = metrics_text(state)
    assert f'qwen35_health_memory_rule_free_bytes{{node="spark-2"}} {60 * GIB}' in text
    assert f'qwen35_health_memory_rule_requested_bytes{{node="spark-2"}} {-(-TOTAL * 85 // 100)}' in text
    cluster: dict = {}
    problems = _memory_held(cluster, held)
    assert problems[0].node == "spark-2" and gpu_memory.DROP_CACHES in problems[0].next
    assert cluster["watchdog"] == (
        "memory held on spark-2: 64 GB free as vLLM counts it, 109 GB vLLM requests "
        "(gpu_memory_utilization 0.85)"
    )


def test_a_refused_node_freed_within_the_wait_lets_the_restart_go_on():
    clock = Clock()
    world = ProbedWorld(clock, {"spark-1": [snapshot(110)], "spark-2": [snapshot(60), snapshot(110)]})
    world.memory = {"spark-1": 112 * GIB, "spark-2": 112 * GIB}
    hung(world)
    watchdog, _ = dog(world, clock, need={"spark-1": 70 * GB, "spark-2": 70 * GB}, memory_wait_s=60)
    ticks(watchdog, clock, 4)
    assert not [a for a in world.actions if a[0] == "start"]
    ticks(watchdog, clock, 2)  # 20 s on: spark-2 probed again, its cache dropped by an operator
    starts = [a for a in world.actions if a[0] == "start"]
    assert starts and watchdog.snapshot()["memory_rule"]["spark-2"]["ok"] is True


def test_a_probe_that_cannot_judge_never_holds_a_restart():
    clock = Clock()
    cpu = {"python": "3.11.2", "torch": "2.13.0+cpu", "cuda": False}
    world = ProbedWorld(clock, {"spark-1": [cpu], "spark-2": [cpu]})
    hung(world)
    watchdog, _ = dog(world, clock, need={"spark-1": 70 * GB, "spark-2": 70 * GB})
    ticks(watchdog, clock, 5)
    assert [a for a in world.actions if a[0] == "start"]
    rules = watchdog.snapshot()["memory_rule"]
    assert set(rules) == {"spark-1", "spark-2"} and all(r["checked"] is False for r in rules.values())
    assert "sees no CUDA device" in rules["spark-2"]["why"]


# ---- run_probe against a stand-in Docker Engine on a unix socket ---------------------------------------


TEMPLATE = {
    "Name": "/qwen35-vllm",
    "Image": "sha256:" + "b" * 64,
    "Config": {"Env": ["A=1"]},
    "HostConfig": {},
}
PROBE_C = "/containers/qwen35-vllm-memory-probe"


def frame(text: str) -> bytes:
    """One stdout frame of Docker's multiplexed log stream."""
    data = text.encode()
    return b"\x01\x00\x00\x00" + len(data).to_bytes(4, "big") + data


def routes(over: dict | None = None) -> dict:
    base = {
        ("GET", "/containers/qwen35-vllm/json"): (200, json.dumps(TEMPLATE).encode()),
        ("DELETE", PROBE_C): (204, b""),
        ("POST", "/containers/create"): (201, b'{"Id": "p1"}'),
        ("POST", f"{PROBE_C}/start"): (204, b""),
        ("POST", f"{PROBE_C}/wait"): (200, b'{"StatusCode": 0}'),
        ("GET", f"{PROBE_C}/logs"): (
            200,
            frame("importing torch\n" + gpu_memory.MARKER + '{"cuda": false}\n'),
        ),
    }
    return {**base, **(over or {})}


@pytest.fixture
def engine(tmp_path):
    made: list[StandinEngine] = []

    def start(over: dict | None = None) -> tuple[str, StandinEngine]:
        folder = tmp_path / str(len(made))
        folder.mkdir()
        made.append(StandinEngine(folder))
        made[-1].routes.update(routes(over))
        return made[-1].path, made[-1]

    yield start
    for each in made:
        each.close()


def asked(engine: StandinEngine) -> list[tuple[str, str]]:
    """The requests the engine answered, as (method, path without its query)."""
    return [(method, url.partition("?")[0]) for method, url in (r.split(" ", 1) for r in engine.requests)]


def test_a_probe_creates_runs_reads_and_removes_its_container(engine):
    created: list[dict] = []

    def create(body: bytes):
        created.append(json.loads(body))
        return 201, b'{"Id": "p1"}'

    path, fake = engine({("POST", "/containers/create"): create})
    done = gpu_memory.run_probe(path, "qwen35-vllm", 30)
    assert done["error"] is None and done["report"] == {"cuda": False}
    assert created[0]["Image"] == TEMPLATE["Image"] and created[0]["Env"] == ["A=1"]
    assert [m for m, _ in asked(fake)] == ["GET", "DELETE", "POST", "POST", "POST", "GET", "DELETE"]
    assert asked(fake)[-1] == ("DELETE", PROBE_C)


@pytest.mark.parametrize(
    ("over", "said", "removed"),
    [
        ({("GET", "/containers/qwen35-vllm/json"): (404, b'{"message": "No such container"}')},
         "cannot inspect qwen35-vllm: the daemon answered 404", False),
        ({("POST", "/containers/create"): (500, b'{"message": "unknown runtime: nvidia"}')},
         "cannot create qwen35-vllm-memory-probe: unknown runtime: nvidia", False),
        ({("POST", f"{PROBE_C}/start"): (500, b'{"message": "could not select device driver"}')},
         "cannot start qwen35-vllm-memory-probe: could not select device driver", True),
        ({("GET", f"{PROBE_C}/logs"): (200, frame("Traceback (most recent call last):\nSegfault\n"))},
         "exited 0 without a report (its last lines: the watchdog's log)", True),
    ],
    ids=["no-template", "create-refused", "start-refused", "no-report"],
)  # fmt: skip
def test_a_probe_that_fails_says_where_and_leaves_no_container(engine, over, said, removed):
    path, fake = engine(over)
    done = gpu_memory.run_probe(path, "qwen35-vllm", 30)
    assert done["report"] is None and said in done["error"], done
    # The container's own output is never in the error (it reaches /state): it is `output`, logged.
    assert "Traceback" not in done["error"]
    assert done.get("output") == (
        "Traceback (most recent call last): | Segfault" if "report" in said else None
    )
    requests = asked(fake)
    assert (requests[-1] == ("DELETE", PROBE_C) and requests.count(("DELETE", PROBE_C)) == 2) is removed


def test_a_probe_that_hangs_is_cut_at_its_bound_and_still_removed(engine):
    import time as clock

    def hang(body: bytes):
        clock.sleep(5)
        return 200, b'{"StatusCode": 0}'

    path, fake = engine({("POST", f"{PROBE_C}/wait"): hang})
    started = clock.monotonic()
    done = gpu_memory.run_probe(path, "qwen35-vllm", 1.5)
    assert clock.monotonic() - started < 4
    assert done["error"] == "qwen35-vllm-memory-probe did not finish within 1.5 s", done
    assert asked(fake)[-1] == ("DELETE", PROBE_C)
