"""The serving ranks' own transport, read from their containers' logs (captured NCCL lines and the
lab's real vLLM logs): recorded per node, refused under enforce when NCCL used sockets while HCAs
were given, and the lab's gloo ranks reported as gloo."""

from __future__ import annotations

from pathlib import Path

import pytest

from components.readiness_gate.facts import serving_transport
from components.readiness_gate.plan import serving_verdict

SUPPORT = Path(__file__).resolve().parents[1] / "support"
NCCL = SUPPORT / "nccl_logs"
VLLM = SUPPORT / "vllm_logs"
GIVEN = ["rocep1s0f0", "roceP2p1s0f0"]


def log(path: Path) -> str:
    return path.read_text()


@pytest.mark.parametrize(
    "name", ["vllm-0.32.0-cpu-lab-head-2026-12-06.log", "vllm-0.32.0-cpu-lab-rank1-2026-12-06.log"]
)
def test_the_lab_s_cpu_ranks_are_gloo_with_no_nccl_lines(name):
    transport = serving_transport(log(VLLM / name))
    record, refusal = serving_verdict("node-b", "enforce", transport, [])
    assert record == {
        "backend": "gloo",
        "network": None,
        "hcas": [],
        "gid_index": {},
        "said": "gloo, no NCCL lines",
        "verdict": "pass",
        "problems": [],
    }
    assert refusal is None


def test_rdma_is_recorded_with_its_hcas_and_gid_index():
    transport = serving_transport(log(NCCL / "spark_roce_v2.28.9.log"))
    record, refusal = serving_verdict("spark-1", "enforce", transport, GIVEN)
    assert refusal is None and record["verdict"] == "pass" and record["network"] == "IB"
    assert record["hcas"] and set(record["gid_index"].values()) == {3}
    assert record["said"].startswith("NCCL over IB (") and "GID index 3" in record["said"]


def test_sockets_while_hcas_were_given_refuse_under_enforce_naming_the_node_and_quoting_nccl():
    transport = serving_transport(log(NCCL / "spark_socket_fallback_v2.28.9.log"))
    record, refusal = serving_verdict("spark-2", "enforce", transport, GIVEN)
    assert record["network"] == "Socket" and record["verdict"] == "fail"
    assert refusal is not None and refusal.startswith("serving ranks on spark-2:")
    assert "`NCCL INFO Using network Socket`" in refusal
    assert "`NCCL INFO NET/IB : No device found.`" in refusal


def test_sockets_are_recorded_and_go_on_under_report():
    transport = serving_transport(log(NCCL / "spark_socket_fallback_v2.28.9.log"))
    record, refusal = serving_verdict("spark-2", "report", transport, GIVEN)
    assert refusal is None and record["verdict"] == "fail"
    assert "NCCL used network Socket" in record["problems"][0]


def test_sockets_without_hcas_given_are_what_was_meant():
    transport = serving_transport(log(NCCL / "spark_socket_fallback_v2.28.9.log"))
    record, refusal = serving_verdict("spark-2", "enforce", transport, [])
    assert refusal is None and record["verdict"] == "pass" and record["network"] == "Socket"
