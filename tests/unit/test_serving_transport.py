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


# ---- the gate reads each node's serving container after its probe ---------------------------------

KNOWN = "/tmp/known_hosts"


def node(name: str) -> dict:
    return {"name": name, "host": f"10.0.0.{1 + int(name[-1])}", "user": "root", "known_hosts": KNOWN}


def gate_props(mode: str, **logs: str) -> dict:
    return {
        "node": node("spark-1"),
        "serving_logs": {
            name: {"node": node(name), "container": container} for name, container in logs.items()
        },
        "nccl_fabric": {name: {"ib_hca": GIVEN, "gid_index": 3} for name in logs},
        "transport_mode": mode,
    }


class FakeTransport:
    """Answers `docker logs` with a fixture per node, or fails like a node whose daemon is gone."""

    def __init__(self, name: str, logs: dict[str, str | None], asked: list):
        self.name, self.logs, self.asked = name, logs, asked

    def run(self, argv, stdin=None, timeout=None):
        from components.remote import Result

        self.asked.append((self.name, list(argv), timeout))
        text = self.logs[self.name]
        if text is None:
            return Result(tuple(argv), 1, b"", b"Error response from daemon: No such container\n", self.name)
        # docker logs: the container's stdout on stdout, its stderr (NCCL's and vLLM's lines) on stderr.
        return Result(tuple(argv), 0, b"", text.encode(), self.name)


@pytest.fixture
def nodes_answer(monkeypatch):
    from components.readiness_gate import execute

    logs: dict[str, str | None] = {}
    asked: list = []
    monkeypatch.setattr(
        execute, "transport_to", lambda role, raw, *a: FakeTransport(raw["name"], logs, asked)
    )
    return logs, asked


def test_the_gate_reads_every_rank_s_log_and_records_each_node(nodes_answer):
    from components.readiness_gate.execute import SERVING_LOG_READ_S, SERVING_LOG_TAIL, serving_transports

    logs, asked = nodes_answer
    logs["spark-1"] = log(NCCL / "spark_roce_v2.28.9.log")
    logs["spark-2"] = log(NCCL / "spark_socket_fallback_v2.28.9.log")
    records = serving_transports(
        gate_props("report", **{"spark-1": "qwen35-vllm", "spark-2": "qwen35-vllm-rank1"})
    )
    assert sorted(asked) == [
        ("spark-1", ["docker", "logs", "--tail", str(SERVING_LOG_TAIL), "qwen35-vllm"], SERVING_LOG_READ_S),
        (
            "spark-2",
            ["docker", "logs", "--tail", str(SERVING_LOG_TAIL), "qwen35-vllm-rank1"],
            SERVING_LOG_READ_S,
        ),
    ]
    assert records["spark-1"]["verdict"] == "pass" and records["spark-1"]["network"] == "IB"
    assert records["spark-2"]["verdict"] == "fail" and records["spark-2"]["network"] == "Socket"


def test_under_enforce_sockets_on_one_rank_refuse_the_gate_naming_that_node(nodes_answer):
    from components.readiness_gate.errors import ServingTransportRefused
    from components.readiness_gate.execute import serving_transports

    logs, _ = nodes_answer
    logs["spark-1"] = log(NCCL / "spark_roce_v2.28.9.log")
    logs["spark-2"] = log(NCCL / "spark_socket_fallback_v2.28.9.log")
    with pytest.raises(ServingTransportRefused) as refused:
        serving_transports(
            gate_props("enforce", **{"spark-1": "qwen35-vllm", "spark-2": "qwen35-vllm-rank1"})
        )
    text = str(refused.value)
    assert text.startswith("serving ranks on spark-2:") and "spark-1" not in text
    assert "`NCCL INFO Using network Socket`" in text


def test_a_log_that_cannot_be_read_is_recorded_as_unknown_and_refuses_nothing(nodes_answer):
    from components.readiness_gate.execute import serving_transports

    logs, _ = nodes_answer
    logs["spark-1"] = log(VLLM / "vllm-0.32.0-cpu-lab-head-2026-12-06.log")
    logs["spark-2"] = None
    records = serving_transports(
        gate_props("enforce", **{"spark-1": "qwen35-vllm", "spark-2": "qwen35-vllm-rank1"})
    )
    assert records["spark-1"]["said"] == "gloo, no NCCL lines"
    assert records["spark-2"]["verdict"] == "unknown"
    assert (
        records["spark-2"]["said"].startswith("log not read (")
        and "No such container" in records["spark-2"]["said"]
    )


def test_a_changed_mode_reads_the_logs_again_without_probing(monkeypatch):
    from components.readiness_gate import provider as module

    recorded = {
        "ready": True,
        "report": {"completion_tokens": 2},
        "serving_transport": {"spark-1": {"verdict": "fail"}},
    }
    olds = {**gate_props("report", **{"spark-1": "qwen35-vllm"}), "server_id": "s1", **recorded}
    news = {k: v for k, v in olds.items() if k not in ("ready", "report", "serving_transport")}
    news["transport_mode"] = "enforce"
    monkeypatch.setattr(module, "ensure", lambda *a: pytest.fail("a mode change probed again"))
    read = []
    monkeypatch.setattr(
        module, "serving_transports", lambda props: read.append(props) or {"spark-1": {"verdict": "pass"}}
    )
    outs = module.ReadinessGateProvider().update("id", olds, news).outs
    assert read == [news]
    assert outs["serving_transport"] == {"spark-1": {"verdict": "pass"}} and outs["report"] == olds["report"]
    # Nothing that decides the reading changed: the record stays, nothing is read.
    read.clear()
    same = module.ReadinessGateProvider().update("id", outs, {**news, "deadline_s": 60}).outs
    assert read == [] and same["serving_transport"] == outs["serving_transport"]


@pytest.mark.parametrize(
    ("logs", "mode", "field"),
    [
        ({"spark-2": {"node": node("spark-2")}}, "report", "serving_logs.spark-2"),
        ({"spark-2": {"node": {"name": "spark-2"}, "container": "c"}}, "report", "serving_logs.spark-2.node"),
        ("spark-2", "report", "serving_logs"),
        ({}, "loud", "transport_mode"),
    ],
)
def test_check_refuses_a_serving_log_it_cannot_read_naming_the_field(logs, mode, field):
    from components.readiness_gate.plan import validate

    problems = validate({"node": node("spark-1"), "serving_logs": logs, "transport_mode": mode})
    assert [f for f, _ in problems] == [field], problems


def test_the_bench_names_a_rank_on_sockets_first_among_its_causes():
    from components.serve_bench.plan import likely_causes

    fabric = {
        "check": "off",
        "nodes": {},
        "serving": {
            "spark-1": {"said": "NCCL over IB (rocep1s0f0; GID index 3)", "verdict": "pass", "problems": []},
            "spark-2": {"said": "NCCL over Socket (no HCA; GID index not logged)", "verdict": "fail",
                        "problems": ["spark-2: NCCL used network Socket (TCP sockets)"]},
        },
    }  # fmt: skip
    causes = likely_causes(fabric, "IB", ["spark-1", "spark-2"])
    serving = [c for c in causes if c.startswith("the serving ranks on")]
    assert (
        serving[0].startswith("the serving ranks on spark-2 said NCCL over Socket")
        and "TCP sockets" in serving[0]
    )
    assert serving[1] == (
        "the serving ranks on spark-1 said NCCL over IB (rocep1s0f0; GID index 3)"
        " (the readiness gate read their log)"
    )
    assert causes.index(serving[0]) < causes.index(serving[1])


def test_status_shows_what_each_node_s_ranks_said_and_warns_on_sockets():
    from components.config import parse_stack_config
    from status import render
    from status.verdict import judge
    from tests.support.program import stack_config
    from tests.unit.test_status import healthy

    config = parse_stack_config({k.split(":", 1)[1]: v for k, v in stack_config("lab").items()})
    serving = {
        "node-a": {"said": "gloo, no NCCL lines", "verdict": "pass", "problems": []},
        "node-b": {"said": "NCCL over Socket (no HCA; GID index not logged)", "verdict": "fail",
                   "problems": ["node-b: NCCL used network Socket"]},
    }  # fmt: skip
    verdict = judge(config, {**healthy(), "fabric_output": {"output": {"serving": serving}}})
    row = verdict.cluster["serving transport"]
    assert row.startswith(
        "node-a gloo, no NCCL lines; node-b NCCL over Socket (no HCA; GID index not logged) (FAIL)"
    )
    assert [w.what for w in verdict.warnings if "serving ranks" in w.what] == [
        "serving ranks on node-b: node-b: NCCL used network Socket"
    ]
    assert "serving transport" in render.text(verdict, "lab")
    # Nothing recorded yet: said so, with what records it.
    empty = judge(config, {**healthy(), "fabric_output": {"output": {"check": "off"}}})
    assert empty.cluster["serving transport"].startswith("not recorded (no `serving`")
