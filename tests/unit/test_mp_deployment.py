"""The whole graph under `cluster.executor: mp`, under Pulumi mocks, for 2 and 3 nodes: one
vLLM container per node and no Ray container or volume; headless ranks before the head; the gate;
one world: a change to any rank changes every rank's inputs (so the engine replaces them all)."""

from __future__ import annotations

import pytest

import tests.support.program as program
from components.mp_executor import WORLD_ENV
from components.readiness_gate.programs import probe_argv
from tests.support.program import mp_stack_config, stack_config
from tests.unit.test_deployment import (
    CHECK,
    CONTAINER,
    GATE,
    NODE_IMAGE,
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
    # And fabric.probe_port (29590): FabricCheck is on, and each worker's probe listens there; and
    # the watchdog's port on the head, an agent's on every worker.
    assert claims["qwen35-claim-spark-1"] == [[8000, 8000], [29501, 29501], [29590, 29590], [29592, 29592]]
    for node in workers(mp):
        assert claims[f"qwen35-claim-{node}"] == [[29593, 29593]]


def rank_names(graph: Graph) -> list[str]:
    """Every rank's resource name, in rank order."""
    return ["qwen35-vllm", *(f"qwen35-vllm-headless-{n}" for n in workers(graph))]


def world(graph: Graph, name: str) -> str:
    return envs(graph, name)[WORLD_ENV]


def test_every_rank_carries_the_same_world_and_no_secret_in_plain(mp):
    worlds = {world(mp, name) for name in rank_names(mp)}
    assert len(worlds) == 1 and next(iter(worlds)).startswith("hmac-sha256:"), worlds
    for name in rank_names(mp):
        inputs = mp.container(name).inputs
        # The digest covers the secrets: it rides in the environment, which the stack keeps secret.
        assert unsecret(inputs["envs"])[1], name
        plain = repr({k: v for k, v in inputs.items() if k != "envs"})
        assert not any(secret in plain for secret in SECRETS.values()), name


def with_worker_image_id(monkeypatch, node: str, image_id: str) -> None:
    """The mocks' NodeImage on `node` reports `image_id` (as a re-copied image with a new ID would)."""
    original = program.default_fake_outputs

    def fake(args):
        out = original(args)
        if args.typ == NODE_IMAGE and args.name == f"qwen35-image-{node}":
            out = {**out, "image_id": image_id}
        return out

    monkeypatch.setattr(program, "default_fake_outputs", fake)


def inputs_by_rank(graph: Graph) -> dict[str, dict]:
    return {name: graph.container(name).inputs for name in rank_names(graph)}


@pytest.mark.parametrize("nodes", [2, 3])
def test_a_changed_worker_image_id_changes_every_rank_s_inputs(monkeypatch, nodes):
    before = run_graph(monkeypatch, mp_stack_config(nodes))
    again = run_graph(monkeypatch, mp_stack_config(nodes))
    # The digest is a function of the inputs: the same program gives the same world (no replacement).
    assert inputs_by_rank(again) == inputs_by_rank(before)
    changed = workers(before)[-1]
    with_worker_image_id(monkeypatch, changed, "sha256:" + "9" * 64)
    after = run_graph(monkeypatch, mp_stack_config(nodes))
    assert after.container(f"qwen35-vllm-headless-{changed}").inputs["image"] == "sha256:" + "9" * 64
    for name in rank_names(before):
        # Every rank's environment differs (envs replace a container), by the world's value only.
        old, new = envs(before, name), envs(after, name)
        assert old[WORLD_ENV] != new[WORLD_ENV], name
        assert {k: v for k, v in old.items() if k != WORLD_ENV} == {
            k: v for k, v in new.items() if k != WORLD_ENV
        }, name
    assert len({world(after, name) for name in rank_names(after)}) == 1


@pytest.mark.parametrize("key", ["api_key", "hf_token"])
def test_a_rotated_secret_changes_every_rank_s_world(monkeypatch, key):
    """The API key is only in the head's environment: its rotation still replaces the headless ranks,
    whose world covers the key (inside the keyed digest)."""
    before = run_graph(monkeypatch, mp_stack_config(3))
    after = run_graph(monkeypatch, mp_stack_config(3), secrets={**SECRETS, key: SECRETS[key] + "-rotated"})
    for name in rank_names(before):
        assert world(before, name) != world(after, name), name


def test_a_change_to_one_rank_s_mounts_changes_every_rank_s_world(monkeypatch):
    """Not only image, command and environment: the whole container (here the worker's HF cache)."""
    before = run_graph(monkeypatch, mp_stack_config(2))
    cfg = mp_stack_config(2)
    cfg["qwen35-spark:model"] = {**cfg.get("qwen35-spark:model", {}), "cache_dirs": {"spark-2": "/data/hf"}}
    after = run_graph(monkeypatch, cfg)
    assert (
        after.container("qwen35-vllm-headless-spark-2").inputs["volumes"]
        != before.container("qwen35-vllm-headless-spark-2").inputs["volumes"]
    )
    assert (
        after.container("qwen35-vllm").inputs["volumes"] == before.container("qwen35-vllm").inputs["volumes"]
    )
    for name in rank_names(before):
        assert world(before, name) != world(after, name), name


def test_a_ray_stack_carries_no_world(monkeypatch):
    dev = run_graph(monkeypatch, stack_config("dev"))
    for container in dev.run.by_type(CONTAINER):
        assert WORLD_ENV not in envs(dev, container.name), container.name
        labels = {label["label"] for label in container.inputs["labels"]}
        assert labels == {"qwen35.role", "qwen35.node"}, container.name


def test_the_gate_reads_each_rank_s_log_on_its_own_node_judged_by_the_node_proof_s_mode(mp):
    (gate,) = mp.run.by_type(GATE)
    inputs = gate.inputs
    nodes = mp.run.outputs["nodes"]
    where = {name: (spec["node"]["name"], spec["container"]) for name, spec in inputs["serving_logs"].items()}
    assert where == {n: (n, "qwen35-vllm" if i == 0 else f"qwen35-vllm-rank{i}") for i, n in enumerate(nodes)}
    assert all(spec["node"]["known_hosts"] for spec in inputs["serving_logs"].values())
    assert sorted(inputs["nccl_fabric"]) == sorted(nodes)
    assert inputs["transport_mode"] == "enforce"  # the stack's fabric.node_proof (the default)
