"""ServeBench in the stack: the `bench` section typed (did-you-mean, keys the mode ignores refused,
enforce without a floor refused, requests that fit `serve.max_model_len`), and the graph under Pulumi
mocks: after the readiness gate, on the head, what it measures as its inputs, the key secret, the
stack output `serve_bench`; nothing under `bench.mode: off`."""

from __future__ import annotations

import copy

import pytest

from components.config import CheckMode, ConfigError, parse_stack_config
from tests.support.program import dev_raw, mp_stack_config, stack_config
from tests.unit.test_deployment import SECRETS, run_graph, unsecret

BENCH = "pulumi-python:dynamic/qwen35:ServeBench"


def with_bench(bench: dict | None, stack: str = "dev") -> dict:
    raw = dev_raw(stack)
    if bench is None:
        raw.pop("bench", None)
    else:
        raw["bench"] = bench
    return raw


def refusal(raw: dict) -> str:
    with pytest.raises(ConfigError) as info:
        parse_stack_config(raw)
    return str(info.value)


def test_a_spark_stack_reports_by_default_with_bounded_counts():
    bench = parse_stack_config(with_bench(None)).bench
    assert bench.mode is CheckMode.REPORT and bench.floors() == {}
    assert bench.settings() == {
        "output_tokens": 256,
        "prompt_tokens": 2048,
        "concurrency": 4,
        "deadline_s": 600,
    }


@pytest.mark.parametrize(
    ("bench", "expected"),
    [
        ({"mode": "enforce"}, ["bench.mode: enforce holds the figures to floors and none is set"]),
        ({"mode": False, "concurrency": 2}, ["bench.concurrency: is not read with bench.mode off"]),
        ({"mode": "off", "min_decode_tps": 18}, ["bench.min_decode_tps: is not read with bench.mode off"]),
        ({"min_decode_tsp": 18}, ["bench.min_decode_tsp: unknown key (did you mean 'min_decode_tps'?)"]),
        ({"concurrency": 0}, ["bench.concurrency:"]),
        ({"concurrency": 1000}, ["bench.concurrency:"]),
        ({"output_tokens": 1 << 20}, ["bench.output_tokens:"]),
        ({"deadline_s": 5}, ["bench.deadline_s:"]),
        ({"min_prefill_tps": 0}, ["bench.min_prefill_tps:"]),
        ({"max_ttft_s": -1}, ["bench.max_ttft_s:"]),
        ({"mode": "always"}, ["bench.mode:"]),
        # The dev stack's serve.max_model_len is 32768.
        ({"prompt_tokens": 40000}, ["bench.prompt_tokens: a bench request of about 42008 tokens exceeds"]),
        # Within max_model_len by 8, but not with the sized prompt's 5 % slack (1638 tokens).
        ({"prompt_tokens": 32760}, ["bench.prompt_tokens: a bench request of about 34406 tokens exceeds"]),
    ],
)
def test_bad_bench_sections_are_refused_naming_the_key(bench, expected):
    message = refusal(with_bench(bench))
    for part in expected:
        assert part in message, message


def test_off_and_enforce_with_a_floor_load():
    assert parse_stack_config(with_bench({"mode": False})).bench.mode is CheckMode.OFF
    enforce = parse_stack_config(with_bench({"mode": "enforce", "max_ttft_s": 2})).bench
    assert enforce.floors() == {"max_ttft_s": 2.0}


def test_the_lab_stand_in_stack_runs_no_bench():
    # The stand-in vLLM does not stream: nothing to measure there.
    assert parse_stack_config(dev_raw("lab")).bench.mode is CheckMode.OFF


def bench_config(bench: dict | None = None, base: dict | None = None) -> dict:
    cfg = copy.deepcopy(base or stack_config("dev"))
    if bench is not None:
        cfg["qwen35-spark:bench"] = bench
    return cfg


def test_the_bench_runs_after_the_gate_on_the_head_with_what_it_measures(monkeypatch):
    graph = run_graph(monkeypatch, bench_config({"mode": "enforce", "min_decode_tps": 18, "concurrency": 2}))
    bench = graph.run.named("qwen35-bench")
    assert bench.typ == BENCH
    assert "qwen35-ready" in graph.deps["qwen35-bench"]
    inputs = bench.inputs
    assert inputs["node"]["name"] == "spark-1" and inputs["url"] == "http://127.0.0.1:8000"
    assert inputs["model"] == "qwen3.5-122b" and inputs["mode"] == "enforce"
    assert inputs["settings"]["concurrency"] == 2 and inputs["floors"] == {"min_decode_tps": 18}
    # Every node's own image ID, the server's argv as its container runs it, the node set.
    assert set(inputs["image_ids"]) == {"spark-1", "spark-2"}
    assert all(value.startswith("sha256:") for value in inputs["image_ids"].values())
    server = graph.container("qwen35-vllm").inputs
    assert inputs["server_argv"] == [server["entrypoints"][0], *server["command"]]
    assert inputs["nodes"] == ["spark-1", "spark-2"] and inputs["log_container"] == "qwen35-vllm"
    # FabricCheck's outputs, to explain a miss.
    assert set(inputs["fabric"]["nodes"]) == {"spark-1", "spark-2"}


def test_the_api_key_reaches_the_bench_as_a_secret_only(monkeypatch):
    graph = run_graph(monkeypatch, bench_config())
    inputs = graph.run.named("qwen35-bench").inputs
    value, secret = unsecret(inputs["api_key"])
    assert (value, secret) == (SECRETS["api_key"], True)
    assert "api_key" in graph.options["qwen35-bench"]["additional_secret_outputs"]
    plain = {k: v for k, v in inputs.items() if k != "api_key"}
    assert SECRETS["api_key"] not in str(plain)


def test_the_stack_output_serve_bench(monkeypatch):
    out = run_graph(monkeypatch, bench_config({"mode": "report", "min_prefill_tps": 500})).run.outputs
    bench = out["serve_bench"]
    assert bench["mode"] == "report" and bench["floors"] == {"min_prefill_tps": 500}
    assert bench["settings"]["output_tokens"] == 256
    assert {"figures", "verdict", "shortfalls", "causes", "nccl_network", "measured_at", "error"} <= set(
        bench
    )


def test_off_declares_no_bench_and_says_so(monkeypatch):
    graph = run_graph(monkeypatch, bench_config({"mode": "off"}))
    assert graph.run.by_type(BENCH) == []
    assert graph.run.outputs["serve_bench"] == {"mode": "off"}


def test_under_mp_the_bench_follows_the_gate_and_every_rank_s_image(monkeypatch):
    graph = run_graph(monkeypatch, mp_stack_config(2))
    inputs = graph.run.named("qwen35-bench").inputs
    assert "qwen35-ready" in graph.deps["qwen35-bench"]
    assert set(inputs["image_ids"]) == {"spark-1", "spark-2"}
    assert "--nnodes" in inputs["server_argv"]


def test_a_serve_setting_changes_the_bench_s_argv_input(monkeypatch):
    before = run_graph(monkeypatch, bench_config()).run.named("qwen35-bench").inputs
    cfg = bench_config()
    cfg["qwen35-spark:serve"] = {**cfg["qwen35-spark:serve"], "max_num_seqs": 8}
    after = run_graph(monkeypatch, cfg).run.named("qwen35-bench").inputs
    assert before["server_argv"] != after["server_argv"]
    assert {k: v for k, v in before.items() if k != "server_argv"} == {
        k: v for k, v in after.items() if k != "server_argv"
    }


@pytest.mark.parametrize("executor", ["ray", "mp"])
def test_the_bench_compares_what_each_node_s_serving_containers_give_nccl(monkeypatch, executor):
    from tests.unit.test_deployment import envs, unpinned_config

    cfg = unpinned_config(gid_index="resolve") if executor == "ray" else mp_stack_config(2)
    graph = run_graph(monkeypatch, cfg)
    inputs = graph.run.named("qwen35-bench").inputs
    serving = (
        {"spark-1": "qwen35-ray-head", "spark-2": "qwen35-ray-worker-spark-2"}
        if executor == "ray"
        else {"spark-1": "qwen35-vllm", "spark-2": "qwen35-vllm-headless-spark-2"}
    )
    keys = ("NCCL_IB_DISABLE", "NCCL_IB_HCA", "NCCL_IB_GID_INDEX", "NCCL_SOCKET_IFNAME")
    for node, container in serving.items():
        env = envs(graph, container)
        assert inputs["nccl_env"][node] == {k: env[k] for k in keys if k in env}, node
    # Each node's own FabricCheck decided it (the mocks cable spark-2 on its f1 functions).
    if executor == "ray":
        assert inputs["nccl_env"]["spark-2"]["NCCL_IB_HCA"] == "rocep1s0f1:1,roceP2p1s0f1:1"
        assert inputs["nccl_env"]["spark-2"]["NCCL_IB_GID_INDEX"] == "3"
