"""The node proof's pure parts and its orchestration with stand-in transports: what each node runs,
the verdict on real NCCL lines, and what enforce and report do with it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from components.config import parse_stack_config
from components.layout import claimed_ports, node_proof_inputs
from components.nccl import parse_nccl_log
from components.node_programs.health_wire import mem_available
from components.node_proof import (
    NodeProofError,
    ensure,
    failed_steps,
    judged,
    plan_change,
    proof_argv,
    proof_spec,
    validate,
)
from components.remote import RemoteError, Result
from status.fabric import proof_line
from tests.support.program import dev_raw

LOGS = Path(__file__).resolve().parents[1] / "support" / "nccl_logs"


def log(name: str) -> str:
    return "\n".join(line for line in (LOGS / name).read_text().splitlines() if not line.startswith("#"))


def props(gpu: bool = True, mode: str = "enforce", nodes: int = 2, **extra) -> dict:
    names = ["spark-1", "spark-2", "spark-3"][:nodes]
    return {
        "nodes": [
            {
                "name": name,
                "node": {"name": name},
                "rank": rank,
                "image_id": f"sha256:{rank}" * 1,
                "env": {"NCCL_SOCKET_IFNAME": f"enp1s0f{rank}np{rank}", "NCCL_IB_HCA": "rocep1s0f1:1"},
                "ib_hca": ["rocep1s0f1:1"] if gpu else [],
            }
            for rank, name in enumerate(names)
        ],
        "master_addr": "10.0.0.1",
        "port": 29590,
        "mode": mode,
        "gpu": gpu,
        "run": {
            "devices": ["/dev/infiniband"],
            "gpus": "all" if gpu else None,
            "capabilities": ["CAP_IPC_LOCK"],
            "ulimits": [["memlock", -1, -1]],
            "ipc": "host",
            "shm_size_mb": 16384,
        },  # fmt: skip
        "container_prefix": "qwen35",
        "bytes": 1 << 20,
        "iterations": 2,
        "deadline_s": 30.0,
        "min_busbw_gbs": None,
        **extra,
    }


def report(node: str, rank: int, backend: str = "nccl", busbw: float = 22.0, **steps) -> dict:
    ok = {"ok": True}
    found = {
        "join": {**ok, "backend": backend, "world": 2},
        "all_reduce": ok,
        "sized_all_reduce": {**ok, "busbw_gbs": busbw},
    }
    if backend == "nccl":
        found |= {
            "gpu": {**ok, "name": "NVIDIA GB10", "capability": "12.1"},
            "bf16_matmul": ok,
            "fp8_scaled_mm": ok,
            "vllm_op": ok,
            "gpu_memory": {**ok, "free_bytes": 100, "total_bytes": 128},
        }
    return {"node": node, "rank": rank, "torch": "2.11.0", "steps": {**found, **steps}}


def runs_of(p: dict, reports: dict, text: dict | None = None) -> dict:
    return {
        e["name"]: {"report": reports.get(e["name"]), "text": (text or {}).get(e["name"], ""), "exit": 0}
        for e in p["nodes"]
    }


def nccl_of(p: dict, text: dict) -> dict:
    return {e["name"]: parse_nccl_log(text.get(e["name"], "")) for e in p["nodes"]}


# ---- what each node runs -------------------------------------------------------------------------------


def test_each_node_runs_its_own_image_rank_and_nccl_settings_with_the_serving_runtime():
    p = props()
    first, second = (proof_argv(p, entry) for entry in p["nodes"])
    assert first[:4] == ["docker", "run", "--rm", "-i"] and "--network" in first
    for flag in ("--device", "/dev/infiniband", "--gpus", "all", "--cap-add", "CAP_IPC_LOCK",
                 "--ulimit", "memlock=-1:-1", "--ipc", "host", "--shm-size", "16384m"):  # fmt: skip
        assert flag in first, flag
    assert "NCCL_SOCKET_IFNAME=enp1s0f0np0" in first and "NCCL_SOCKET_IFNAME=enp1s0f1np1" in second
    assert "NCCL_DEBUG=INFO" in first and "NCCL_DEBUG_SUBSYS=INIT,NET,ENV" in first
    assert first[-3:-1] == ["sha256:0", "-"] and second[-3:-1] == ["sha256:1", "-"]
    # As the engine hands the inputs back: every number a float.
    floats = props(run={**p["run"], "ulimits": [["memlock", 8388608.0, 8388608.0]], "shm_size_mb": 256.0})
    floats["nodes"][0]["rank"], floats["port"] = 0.0, 29590.0
    again = proof_argv(floats, floats["nodes"][0])
    assert "memlock=8388608:8388608" in again and "256m" in again
    assert json.loads(again[-1])["rank"] == 0 and json.loads(again[-1])["port"] == 29590
    spec = json.loads(second[-1])
    assert spec == proof_spec(p, p["nodes"][1])
    assert (spec["rank"], spec["world"], spec["master_addr"], spec["port"]) == (1, 2, "10.0.0.1", 29590)


def test_bad_inputs_are_named():
    bad = props(mode="strict", port=80)
    bad["nodes"][1]["rank"] = 5
    assert {key for key, _ in validate(bad)} == {"mode", "port", "nodes"}
    assert validate(props()) == []
    # As the engine hands them to check: every number a float.
    assert validate(props(port=29590.0, deadline_s=30)) == []
    assert [key for key, _ in validate(props(port=29590.5))] == ["port"]


def test_any_changed_input_proves_again_and_nothing_replaces():
    old = props()
    new = props()
    new["nodes"][1]["image_id"] = "sha256:new"
    change = plan_change(old, new)
    assert change.updates == ("nodes",) and change.replaces == ()
    assert not plan_change(old, props()).changes


# ---- the verdict -----------------------------------------------------------------------------------------


def test_a_passing_proof_over_nccl_ib_reports_the_network_hcas_and_bandwidth():
    p = props()
    text = {name: log("spark_roce_v2.28.9.log") for name in ("spark-1", "spark-2")}
    reports = {"spark-1": report("spark-1", 0), "spark-2": report("spark-2", 1)}
    outs = judged(p, runs_of(p, reports, text), nccl_of(p, text))
    assert outs["verdict"] == "passed" and outs["problems"] == [], outs["problems"]
    assert outs["busbw_gbs"] == 22.0 and outs["backend"] == "nccl"
    head = outs["results"]["spark-1"]
    assert head["network"] == "IB" and head["hcas"] and head["gpu"]["capability"] == "12.1"


def test_nccl_falling_back_to_sockets_is_refused_naming_the_node_and_its_lines():
    p = props()
    text = {"spark-1": log("spark_roce_v2.28.9.log"), "spark-2": log("h200_socket_fallback.log")}
    reports = {"spark-1": report("spark-1", 0), "spark-2": report("spark-2", 1)}
    outs = judged(p, runs_of(p, reports, text), nccl_of(p, text))
    assert outs["verdict"] == "refused"
    (problem,) = outs["problems"]
    assert problem.startswith("spark-2: NCCL used network Socket, not RDMA")
    assert "NET/IB : No device found." in problem and "/dev/infiniband" in problem
    assert outs["results"]["spark-2"]["network"] == "Socket"
    assert judged(props(mode="report"), runs_of(p, reports, text), nccl_of(p, text))["verdict"] == (
        "problems recorded"
    )


def test_a_bus_bandwidth_below_the_floor_is_refused_with_both_units():
    p = props(min_busbw_gbs=20.0)
    text = {name: log("spark_roce_v2.28.9.log") for name in ("spark-1", "spark-2")}
    reports = {"spark-1": report("spark-1", 0, busbw=11.5), "spark-2": report("spark-2", 1, busbw=11.5)}
    outs = judged(p, runs_of(p, reports, text), nccl_of(p, text))
    assert outs["problems"] == [
        "the all-reduce's bus bandwidth 11.50 GB/s (92.0 Gb/s) is below fabric.min_busbw_gbps 20 GB/s; next: "
        "see each node's NCCL network and HCAs (`status`), the MTU and the cabling"
    ]


def test_a_gpu_build_without_kernels_for_the_node_names_the_node_and_the_op():
    p = props()
    error = "torch.AcceleratorError: CUDA error: no kernel image is available for execution on the device"
    reports = {
        "spark-1": report("spark-1", 0, bf16_matmul={"ok": False, "error": error}),
        "spark-2": report("spark-2", 1),
    }
    text = {name: log("spark_roce_v2.28.9.log") for name in ("spark-1", "spark-2")}
    outs = judged(p, runs_of(p, reports, text), nccl_of(p, text))
    (problem,) = outs["problems"]
    assert problem.startswith(f"spark-1: the GPU step bf16_matmul failed: {error}; next: an image built")
    assert "sm_121" in problem


def one_problem(torch: str = "2.11.0", **steps) -> str:
    """The one problem of a two-node proof whose first node's report has `steps` (and `torch`)."""
    p = props()
    reports = {"spark-1": {**report("spark-1", 0, **steps), "torch": torch}, "spark-2": report("spark-2", 1)}
    text = {name: log("spark_roce_v2.28.9.log") for name in ("spark-1", "spark-2")}
    (problem,) = judged(p, runs_of(p, reports, text), nccl_of(p, text))["problems"]
    return problem


def test_an_image_without_vllm_is_told_to_install_it_not_about_kernels():
    error = "ModuleNotFoundError: No module named 'vllm'"
    problem = one_problem(vllm_op={"ok": False, "error": error})
    assert problem.startswith(f"spark-1: the GPU step vllm_op failed: {error}; next: ")
    assert "no kernel image" not in problem and "sm_121" not in problem
    assert "cannot import vllm" in problem and "deployment image" in problem


def test_a_cpu_only_torch_is_told_to_use_a_cuda_build_not_to_give_the_gpu():
    error = "RuntimeError: torch 2.9.0+cpu is a CPU-only build (torch.version.cuda is None): it sees no CUDA"
    problem = one_problem("2.9.0+cpu", gpu={"ok": False, "error": error})
    assert "give the containers the GPU" not in problem and "gpu_runtime" not in problem
    assert "torch is built with CUDA" in problem
    # The version alone says so too (a report from an older program, without the CPU-only line).
    older = one_problem("2.9.0+cpu", gpu={"ok": False, "error": "RuntimeError: torch sees no CUDA device"})
    assert "torch is built with CUDA" in older and "gpu_runtime" not in older


def test_a_cuda_torch_that_sees_no_device_is_told_to_give_the_gpu():
    problem = one_problem(gpu={"ok": False, "error": "RuntimeError: torch 2.11.0 sees no CUDA device"})
    assert "give the containers the GPU" in problem and "torch is built with CUDA" not in problem


def test_a_gpu_step_failing_otherwise_gets_no_kernel_image_hint():
    problem = one_problem(
        bf16_matmul={"ok": False, "error": "RuntimeError: the BF16 matmul gave non-finite values"}
    )
    assert "no kernel image" not in problem and "the GPU step bf16_matmul failed" in problem


def test_a_node_that_cannot_join_is_named_with_the_head_address_and_bound():
    p = props(gpu=False)
    timeout = "DistStoreError: Timed out after 31 seconds waiting for clients. 1/2 clients joined."
    reports = {
        "spark-1": report("spark-1", 0, "gloo", join={"ok": False, "error": timeout}),
        "spark-2": report("spark-2", 1, "gloo", join={"ok": False, "error": "TimeoutError: connect"}),
    }
    outs = judged(p, runs_of(p, reports), nccl_of(p, {}))
    assert [line.split(":", 1)[0] for line in outs["problems"]] == ["spark-1", "spark-2"]
    assert "could not join the group of spark-1 at 10.0.0.1:29590 within 30s" in outs["problems"][1]
    assert "spark-2 reaches spark-1's fabric_ip on fabric.probe_port" in outs["problems"][1]


def test_the_lab_verdict_is_gloo_without_a_gpu_step_and_no_nccl_judgement():
    p = props(gpu=False)
    reports = {"spark-1": report("spark-1", 0, "gloo", 0.8), "spark-2": report("spark-2", 1, "gloo", 0.8)}
    outs = judged(p, runs_of(p, reports), nccl_of(p, {}))
    assert outs["verdict"] == "passed" and outs["backend"] == "gloo"
    assert {r["network"] for r in outs["results"].values()} == {"gloo"}
    assert {r["gpu"] is None for r in outs["results"].values()} == {True}


def test_a_join_the_deadline_cut_names_the_head_it_waited_for():
    p = props(gpu=False)
    cut = {"node": "spark-2", "rank": 1, "steps": {}, "running": "join",
           "deadline": "the proof did not finish within 30s"}  # fmt: skip
    outs = judged(p, runs_of(p, {"spark-1": report("spark-1", 0, "gloo"), "spark-2": cut}), nccl_of(p, {}))
    assert outs["problems"] == [
        "spark-2: could not join the group of spark-1 at 10.0.0.1:29590 within 30s: the proof did not "
        "finish within 30s; next: check that spark-2 reaches spark-1's fabric_ip on fabric.probe_port "
        "(firewall, route, nodes[].fabric_ip)"
    ]


def test_no_torch_and_no_report_are_problems_naming_the_node():
    p = props()
    runs = runs_of(p, {"spark-1": {"error": "the image's python3 cannot import torch: ModuleNotFoundError"}})
    runs["spark-2"] = {"report": None, "error": "spark-2: timed out after 90 s", "exit": None}
    outs = judged(p, runs, nccl_of(p, {}))
    assert outs["problems"][0].startswith("spark-1: the image's python3 cannot import torch")
    assert outs["problems"][1].startswith("spark-2: the proof gave no report (spark-2: timed out")


def test_failed_steps_come_in_the_order_the_proof_runs_them():
    steps = {"sized_all_reduce": {"ok": False, "error": "b"}, "gpu": {"ok": False, "error": "a"}}
    assert failed_steps({"steps": steps}) == [("gpu", "a"), ("sized_all_reduce", "b")]


# ---- ensure: every node at once, enforce and report ----------------------------------------------------


HOST = {
    "driver": "580.95.05",
    "cuda": "13.0",
    "kernel": "6.11.0-1016-nvidia",
    "firmware": {"rocep1s0f1": "28.45.1020"},
}


class Canned:
    """A transport that answers `docker rm` with nothing and `docker run` with a canned run."""

    def __init__(self, name: str, stdout: str, returncode: int = 0, fail: bool = False):
        self.name, self.stdout, self.returncode, self.fail = name, stdout, returncode, fail
        self.argvs: list[list[str]] = []

    def run(self, argv, stdin=None, timeout=None):
        self.argvs.append(list(argv))
        if argv[:2] == ["docker", "rm"]:
            return Result(tuple(argv), 1, b"", b"No such container", self.name)
        if argv[0] == "python3":  # the host's software facts (node_programs/node_software.py)
            return Result(tuple(argv), 0, json.dumps(HOST).encode(), b"", self.name)
        if self.fail:
            raise RemoteError(self.name, argv, -1, b"", f"timed out after {timeout:g} s")
        assert stdin and b"node_proof" in stdin or b"torch" in stdin
        return Result(tuple(argv), self.returncode, self.stdout.encode(), b"", self.name)


def test_ensure_refuses_under_enforce_and_records_under_report(monkeypatch):
    monkeypatch.setattr("pulumi.log.warn", lambda *a, **k: None)
    monkeypatch.setattr("pulumi.log.info", lambda *a, **k: None)
    fallback = log("h200_socket_fallback.log")
    ib = log("spark_roce_v2.28.9.log")
    transports = {
        "spark-1": Canned("spark-1", ib + "\n" + json.dumps(report("spark-1", 0))),
        "spark-2": Canned("spark-2", fallback + "\n" + json.dumps(report("spark-2", 1))),
    }
    with pytest.raises(NodeProofError, match="spark-2: NCCL used network Socket") as raised:
        ensure(props(), transports=transports)
    assert "fabric.node_proof: enforce stops here" in str(raised.value)
    outs = ensure(props(mode="report"), transports=transports)
    assert outs["verdict"] == "problems recorded" and outs["results"]["spark-1"]["network"] == "IB"
    # The host's software read (no container), a left container removed, then the proof, on every node.
    for transport in transports.values():
        assert [argv[:2] for argv in transport.argvs if argv[0] != "python3"] == [
            ["docker", "rm"],
            ["docker", "run"],
        ] * 2
        assert [argv[0] for argv in transport.argvs].count("python3") == 2
    assert outs["node_software"]["spark-1"] == {**HOST, "torch": None, "nccl": None, "vllm": None}


def test_a_run_that_times_out_is_removed_and_named(monkeypatch):
    monkeypatch.setattr("pulumi.log.warn", lambda *a, **k: None)
    monkeypatch.setattr("pulumi.log.info", lambda *a, **k: None)
    transports = {
        "spark-1": Canned("spark-1", json.dumps(report("spark-1", 0, "gloo"))),
        "spark-2": Canned("spark-2", "", fail=True),
    }
    outs = ensure(props(gpu=False, mode="report"), transports=transports)
    assert [argv[:2] for argv in transports["spark-2"].argvs if argv[0] != "python3"] == [
        ["docker", "rm"],
        ["docker", "run"],
        ["docker", "rm"],
    ]
    assert outs["problems"] == [
        "spark-2: the proof gave no report (spark-2: timed out after 90 s); next: see the error"
    ]


# ---- from config -----------------------------------------------------------------------------------------


def config(**sections):
    raw = dev_raw()
    for key, value in sections.items():
        raw[key] = {**raw.get(key, {}), **value}
    return parse_stack_config(raw)


def test_the_mode_follows_the_check_unless_set_and_the_head_claims_the_port():
    assert node_proof_inputs(config())["mode"] == "enforce"
    off = config(fabric={"check": "off"})
    assert off.fabric.proof.value == "off" and [29590, 29590] not in claimed_ports(off, off.head)
    lab = config(fabric={"check": "off", "node_proof": "enforce"}, containers={"gpu_runtime": False})
    inputs = node_proof_inputs(lab)
    assert (inputs["mode"], inputs["gpu"], inputs["run"]["gpus"], inputs["master_addr"]) == (
        "enforce", False, None, lab.head.fabric_ip
    )  # fmt: skip
    assert [29590, 29590] in claimed_ports(lab, lab.head) and [29590, 29590] not in claimed_ports(
        lab, lab.workers[0]
    )


def test_a_floor_the_proof_would_ignore_is_refused():
    with pytest.raises(
        ValueError, match="fabric.min_busbw_gbps is the node proof's floor, and the proof is off"
    ):
        config(fabric={"check": "off", "min_busbw_gbps": 20})
    floor = config(fabric={"min_busbw_gbps": 20})
    assert node_proof_inputs(floor)["min_busbw_gbs"] == 20


# ---- status -----------------------------------------------------------------------------------------------


def test_status_shows_the_recorded_verdict_transport_and_bandwidth_and_warns_per_problem():
    p = props(mode="report")
    text = {"spark-1": log("spark_roce_v2.28.9.log"), "spark-2": log("h200_socket_fallback.log")}
    reports = {"spark-1": report("spark-1", 0), "spark-2": report("spark-2", 1, busbw=2.5)}
    outs = judged(p, runs_of(p, reports, text), nccl_of(p, text))
    line, warned = proof_line({"output": {"proof": {"mode": "report", **outs}}})
    hcas = ", ".join(outs["results"]["spark-1"]["hcas"])
    assert line == (
        f"problems recorded over nccl: spark-1 IB ({hcas}), spark-2 Socket; 22.00 GB/s bus bandwidth "
        "(proved by `pulumi up`, not now)"
    )
    assert [w.what.split(":", 2)[1].strip() for w in warned] == ["spark-2"]
    assert proof_line({"error": "no stack"})[0] == "not recorded (no stack)"
    assert proof_line({"output": {"proof": {"verdict": None}}})[0].startswith("not run yet")


# ---- the serving containers hold the memory: not run --------------------------------------------------


MEMINFO = "MemTotal:       127000000 kB\nMemFree:         1000000 kB\nMemAvailable:    {} kB\n"


class Meminfo(Canned):
    """A node whose /proc/meminfo says `available_kb`; its proof answers as Canned."""

    def __init__(self, name: str, available_kb: int, stdout: str = ""):
        super().__init__(name, stdout)
        self.available_kb = available_kb

    def run(self, argv, stdin=None, timeout=None):
        if argv == ["cat", "/proc/meminfo"]:
            self.argvs.append(list(argv))
            return Result(tuple(argv), 0, MEMINFO.format(self.available_kb).encode(), b"", self.name)
        return super().run(argv, stdin, timeout)


def test_a_node_whose_memory_the_serving_containers_hold_is_not_proved_and_nothing_runs(monkeypatch):
    warned = []
    monkeypatch.setattr("pulumi.log.warn", lambda line, *a, **k: warned.append(line))
    monkeypatch.setattr("pulumi.log.info", lambda *a, **k: None)
    transports = {"spark-1": Meminfo("spark-1", 100_000_000), "spark-2": Meminfo("spark-2", 9_000_000)}
    outs = ensure(props(min_available_bytes=12 << 30), transports=transports)  # enforce: not refused
    assert (outs["verdict"], outs["problems"], outs["results"]) == ("skipped", [], {})
    (line,) = outs["warnings"]
    assert line.startswith("spark-2: not run: 9.2 GB of memory available, below the proof's 12.9 GB")
    assert warned == [f"node proof: {line}"]
    shown, _ = proof_line({"output": {"proof": {"mode": "enforce", **outs}}})
    assert shown == (
        "skipped by the last `pulumi up` (spark-2: not run: 9.2 GB of memory available, below the "
        "proof's 12.9 GB): nothing proved then"
    )
    # Only the host's software and /proc/meminfo were read: no container ran on either node.
    assert [argv[0] for t in transports.values() for argv in t.argvs] == ["python3", "cat"] * 2
    assert outs["node_software"]["spark-2"] == {**HOST, "torch": None, "nccl": None, "vllm": None}


def test_with_room_on_every_node_the_proof_runs(monkeypatch):
    monkeypatch.setattr("pulumi.log.warn", lambda *a, **k: None)
    monkeypatch.setattr("pulumi.log.info", lambda *a, **k: None)
    ib = log("spark_roce_v2.28.9.log")
    transports = {
        name: Meminfo(name, 100_000_000, ib + "\n" + json.dumps(report(name, rank)))
        for rank, name in enumerate(("spark-1", "spark-2"))
    }
    outs = ensure(props(min_available_bytes=12 << 30), transports=transports)
    assert outs["verdict"] == "passed", outs["problems"]
    assert mem_available(MEMINFO.format(4)) == 4096 and mem_available("MemFree: 1 kB") is None


def test_the_join_problem_names_the_port_as_an_integer_whatever_the_engine_hands_back():
    p = props(gpu=False, port=29590.0)
    failed = {"ok": False, "error": "TimeoutError"}
    reports = {"spark-1": report("spark-1", 0, "gloo"), "spark-2": report("spark-2", 1, "gloo", join=failed)}
    (problem,) = judged(p, runs_of(p, reports), nccl_of(p, {}))["problems"]
    assert "at 10.0.0.1:29590 within 30s" in problem, problem


def test_a_floor_in_gbits_and_a_floor_for_one_node_are_refused():
    with pytest.raises(ValueError, match="is in GB/s .* divided by 8 is GB/s"):
        config(fabric={"min_busbw_gbps": 176})
    raw = dev_raw()
    raw["nodes"] = raw["nodes"][:1]
    raw["fabric"] = {**raw.get("fabric", {}), "min_busbw_gbps": 20}
    with pytest.raises(ValueError, match="fabric.min_busbw_gbps: one node forms no group"):
        parse_stack_config(raw)


# ---- the two floors' units: fabric.min_gbps is in Gb/s, fabric.min_busbw_gbps in GB/s ------------------
# The names stay (stacks carry them); every message that names one says its unit.


def refusal_of(**sections) -> str:
    with pytest.raises(ValueError) as info:
        config(**sections)
    return str(info.value)


@pytest.mark.parametrize(
    "fabric",
    [
        {"min_busbw_gbps": 0},
        {"min_busbw_gbps": -3},
        {"check": "off", "min_busbw_gbps": 20},
        {"min_busbw_gbps": 176},
    ],
)
def test_every_refusal_of_the_busbw_floor_says_gigabytes(fabric):
    message = refusal_of(fabric=fabric)
    assert "fabric.min_busbw_gbps" in message and "GB/s (gigabytes per second" in message, message


@pytest.mark.parametrize("floor", [0, -100])
def test_every_refusal_of_the_probe_floor_says_gigabits(floor):
    message = refusal_of(fabric={"min_gbps": floor})
    assert "fabric.min_gbps" in message and "Gb/s (gigabits per second" in message, message


def test_the_one_node_refusal_says_gigabytes():
    raw = dev_raw()
    raw["nodes"] = raw["nodes"][:1]
    raw["fabric"] = {**raw.get("fabric", {}), "min_busbw_gbps": 20}
    with pytest.raises(ValueError, match=r"fabric.min_busbw_gbps: .*GB/s \(gigabytes per second"):
        parse_stack_config(raw)
