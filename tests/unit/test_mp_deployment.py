"""The whole graph under `cluster.executor: mp` (issue 34), under Pulumi mocks, for 2 and 3 nodes: one
vLLM container per node and no Ray container or volume; headless ranks before the head; the gate."""

from __future__ import annotations

import pytest

from components.readiness_gate.programs import probe_argv
from tests.support.program import mp_stack_config
from tests.unit.test_deployment import (
    CHECK,
    GATE,
    SECRETS,
    Graph,
    cluster_containers,
    envs,
    run_graph,
    unsecret,
)


@pytest.fixture(params=[2, 3], ids=["2-nodes", "3-nodes"])
def mp(request, monkeypatch) -> Graph:
    return run_graph(monkeypatch, mp_stack_config(request.param))


def workers(graph: Graph) -> list[str]:
    return graph.run.outputs["nodes"][1:]


def test_one_vllm_container_per_node_and_nothing_of_ray(mp):
    nodes = mp.run.outputs["nodes"]
    containers = sorted(c.name for c in cluster_containers(mp))
    assert containers == sorted(["qwen35-vllm", *(f"qwen35-vllm-headless-{n}" for n in nodes[1:])])
    # The one volume per node is the compile cache's (and the watchdog's state on the head); Ray's
    # temp volume is not there.
    volumes = {v.name for v in mp.run.by_type("docker:index/volume:Volume")}
    assert volumes == {f"qwen35-compile-cache-{n}" for n in nodes} | {"qwen35-health"}
    for resource in mp.run.resources:
        assert "ray" not in resource.name, resource.name
    assert mp.provider_of("qwen35-vllm") == "qwen35-docker-spark-1"
    for node in nodes[1:]:
        assert mp.provider_of(f"qwen35-vllm-headless-{node}") == f"qwen35-docker-{node}"
        name = mp.container(f"qwen35-vllm-headless-{node}").inputs["name"]
        assert name == f"qwen35-vllm-rank{nodes.index(node)}"
    assert mp.container("qwen35-vllm").inputs["name"] == "qwen35-vllm"


def test_each_rank_s_command_line(mp):
    nodes = mp.run.outputs["nodes"]
    revision = mp.run.outputs["checkpoints"]["spark-1"]["revision"]
    for rank, node in enumerate(nodes):
        name = "qwen35-vllm" if rank == 0 else f"qwen35-vllm-headless-{node}"
        inputs = mp.container(name).inputs
        assert inputs["entrypoints"] == ["vllm"]
        cmd = inputs["command"]
        assert cmd[:2] == ["serve", "Qwen/Qwen3.5-122B-A10B-FP8"]
        for flag, value in [
            ("--distributed-executor-backend", "mp"),
            ("--tensor-parallel-size", str(len(nodes))),
            ("--nnodes", str(len(nodes))),
            ("--node-rank", str(rank)),
            ("--master-addr", "192.168.200.12"),
            ("--master-port", "29501"),
            ("--revision", revision),
        ]:
            assert cmd[cmd.index(flag) + 1] == value, (name, flag)
        assert ("--headless" in cmd) is (rank > 0), name
        env = envs(mp, name)
        assert env["VLLM_HOST_IP"] == f"192.168.200.{12 + rank}" and "RAY_ADDRESS" not in env
        assert env["NCCL_SOCKET_IFNAME"] == "enp1s0f0np0" and env["HF_HUB_OFFLINE"] == "1"
        assert ("VLLM_API_KEY" in env) is (rank == 0) and env["HF_TOKEN"] == SECRETS["hf_token"]
        assert unsecret(inputs["envs"])[1], f"{name}: envs carry a secret and must be marked secret"
        assert mp.options[name]["delete_before_replace"] is True


def test_headless_ranks_are_created_before_the_head_and_the_gate_waits_for_all(mp):
    deps, order = mp.deps, [r.name for r in mp.run.resources]
    ranks = [f"qwen35-vllm-headless-{n}" for n in workers(mp)]
    assert set(ranks) <= deps["qwen35-vllm"]
    assert max(order.index(r) for r in ranks) < order.index("qwen35-vllm") < order.index("qwen35-ready")
    assert {"qwen35-vllm", *ranks} <= deps["qwen35-ready"]
    for name in ["qwen35-vllm", *ranks]:
        assert "qwen35-model-support" in deps[name]
        node = "spark-1" if name == "qwen35-vllm" else name.removeprefix("qwen35-vllm-headless-")
        assert {f"qwen35-image-{node}", f"qwen35-checkpoint-{node}", f"qwen35-claim-{node}"} <= deps[name]


def test_the_gate_probes_without_ray_and_watches_every_rank(mp):
    (gate,) = mp.run.by_type(GATE)
    inputs = gate.inputs
    nodes = mp.run.outputs["nodes"]
    assert inputs.get("ray_container") is None and inputs["log_container"] == "qwen35-vllm"
    assert inputs["server_id"] == "qwen35-vllm-id"
    assert sorted(inputs["container_ids"]) == sorted(
        ["spark-1/qwen35-vllm", *(f"{n}/qwen35-vllm-rank{i}" for i, n in enumerate(nodes) if i)]
    )
    argv = probe_argv(inputs, 60)
    assert "--no-ray-check" in argv and "--ray-container" not in argv and "--expect-node" not in argv


def test_the_model_support_check_skips_the_ray_proof_and_proves_the_head_s_argv(mp):
    (check,) = mp.run.by_type(CHECK)
    assert check.inputs["cluster"] == {"executor": "mp"}
    argv = check.inputs["serve_argv"]
    assert argv[argv.index("--node-rank") + 1] == "0" and "--headless" not in argv


def test_outputs_list_one_server_container_per_node(mp):
    out = mp.run.outputs
    assert out["containers"] == {
        node: ["qwen35-vllm", "qwen35-watchdog"]
        if i == 0
        else [f"qwen35-vllm-rank{i}", "qwen35-health-agent"]
        for i, node in enumerate(out["nodes"])
    }
    assert out["dashboard"] is None
    assert out["endpoint"] == "http://10.1.230.180:8000/v1"


def test_an_image_without_ray_is_accepted_as_prebuilt(monkeypatch):
    cfg = mp_stack_config(2)
    cfg["qwen35-spark:image"] = {"strategy": "prebuilt", "prebuilt": "nvcr.io/nvidia/vllm:26.01-py3"}
    graph = run_graph(monkeypatch, cfg)
    (check,) = graph.run.by_type(CHECK)
    assert check.inputs["image"] == "nvcr.io/nvidia/vllm:26.01-py3"
    assert check.inputs["cluster"] == {"executor": "mp"}


def test_the_head_claims_the_master_port_and_no_ray_port(mp):
    claims = {r.name: r.inputs["ports"] for r in mp.run.resources if r.name.startswith("qwen35-claim-")}
    # And the watchdog's port on the head, an agent's on every worker.
    assert claims["qwen35-claim-spark-1"] == [[8000, 8000], [29501, 29501], [29592, 29592]]
    for node in workers(mp):
        assert claims[f"qwen35-claim-{node}"] == [[29593, 29593]]
