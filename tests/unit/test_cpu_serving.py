"""`serve.cpu` and `serve.enforce_eager`: what vLLM's CPU build (the lab's real engine) needs, typed,
and refused where it cannot apply; and the real-engine lab stack as engine/real_vllm.yaml makes it."""

from __future__ import annotations

import pytest

from components.config import ConfigError, parse_stack_config
from components.mp_executor import mp_container_spec, ranked_nodes
from components.vllm_server import serve_argv
from engine.lab_stack import real_engine_config
from tests.support.program import mp_raw

CPU = {"kvcache_space_gb": 2, "threads_bind": {"spark-1": "0-1", "spark-2": "2|3"}}


def cpu_raw(**serve) -> dict:
    raw = mp_raw(2)
    raw["containers"] = {**raw.get("containers", {}), "gpu_runtime": False}
    raw["serve"] = {**raw["serve"], "cpu": CPU, **serve}
    return raw


def refusal(raw: dict) -> str:
    with pytest.raises(ConfigError) as info:
        parse_stack_config(raw)
    return str(info.value)


def test_each_rank_gets_the_cpu_platform_s_variables_for_its_own_node():
    config = parse_stack_config(cpu_raw())
    envs = {n.name: mp_container_spec(config, n, "sha256:" + "a" * 64).env for n in ranked_nodes(config)}
    assert envs["spark-1"]["VLLM_CPU_OMP_THREADS_BIND"] == "0-1"
    assert envs["spark-2"]["VLLM_CPU_OMP_THREADS_BIND"] == "2|3"
    assert {e["VLLM_CPU_KVCACHE_SPACE"] for e in envs.values()} == {"2"}


def test_a_gpu_stack_gets_no_cpu_variables_and_no_eager_flag():
    config = parse_stack_config(mp_raw(2))
    env = mp_container_spec(config, config.head, "sha256:" + "a" * 64).env
    assert not [k for k in env if k.startswith("VLLM_CPU_")]
    assert "--enforce-eager" not in serve_argv(config.serve, backend="mp")


def test_enforce_eager_is_a_typed_flag():
    config = parse_stack_config(cpu_raw(enforce_eager=True))
    assert "--enforce-eager" in serve_argv(config.serve, backend="mp")
    message = refusal(cpu_raw(extra_args=["--enforce-eager"]))
    assert "--enforce-eager is a typed option: set serve.enforce_eager" in message


@pytest.mark.parametrize(
    ("case", "mutate", "expected"),
    [
        (
            "a GPU stack",
            lambda raw: raw["containers"].update(gpu_runtime=True),
            ["serve.cpu:", "vLLM's CPU build", "containers.gpu_runtime", "remove serve.cpu"],
        ),
        (
            "the Ray executor",
            lambda raw: raw.pop("cluster"),
            ["serve.cpu:", "refuses the Ray executor", "cluster.executor to 'mp'"],
        ),
        (
            "an unknown node",
            lambda raw: raw["serve"]["cpu"]["threads_bind"].update({"spark-3": "4"}),
            ["serve.cpu.threads_bind.spark-3:", "not a node of this stack", "did you mean 'spark-2'"],
        ),
        (
            "not a core list",
            lambda raw: raw["serve"]["cpu"]["threads_bind"].update({"spark-2": "1; rm"}),
            ["spark-2: '1; rm' is not a core list"],
        ),
        (
            "no KV space",
            lambda raw: raw["serve"]["cpu"].update(kvcache_space_gb=0),
            ["serve.cpu.kvcache_space_gb"],
        ),
        (
            "an unknown key",
            lambda raw: raw["serve"]["cpu"].update(kv_space=1),
            ["serve.cpu.kv_space"],
        ),
    ],
)
def test_serve_cpu_is_refused_where_it_cannot_apply(case, mutate, expected):
    raw = cpu_raw()
    raw["serve"]["cpu"] = {**CPU, "threads_bind": dict(CPU["threads_bind"])}
    mutate(raw)
    message = refusal(raw)
    for part in expected:
        assert part in message, (case, message)


def test_the_real_engine_lab_stack_is_mp_with_one_core_per_rank_and_the_model_check_enforced():
    raw = {
        k.split(":", 1)[1]: v for k, v in real_engine_config("lab-vllm-cpu:t", "http://127.0.0.1:1").items()
    }
    config = parse_stack_config(raw)
    assert config.cluster.executor.value == "mp"
    assert config.image.prebuilt == "lab-vllm-cpu:t"
    assert config.image.model_check.value == "enforce"
    assert config.serve.model == "lab/qwen3.5-tiny-moe" and config.serve.enforce_eager
    binds = [mp_container_spec(config, n, "sha256:" + "a" * 64).env["VLLM_CPU_OMP_THREADS_BIND"]
             for n in ranked_nodes(config)]  # fmt: skip
    assert binds == ["0", "1"]
    assert "ray" not in raw and all("ray_ports" not in n for n in raw["nodes"])
