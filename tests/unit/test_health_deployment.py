"""The health stage under Pulumi mocks: after the gate, the state volume on the head, an
agent on every worker, then the watchdog; each on its node's own image ID, its config from the memory
fit, the secret only in secret envs; the claims, `scrape_targets`, `containers` and `health` outputs;
nothing under `health.mode: off`. Ray and mp, 2 and 3 nodes."""

from __future__ import annotations

import copy
import json

import pytest

from components.node_programs import health_wire
from tests.support import program
from tests.support.program import FAKE_HEALTH_SECRET, mp_stack_config, stack_config
from tests.unit.test_deployment import CONTAINER, SECRETS, Graph, _without_secrets, envs, run_graph, unsecret

HEALTH_SECRET = "pulumi-python:dynamic/qwen35:HealthSecret"
VOLUME = "docker:index/volume:Volume"


def ray_stack_config(nodes: int) -> dict:
    """The dev stack (Ray) on `nodes` Sparks, TP = nodes."""
    cfg = copy.deepcopy(stack_config("dev"))
    cfg["qwen35-spark:nodes"] = [
        {
            "name": f"spark-{i + 1}",
            "host": f"10.1.230.{180 + i}",
            "fabric_ip": f"192.168.200.{12 + i}",
            **({"role": "head"} if i == 0 else {}),
        }
        for i in range(nodes)
    ]
    cfg["qwen35-spark:serve"] = {**cfg["qwen35-spark:serve"], "tensor_parallel_size": nodes}
    return cfg


CASES = {
    "ray-2": lambda: ray_stack_config(2),
    "ray-3": lambda: ray_stack_config(3),
    "mp-2": lambda: mp_stack_config(2),
    "mp-3": lambda: mp_stack_config(3),
}


@pytest.fixture(params=sorted(CASES))
def graph(request, monkeypatch) -> Graph:
    return run_graph(monkeypatch, CASES[request.param]())


def workers(graph: Graph) -> list[str]:
    return graph.run.outputs["nodes"][1:]


def health_config_of(graph: Graph, name: str) -> dict:
    return json.loads(envs(graph, name)[health_wire.CONFIG_ENV])


def test_the_stage_follows_the_gate_agents_before_the_watchdog(graph):
    deps, order = graph.deps, [r.name for r in graph.run.resources]
    agents = [f"qwen35-health-agent-{n}" for n in workers(graph)]
    assert (
        graph.provider_of("qwen35-health") == graph.provider_of("qwen35-watchdog") == "qwen35-docker-spark-1"
    )
    assert graph.run.named("qwen35-health").inputs["name"] == "qwen35-health"
    for agent in agents:
        node = agent.removeprefix("qwen35-health-agent-")
        assert graph.provider_of(agent) == f"qwen35-docker-{node}"
        assert graph.container(agent).inputs["name"] == "qwen35-health-agent"
        assert {"qwen35-ready", f"qwen35-claim-{node}"} <= deps[agent]
    assert {"qwen35-ready", "qwen35-health", *agents} <= deps["qwen35-watchdog"]
    assert "qwen35-ready" in deps["qwen35-health"]
    assert order.index("qwen35-ready") < order.index("qwen35-health")
    assert max(order.index(a) for a in agents) < order.index("qwen35-watchdog")
    # The state volume goes with the stack (the restart history is the stack's, not the node's).
    assert graph.options["qwen35-health"]["retain_on_delete"] is False
    assert graph.options["qwen35-watchdog"]["delete_before_replace"] is True


def test_each_runs_its_node_s_image_id_without_privilege(graph):
    ids = {node: placed["image_id"] for node, placed in graph.run.outputs["images"].items()}
    on = {"qwen35-watchdog": "spark-1", **{f"qwen35-health-agent-{n}": n for n in workers(graph)}}
    for name, node in on.items():
        inputs = graph.container(name).inputs
        assert inputs["image"] == ids[node], name
        assert inputs["privileged"] is False and not inputs.get("gpus") and not inputs.get("devices")
        assert inputs["restart"] == "unless-stopped" and inputs["networkMode"] == "host"
        mounts = {v["containerPath"]: v.get("hostPath") or v.get("volumeName") for v in inputs["volumes"]}
        assert mounts[health_wire.DOCKER_SOCKET_MOUNT] == "/var/run/docker.sock"
        assert (health_wire.STATE_DIR in mounts) is (name == "qwen35-watchdog")
        if name == "qwen35-watchdog":
            assert mounts[health_wire.STATE_DIR] == "qwen35-health"


def test_the_secret_reaches_only_secret_uploads_never_an_env_or_output(graph):
    # (under mp a second one keys the world digest: components/mp_executor.py)
    (secret,) = [r for r in graph.run.by_type(HEALTH_SECRET) if r.name == "qwen35-health-secret"]
    assert secret.inputs["owner"] == "qwen35-spark/dev" and secret.inputs["prefix"] == "qwen35"
    for name in ["qwen35-watchdog", *(f"qwen35-health-agent-{n}" for n in workers(graph))]:
        inputs = graph.container(name).inputs
        value, is_secret = unsecret(inputs["envs"])
        # Not in the environment: the provider logs `docker inspect` (the environment) as a debug
        # event, where the engine masks only config secrets.
        assert FAKE_HEALTH_SECRET not in repr(value) and health_wire.SECRET_ENV not in repr(value), name
        assert (f"{health_wire.API_KEY_ENV}={SECRETS['api_key']}" in value) is (name == "qwen35-watchdog")
        assert is_secret is (name == "qwen35-watchdog"), name
        uploads, all_secret = unsecret(inputs["uploads"])
        (upload,) = [unsecret(u)[0] for u in uploads]
        content, content_secret = unsecret(upload["content"])
        assert upload["file"] == health_wire.SECRET_FILE and upload["permissions"] == "0600", name
        assert content == FAKE_HEALTH_SECRET and (all_secret or content_secret), name
        assert graph.options[name]["additional_secret_outputs"] == ["envs", "uploads"], name
    for resource in graph.run.resources:
        assert FAKE_HEALTH_SECRET not in repr(_without_secrets(resource.inputs)), resource.name
    assert FAKE_HEALTH_SECRET not in repr(graph.run.outputs)
    assert not graph.run.secret_outputs


def test_the_claims_hold_the_health_ports(graph):
    claims = {r.name: r.inputs["ports"] for r in graph.run.resources if r.name.startswith("qwen35-claim-")}
    assert [29592, 29592] in claims["qwen35-claim-spark-1"]
    assert [29593, 29593] not in claims["qwen35-claim-spark-1"]
    for node in workers(graph):
        assert [29593, 29593] in claims[f"qwen35-claim-{node}"]


def test_the_outputs_name_the_health_containers_and_the_scrape_targets(graph):
    out = graph.run.outputs
    assert out["containers"]["spark-1"][-1] == "qwen35-watchdog"
    for node in workers(graph):
        assert out["containers"][node][-1] == "qwen35-health-agent"
    assert out["health"] == {
        "mode": "enforce",
        "watchdog": "qwen35-watchdog",
        "agents": {n: "qwen35-health-agent" for n in workers(graph)},
        "state_url": "http://192.168.200.12:29592/state",
        "volume": "qwen35-health",
    }
    jobs = {t["labels"]["job"]: t for t in out["scrape_targets"]}
    assert jobs["qwen35-watchdog"]["targets"] == ["192.168.200.12:29592"]
    assert jobs["vllm"]["targets"] == ["10.1.230.180:8000"]
    # The dev stack pins no Ray metrics port: Ray picks one at random, which no file can name.
    assert "ray" not in jobs
    assert all(set(t) == {"targets", "labels"} for t in out["scrape_targets"])


def test_the_watchdog_config_describes_the_cluster(graph):
    cfg = health_config_of(graph, "qwen35-watchdog")
    assert cfg["node"] == "spark-1" and cfg["mode"] == "enforce" and cfg["prefix"] == "qwen35"
    assert [n["name"] for n in cfg["nodes"]] == graph.run.outputs["nodes"]
    # The mocks record no memory fit: no node's need is known, and the config says so.
    assert all(n["need_bytes"] is None for n in cfg["nodes"])
    for node in workers(graph):
        assert health_config_of(graph, f"qwen35-health-agent-{node}")["node"] == node


def test_the_memory_fit_gives_each_node_its_need(monkeypatch):
    original = program.default_fake_outputs

    def with_fit(args):
        outs = original(args)
        if args.typ == "pulumi-python:dynamic/qwen35:ModelSupportCheck":
            outs["memory_fit"] = {
                "fits": True,
                "request_gb": 2.0,
                "per_rank": {"spark-1": {"weights_gb": 60.0}, "spark-2": {"weights_gb": 61.0}},
            }
        return outs

    monkeypatch.setattr(program, "default_fake_outputs", with_fit)
    graph = run_graph(monkeypatch, ray_stack_config(2))
    needs = {n["name"]: n["need_bytes"] for n in health_config_of(graph, "qwen35-watchdog")["nodes"]}
    assert needs["spark-1"] < needs["spark-2"] and needs["spark-1"] > 60 * 10**9


def test_a_ray_metrics_port_is_a_scrape_target(monkeypatch):
    cfg = ray_stack_config(2)
    cfg["qwen35-spark:nodes"][1]["ray_ports"] = {"metrics_export_port": 8090}
    out = run_graph(monkeypatch, cfg).run.outputs
    (ray,) = [t for t in out["scrape_targets"] if t["labels"]["job"] == "ray"]
    assert ray == {
        "targets": ["192.168.200.13:8090"],
        "labels": {"job": "ray", "stack": "qwen35", "node": "spark-2"},
    }


@pytest.mark.parametrize("make", [lambda: ray_stack_config(3), lambda: mp_stack_config(2)], ids=["ray", "mp"])
def test_off_declares_nothing_and_claims_no_health_port(monkeypatch, make):
    cfg = make()
    cfg["qwen35-spark:health"] = {"mode": False}  # YAML 1.1's unquoted `off`
    graph = run_graph(monkeypatch, cfg)
    names = {r.name for r in graph.run.resources}
    assert not {n for n in names if "health" in n or "watchdog" in n}, names
    # Only the mp world's key, which is not the health stage's.
    assert [r.name for r in graph.run.by_type(HEALTH_SECRET)] in ([], ["qwen35-mp-world-key"])
    for container in graph.run.by_type(CONTAINER):
        assert health_wire.SECRET_ENV not in repr(container.inputs)
    for claim in (r for r in graph.run.resources if r.name.startswith("qwen35-claim-")):
        assert [29592, 29592] not in claim.inputs["ports"] and [29593, 29593] not in claim.inputs["ports"]
    out = graph.run.outputs
    assert out["health"]["mode"] == "off" and out["health"]["watchdog"] is None
    assert [t["labels"]["job"] for t in out["scrape_targets"]] == ["vllm"]
    assert not any("watchdog" in c or "agent" in c for cs in out["containers"].values() for c in cs)


def test_report_mode_reaches_the_programs(monkeypatch):
    cfg = ray_stack_config(2)
    cfg["qwen35-spark:health"] = {"mode": "report", "interval_s": 2, "deadline_s": 1}
    graph = run_graph(monkeypatch, cfg)
    watchdog = health_config_of(graph, "qwen35-watchdog")
    assert (watchdog["mode"], watchdog["interval_s"], watchdog["deadline_s"]) == ("report", 2, 1)
    assert graph.run.outputs["health"]["mode"] == "report"


@pytest.mark.parametrize("executor", ["ray", "mp"])
def test_every_container_declares_its_volumes_in_the_order_the_provider_reads_them(monkeypatch, executor):
    """`volumes` is a set the provider reads back ordered by container path, and the bridge rebuilds
    its inputs by position: the watchdog, declared socket first, came back with its socket's host
    path and its state volume's name swapped out, and the next refresh wanted to replace it."""
    graph = run_graph(monkeypatch, mp_stack_config(2) if executor == "mp" else ray_stack_config(2))
    for container in graph.run.by_type(CONTAINER):
        paths = [v["containerPath"] for v in container.inputs.get("volumes") or []]
        assert paths == sorted(paths), (container.name, paths)
    assert len(graph.container("qwen35-watchdog").inputs["volumes"]) >= 2
