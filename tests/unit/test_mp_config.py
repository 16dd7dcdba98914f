"""`qwen35-spark:cluster`: executor ray (the default) or mp, and the keys each reads."""

from __future__ import annotations

import pytest

from components.config import DEFAULT_MASTER_PORT, ConfigError, Executor, parse_stack_config
from tests.support.program import dev_raw, mp_raw


def refusal(raw: dict) -> str:
    with pytest.raises(ConfigError) as info:
        parse_stack_config(raw)
    return str(info.value)


def test_ray_is_the_default_executor_and_master_port_has_vllm_s_default():
    cfg = parse_stack_config(dev_raw())
    assert cfg.cluster.executor is Executor.RAY
    assert cfg.cluster.master_port == DEFAULT_MASTER_PORT == 29501


def test_mp_loads_with_its_master_port():
    cfg = parse_stack_config(mp_raw(3, master_port=29600))
    assert cfg.cluster.executor is Executor.MP and cfg.cluster.master_port == 29600


@pytest.mark.parametrize(
    ("case", "mutate", "expected"),
    [
        (
            "master_port under ray",
            lambda raw: raw.update(cluster={"master_port": 29600}),
            ["cluster.master_port:", "not used by executor 'ray'", "'mp'"],
        ),
        (
            "ray section under mp",
            lambda raw: raw.update(ray={"port": 6380}),
            ["ray: not used by cluster.executor 'mp'", "remove it"],
        ),
        (
            "ray ports under mp",
            lambda raw: raw["nodes"][1].update(ray_ports={"node_manager_port": 17111}),
            ["nodes.1.ray_ports: not used by cluster.executor 'mp'"],
        ),
        (
            "ray version under mp",
            lambda raw: raw.update(image={"ray_version": "==2.49.1"}),
            ["image.ray_version: not used by cluster.executor 'mp'"],
        ),
        (
            "uneven gpus",
            lambda raw: raw["nodes"][1].update(gpus=2) or raw["serve"].update(tensor_parallel_size=3),
            ["nodes.1.gpus:", "spark-2 has 2 GPUs", "the head spark-1 has 1", "same gpus"],
        ),
        (
            "world over the nodes",
            lambda raw: raw["serve"].update(tensor_parallel_size=4),
            ["serve.tensor_parallel_size:", "= 4", "2 GPUs"],
        ),
        ("unknown executor", lambda raw: raw["cluster"].update(executor="slurm"), ["cluster.executor:"]),
        ("unknown cluster key", lambda raw: raw["cluster"].update(nnodes=2), ["cluster.nnodes: unknown key"]),
        ("bad master port", lambda raw: raw["cluster"].update(master_port=0), ["cluster.master_port:"]),
        (
            "node rank as an extra arg",
            lambda raw: raw["serve"].update(extra_args=["--node-rank", "1"]),
            ["serve.extra_args:", "cluster.executor"],
        ),
        (
            "master port as an extra arg",
            lambda raw: raw["serve"].update(extra_args=["--master-port=1"]),
            ["serve.extra_args:", "cluster.master_port"],
        ),
    ],
)
def test_a_key_the_executor_ignores_or_a_bad_split_is_refused(case, mutate, expected):
    raw = mp_raw()
    if case == "master_port under ray":
        raw = dev_raw()
    mutate(raw)
    message = refusal(raw)
    for part in expected:
        assert part in message, f"{case}: {part!r} not in:\n{message}"


def test_the_ray_section_stays_accepted_under_ray():
    raw = dev_raw()
    raw["ray"] = {"port": 6380}
    raw["cluster"] = {"executor": "ray"}
    assert parse_stack_config(raw).ray.port == 6380


def test_two_gpus_per_node_split_evenly():
    cfg = parse_stack_config(mp_raw(2, gpus=2))
    assert cfg.serve.tensor_parallel_size == 4 and {n.gpus for n in cfg.nodes} == {2}


def test_a_master_port_that_is_the_serving_port_is_refused():
    raw = mp_raw(2)
    raw["cluster"]["master_port"] = raw["serve"].get("port", 8000)
    raw["serve"] = {**raw["serve"], "port": raw["cluster"]["master_port"]}
    assert "cluster.master_port" in refusal(raw) and "serve.port too" in refusal(raw)
