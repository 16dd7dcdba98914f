"""The whole graph under Pulumi mocks, for the dev stack and a 4-node TP-4 stack: which resources, on
which provider, in which order, with which inputs; secrets stay secret; the stack outputs."""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass

import pulumi
import pytest

from tests.support.program import (
    ANSWER_CHECK,
    FAKE_HEALTH_SECRET,
    ProgramRun,
    mp_stack_config,
    run_program,
    stack_config,
)

CONTAINER = "docker:index/container:Container"
NODE_IMAGE = "pulumi-python:dynamic/qwen35:NodeImage"
GATE = "pulumi-python:dynamic/qwen35:ReadinessGate"
IMAGE_BUILD = "pulumi-python:dynamic/qwen35:ImageBuild"
CHECK = "pulumi-python:dynamic/qwen35:ModelSupportCheck"
CHECKPOINT = "pulumi-python:dynamic/qwen35:Checkpoint"
FABRIC = "pulumi-python:dynamic/qwen35:FabricCheck"
HEALTH_SECRET = "pulumi-python:dynamic/qwen35:HealthSecret"
BENCH = "pulumi-python:dynamic/qwen35:ServeBench"
SECRETS = {"hf_token": "hf_token_value_123", "api_key": "sk-api-key-value-456"}


def four_node_config() -> dict:
    """A 4-Spark stack (TP 4), the second pair reached through the head, with a GID index."""
    cfg = copy.deepcopy(stack_config("dev"))
    cfg["qwen35-spark:nodes"] = [
        {"name": "spark-1", "role": "head", "host": "10.1.230.180", "fabric_ip": "192.168.200.12"},
        {"name": "spark-2", "host": "10.1.230.181", "fabric_ip": "192.168.200.13"},
        {"name": "spark-3", "host": "192.168.200.14", "fabric_ip": "192.168.200.14", "proxy_jump": "spark-1"},
        {"name": "spark-4", "host": "192.168.200.15", "fabric_ip": "192.168.200.15", "proxy_jump": "spark-1"},
    ]
    cfg["qwen35-spark:serve"] = {**cfg["qwen35-spark:serve"], "tensor_parallel_size": 4}
    cfg["qwen35-spark:fabric"] = {**cfg["qwen35-spark:fabric"], "ib_gid_index": 3}
    return cfg


@dataclass
class Graph:
    run: ProgramRun
    deps: dict[str, set[str]]
    options: dict[str, dict]

    def container(self, name: str):
        return self.run.named(name)

    def provider_of(self, name: str) -> str:
        # Mock provider references are `urn::id`; the id is `<provider name>-id`.
        return (self.run.named(name).provider or "").rsplit("::", 1)[-1].removesuffix("-id")


def run_graph(monkeypatch, config: dict, secrets: dict | None = SECRETS, preview: bool = False) -> Graph:
    """Run the program under mocks, also recording each resource's dependencies and options."""
    deps: dict[str, set[str]] = {}
    options: dict[str, dict] = {}
    original = pulumi.runtime.mocks.MockMonitor.RegisterResource

    def recording(self, request):
        name = request.name
        deps[name] = {urn.rsplit("::", 1)[-1] for urn in request.dependencies}
        options[name] = {
            "delete_before_replace": request.deleteBeforeReplace,
            "additional_secret_outputs": list(request.additionalSecretOutputs),
            "retain_on_delete": request.retainOnDelete,
        }
        return original(self, request)

    monkeypatch.setattr(pulumi.runtime.mocks.MockMonitor, "RegisterResource", recording)
    run = run_program(config, secrets=secrets, preview=preview)
    return Graph(run, deps, options)


@pytest.fixture
def dev(monkeypatch) -> Graph:
    return run_graph(monkeypatch, stack_config("dev"))


@pytest.fixture
def four(monkeypatch) -> Graph:
    return run_graph(monkeypatch, four_node_config())


def hybrid_config() -> dict:
    """The dev stack building the seed's hybrid instead of using the prebuilt image."""
    cfg = copy.deepcopy(stack_config("dev"))
    # The seed's pair (the hybrid's defaults); `prebuilt` is not a hybrid key.
    cfg["qwen35-spark:image"] = {"strategy": "hybrid", "platform": "linux/arm64"}
    return cfg


@pytest.fixture
def hybrid(monkeypatch) -> Graph:
    return run_graph(monkeypatch, hybrid_config())


SECRET_SIG = pulumi.runtime.rpc._special_secret_sig


def unsecret(value):
    """(value, was it marked secret) of an input as the mock monitor received it."""
    if isinstance(value, dict) and value.get(pulumi.runtime.rpc._special_sig_key) == SECRET_SIG:
        return value["value"], True
    return value, False


HEALTH_ROLES = {"watchdog", "health-agent"}


def role_of(container) -> str:
    return next(label["value"] for label in container.inputs["labels"] if label["label"] == "qwen35.role")


def cluster_containers(graph: Graph) -> list:
    """The containers that serve (Ray, vLLM), without the health watchdog and agents."""
    return [c for c in graph.run.by_type(CONTAINER) if role_of(c) not in HEALTH_ROLES]


def envs(graph: Graph, name: str) -> dict[str, str]:
    value, _ = unsecret(graph.container(name).inputs["envs"])
    return dict(e.split("=", 1) for e in value)


CLAIM = "pulumi-python:dynamic/qwen35:StackClaim"
PROOF = "pulumi-python:dynamic/qwen35:NodeProof"
DEV_RESOURCES = {
    ("qwen35:index:Deployment", "qwen35"),
    ("pulumi:providers:docker", "qwen35-docker-spark-1"),
    ("pulumi:providers:docker", "qwen35-docker-spark-2"),
    ("docker:index/volume:Volume", "qwen35-ray-tmp"),
    ("docker:index/volume:Volume", "qwen35-compile-cache-spark-1"),
    ("docker:index/volume:Volume", "qwen35-compile-cache-spark-2"),
    (NODE_IMAGE, "qwen35-image-spark-1"),
    (NODE_IMAGE, "qwen35-image-spark-2"),
    (CHECKPOINT, "qwen35-checkpoint-spark-1"),
    (CHECKPOINT, "qwen35-checkpoint-spark-2"),
    (CHECK, "qwen35-model-support"),
    (PROOF, "qwen35-node-proof"),
    (CONTAINER, "qwen35-ray-head"),
    (CONTAINER, "qwen35-ray-worker-spark-2"),
    (CONTAINER, "qwen35-vllm"),
    (GATE, "qwen35-ready"),
    (ANSWER_CHECK, "qwen35-answers"),
    (BENCH, "qwen35-bench"),
    (CLAIM, "qwen35-claim-spark-1"),
    (CLAIM, "qwen35-claim-spark-2"),
    (FABRIC, "qwen35-fabric-spark-1"),
    (FABRIC, "qwen35-fabric-spark-2"),
    (HEALTH_SECRET, "qwen35-health-secret"),
    ("docker:index/volume:Volume", "qwen35-health"),
    (CONTAINER, "qwen35-health-agent-spark-2"),
    (CONTAINER, "qwen35-watchdog"),
}
BUILD = {("qwen35:index:HybridImage", "qwen35-image"), (IMAGE_BUILD, "qwen35-image-build")}


def test_dev_resource_set(dev):
    # The default strategy (prebuilt) registers no build.
    assert {(r.typ, r.name) for r in dev.run.resources} == DEV_RESOURCES


def test_hybrid_resource_set(hybrid):
    assert {(r.typ, r.name) for r in hybrid.run.resources} == DEV_RESOURCES | BUILD


def test_every_copy_follows_the_built_image_id(hybrid):
    # The trigger is the build's image ID: a rebuild under the same tag re-places the image, and an
    # identical build (same ID) changes nothing downstream; containers run each node's copy's ID.
    from tests.support.program import fake_build_id, fake_image_id

    build = hybrid.run.named("qwen35-image-build")
    built_id = fake_build_id(build.inputs["ref"], "spark-1")
    for node in ("spark-1", "spark-2"):
        assert node_image_of(hybrid, node).inputs["trigger"] == built_id
    assert hybrid.container("qwen35-ray-head").inputs["image"] == fake_image_id(
        build.inputs["ref"], "spark-1"
    )


def test_graft_builds_on_the_head_from_its_own_dockerfile(monkeypatch):
    cfg = copy.deepcopy(stack_config("dev"))
    cfg["qwen35-spark:image"] = {
        "strategy": "graft", "base": "vllm-node:latest", "donor": "hellohal2064/vllm-qwen3.5-gb10:latest",
    }  # fmt: skip
    graph = run_graph(monkeypatch, cfg)
    assert {(r.typ, r.name) for r in graph.run.resources} == DEV_RESOURCES | BUILD
    (build,) = [r for r in graph.run.resources if r.typ == IMAGE_BUILD]
    assert build.inputs["dockerfile"] == "Dockerfile.graft"
    assert build.inputs["context"].endswith("/patches")
    assert build.inputs["node"]["name"] == "spark-1"


@pytest.mark.parametrize("graph_name", ["dev", "four", "hybrid"])
def test_image_copies_form_a_tree_from_the_head(request, graph_name):
    graph: Graph = request.getfixturevalue(graph_name)
    head = node_image_of(graph, "spark-1").inputs
    assert head["source"]["name"] == head["destination"]["name"] == "spark-1"
    for node in graph.run.outputs["nodes"][1:]:
        placed = node_image_of(graph, node)
        source = placed.inputs["source"]["name"]
        assert source != node
        # A node serves as a source only once it holds the image itself.
        assert f"qwen35-image-{source}" in graph.deps[placed.name]
    for node in graph.run.outputs["nodes"]:
        image = node_image_of(graph, node).inputs["image"]
        if graph_name == "hybrid":
            assert image.startswith("vllm-node-qwen35:h-")
        else:
            assert image == "vllm-node:latest"


def test_four_node_resource_set(four):
    containers = sorted(r.name for r in four.run.by_type(CONTAINER))
    assert containers == [
        "qwen35-health-agent-spark-2",
        "qwen35-health-agent-spark-3",
        "qwen35-health-agent-spark-4",
        "qwen35-ray-head",
        "qwen35-ray-worker-spark-2",
        "qwen35-ray-worker-spark-3",
        "qwen35-ray-worker-spark-4",
        "qwen35-vllm",
        "qwen35-watchdog",
    ]
    assert len(four.run.by_type("pulumi:providers:docker")) == 4


@pytest.mark.parametrize("graph_name", ["dev", "four", "hybrid"])
def test_providers(request, graph_name):
    graph: Graph = request.getfixturevalue(graph_name)
    if graph_name == "hybrid":
        # The build runs on the head's daemon over the project's SSH transport, not a docker provider.
        build = graph.run.named("qwen35-image-build")
        assert build.typ == IMAGE_BUILD and build.inputs["node"]["name"] == "spark-1"
        assert build.inputs["node"]["host"] == "10.1.230.180"
    assert graph.provider_of("qwen35-ray-tmp") == "qwen35-docker-spark-1"
    assert graph.provider_of("qwen35-ray-head") == "qwen35-docker-spark-1"
    assert graph.provider_of("qwen35-vllm") == "qwen35-docker-spark-1"
    for worker in graph.run.by_type(CONTAINER):
        if worker.name.startswith("qwen35-ray-worker-"):
            node = worker.name.removeprefix("qwen35-ray-worker-")
            assert graph.provider_of(worker.name) == f"qwen35-docker-{node}"


def ssh_opts(graph: Graph, node: str) -> list[str]:
    # Provider inputs reach the engine JSON-encoded.
    return json.loads(graph.run.named(f"qwen35-docker-{node}").inputs["sshOpts"])


def test_provider_hosts_and_pinned_keys(four):
    for node, host in [("spark-1", "10.1.230.180"), ("spark-3", "192.168.200.14")]:
        assert four.run.named(f"qwen35-docker-{node}").inputs["host"] == f"ssh://aurora@{host}:22"
        opts = ssh_opts(four, node)
        assert "StrictHostKeyChecking=yes" in opts
        assert "UserKnownHostsFile=~/.ssh/qwen35_known_hosts" in opts
    jump = [o for o in ssh_opts(four, "spark-3") if o.startswith("ProxyCommand=")]
    assert jump and jump[0].endswith("aurora@10.1.230.180")
    assert not any(o.startswith("ProxyCommand=") for o in ssh_opts(four, "spark-2"))


def node_image_of(graph: Graph, node: str):
    """The NodeImage that places the image on `node`."""
    found = graph.run.named(f"qwen35-image-{node}")
    assert found.typ == NODE_IMAGE and found.inputs["destination"]["name"] == node
    return found


@pytest.mark.parametrize("graph_name", ["dev", "four", "hybrid"])
def test_dependency_order(request, graph_name):
    graph: Graph = request.getfixturevalue(graph_name)
    deps = graph.deps
    workers = [r.name for r in graph.run.by_type(CONTAINER) if r.name.startswith("qwen35-ray-worker-")]
    # Images: with a build, every placement waits for it.
    for node in graph.run.outputs["nodes"]:
        assert ("qwen35-image-build" in deps[node_image_of(graph, node).name]) is (graph_name == "hybrid")
    # The model-support check runs on the head's image, once it is placed; every container waits for it.
    assert node_image_of(graph, "spark-1").name in deps["qwen35-model-support"]
    fabric = {f"qwen35-fabric-{node}" for node in graph.run.outputs["nodes"]}
    # The node proof after every node's image and fabric check (its port is the probes' own).
    images = {node_image_of(graph, node).name for node in graph.run.outputs["nodes"]}
    assert images | fabric <= deps["qwen35-node-proof"]
    for container in graph.run.by_type(CONTAINER):
        assert "qwen35-model-support" in deps[container.name], container.name
        # Every node's fabric check and the node proof before any container on any node.
        assert fabric | {"qwen35-node-proof"} <= deps[container.name], container.name
    # The head's check first: its recorded MTU is every worker's reference.
    for check in fabric - {"qwen35-fabric-spark-1"}:
        assert "qwen35-fabric-spark-1" in deps[check]
    # One worker's check (and probe) after another: their probes share the head's listener port.
    workers_checks = [f"qwen35-fabric-{n}" for n in graph.run.outputs["nodes"] if n != "spark-1"]
    for before, check in zip(workers_checks[:-1], workers_checks[1:], strict=True):
        assert before in deps[check], (check, deps[check])
    assert not any(c in deps[workers_checks[0]] for c in workers_checks[1:])
    # Containers depend on their own node's image placement.
    assert node_image_of(graph, "spark-1").name in deps["qwen35-ray-head"]
    assert node_image_of(graph, "spark-1").name in deps["qwen35-vllm"]
    for worker in workers:
        node = worker.removeprefix("qwen35-ray-worker-")
        assert node_image_of(graph, node).name in deps[worker]
        # No worker before the head.
        assert "qwen35-ray-head" in deps[worker]
    # No server before every Ray container.
    assert {"qwen35-ray-head", *workers} <= deps["qwen35-vllm"]
    assert "qwen35-ray-tmp" in deps["qwen35-ray-head"] and "qwen35-ray-tmp" in deps["qwen35-vllm"]
    # The gate waits for the server.
    assert "qwen35-vllm" in deps["qwen35-ready"]
    # Registration order agrees (a reader of `pulumi preview` sees the same order).
    order = [r.name for r in graph.run.resources]
    assert order.index("qwen35-model-support") < order.index("qwen35-ray-head")
    assert order.index("qwen35-ray-head") < min(order.index(w) for w in workers)
    assert max(order.index(w) for w in workers) < order.index("qwen35-vllm") < order.index("qwen35-ready")


@pytest.mark.parametrize("graph_name", ["dev", "four"])
def test_containers_run_their_own_nodes_image_id(request, graph_name):
    graph: Graph = request.getfixturevalue(graph_name)
    images = graph.run.outputs["images"]
    # The mocks give each node its own ID (as a containerd-store node has): a container given
    # another node's ID (say, the head's) fails below.
    ids = {node: placed["image_id"] for node, placed in images.items()}
    assert len(set(ids.values())) == len(ids) == len(graph.run.outputs["nodes"]), ids
    containers = graph.run.by_type(CONTAINER)
    assert {c.name for c in containers} >= {"qwen35-ray-head", "qwen35-vllm"}
    for container in containers:
        node = next(label["value"] for label in container.inputs["labels"] if label["label"] == "qwen35.node")
        assert node_image_of(graph, node).inputs["destination"]["name"] == node
        assert container.inputs["image"] == ids[node], f"{container.name} on {node}"


def test_ray_head_container_inputs(dev):
    head = dev.container("qwen35-ray-head").inputs
    assert head["name"] == "qwen35-ray-head"
    assert head["entrypoints"] == ["ray"]
    assert head["command"] == [
        "start", "--head", "--block",
        "--node-ip-address=192.168.200.12",
        "--port=6379",
        "--dashboard-host=192.168.200.12",
        "--dashboard-port=8265",
        "--num-gpus=1",
    ]  # fmt: skip
    assert head["networkMode"] == "host" and head["ipcMode"] == "host"
    assert "pidMode" not in head  # its own PID namespace; only the server shares the host's
    assert head["shmSize"] == 16384
    assert head["gpus"] == "all"
    assert head["devices"] == [
        {"hostPath": "/dev/infiniband", "containerPath": "/dev/infiniband", "permissions": "rwm"}
    ]
    assert {"name": "memlock", "soft": -1, "hard": -1} in head["ulimits"]
    assert {"name": "stack", "soft": 67108864, "hard": 67108864} in head["ulimits"]
    assert head["capabilities"] == {"adds": ["CAP_IPC_LOCK"], "drops": []}
    assert head["privileged"] is False
    assert head["init"] is True
    assert head["restart"] == "unless-stopped"
    assert head["mustRun"] is True
    assert {"hostPath": "/home/aurora/.cache/huggingface", "containerPath": "/root/.cache/huggingface"} in [
        {k: v for k, v in vol.items() if k != "readOnly"} for vol in head["volumes"]
    ]


@pytest.mark.parametrize("graph_name", ["dev", "four"])
def test_fabric_env_on_every_ray_container(request, graph_name):
    graph: Graph = request.getfixturevalue(graph_name)
    fabric_ips = {
        "spark-1": "192.168.200.12",
        "spark-2": "192.168.200.13",
        "spark-3": "192.168.200.14",
        "spark-4": "192.168.200.15",
    }
    for container in cluster_containers(graph):
        node = next(label["value"] for label in container.inputs["labels"] if label["label"] == "qwen35.node")
        env = envs(graph, container.name)
        assert env["VLLM_HOST_IP"] == fabric_ips[node]
        for var in (
            "NCCL_SOCKET_IFNAME",
            "GLOO_SOCKET_IFNAME",
            "TP_SOCKET_IFNAME",
            "UCX_NET_DEVICES",
            "OMPI_MCA_btl_tcp_if_include",
        ):
            assert env[var] == "enp1s0f0np0"
        assert env["NCCL_IB_HCA"] == "rocep1s0f0,roceP2p1s0f0"
        assert env["NCCL_IB_DISABLE"] == "0"
        assert env["RAY_memory_monitor_refresh_ms"] == "0"
        assert env["HF_HOME"] == "/root/.cache/huggingface"
        assert env["HF_TOKEN"] == SECRETS["hf_token"]
        assert ("NCCL_IB_GID_INDEX" in env) == (graph_name == "four")
        # Only Ray nodes drain on SIGTERM: the server (a Ray driver) is started without the setting.
        is_ray = container.name.startswith("qwen35-ray-")
        assert env.get("RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S") == ("0" if is_ray else None)
        if container.name.startswith("qwen35-ray-"):
            assert f"--node-ip-address={fabric_ips[node]}" in container.inputs["command"]
            assert "--num-gpus=1" in container.inputs["command"]
        if container.name.startswith("qwen35-ray-worker-"):
            assert "--address=192.168.200.12:6379" in container.inputs["command"]
            assert "--head" not in container.inputs["command"]


def test_vllm_server_inputs(four):
    server = four.container("qwen35-vllm").inputs
    assert server["entrypoints"] == ["vllm"]
    cmd = server["command"]
    assert cmd[:2] == ["serve", "Qwen/Qwen3.5-122B-A10B-FP8"]
    for flag, value in [
        ("--tensor-parallel-size", "4"),
        ("--pipeline-parallel-size", "1"),
        ("--distributed-executor-backend", "ray"),
        ("--port", "8000"),
        ("--gpu-memory-utilization", "0.85"),
        ("--max-model-len", "32768"),
        ("--served-model-name", "qwen3.5-122b"),
    ]:
        assert cmd[cmd.index(flag) + 1] == value
    env = envs(four, "qwen35-vllm")
    assert env["VLLM_API_KEY"] == SECRETS["api_key"]
    assert env["RAY_ADDRESS"] == "192.168.200.12:6379"
    assert SECRETS["api_key"] not in " ".join(cmd)


def test_containers_replace_delete_first_and_keep_envs_secret(dev):
    for container in dev.run.by_type(CONTAINER):
        assert dev.options[container.name]["delete_before_replace"] is True
        assert "envs" in dev.options[container.name]["additional_secret_outputs"]


def test_secrets_are_secret(dev):
    for container in cluster_containers(dev):
        value, secret = unsecret(container.inputs["envs"])
        assert secret, f"{container.name}: envs carry a secret and must be marked secret"
        assert any(e.startswith("HF_TOKEN=") for e in value)
    assert unsecret(dev.run.named("qwen35-ready").inputs["api_key"]) == (SECRETS["api_key"], True)
    for resource in dev.run.resources:
        plain = repr(_without_secrets(resource.inputs))
        assert SECRETS["api_key"] not in plain and SECRETS["hf_token"] not in plain, resource.name
    assert not dev.run.secret_outputs  # nothing secret is exported at all
    flat = repr(dev.run.outputs)
    assert SECRETS["api_key"] not in flat and SECRETS["hf_token"] not in flat
    # The health secret: in the watchdog's and the agent's secret envs only, never plain.
    for resource in dev.run.resources:
        assert FAKE_HEALTH_SECRET not in repr(_without_secrets(resource.inputs)), resource.name
    assert FAKE_HEALTH_SECRET not in flat


def _without_secrets(value):
    value_, secret = unsecret(value)
    if secret:
        return "<secret>"
    if isinstance(value, dict):
        return {k: _without_secrets(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_without_secrets(v) for v in value]
    return value


def test_without_secrets_no_secret_variables(monkeypatch):
    graph = run_graph(monkeypatch, stack_config("dev"), secrets={})
    for container in graph.run.by_type(CONTAINER):
        env = envs(graph, container.name)
        assert "HF_TOKEN" not in env and "VLLM_API_KEY" not in env
    assert graph.run.named("qwen35-ready").inputs.get("api_key") is None


def test_readiness_gate_inputs(four):
    gate = four.run.named("qwen35-ready").inputs
    assert gate["node"]["name"] == "spark-1" and gate["node"]["host"] == "10.1.230.180"
    assert gate["url"] == "http://127.0.0.1:8000"
    assert gate["model"] == "qwen3.5-122b"
    assert (gate["expect_nodes"], gate["expect_gpus"]) == (4, 4)
    assert sorted(gate["expect_node_ips"]) == ["spark-1", "spark-2", "spark-3", "spark-4"]
    assert gate["expect_node_ips"]["spark-1"] == "192.168.200.12"
    assert gate["deadline_s"] == 3600
    assert (gate["ray_container"], gate["log_container"]) == ("qwen35-ray-head", "qwen35-vllm")
    assert gate["server_id"] == "qwen35-vllm-id"


def test_outputs(four):
    out = four.run.outputs
    assert out["endpoint"] == "http://10.1.230.180:8000/v1"
    assert out["served_model"] == "qwen3.5-122b"
    assert out["dashboard"] == "http://192.168.200.12:8265"
    assert out["head"] == "spark-1"
    assert out["nodes"] == ["spark-1", "spark-2", "spark-3", "spark-4"]
    assert out["containers"] == {
        "spark-1": ["qwen35-ray-head", "qwen35-vllm", "qwen35-watchdog"],
        "spark-2": ["qwen35-ray-worker", "qwen35-health-agent"],
        "spark-3": ["qwen35-ray-worker", "qwen35-health-agent"],
        "spark-4": ["qwen35-ray-worker", "qwen35-health-agent"],
    }
    for node in out["nodes"]:
        assert out["images"][node]["image_id"].startswith("sha256:")
        assert all(layer.startswith("sha256:") for layer in out["images"][node]["layers"])


def test_preview_registers_the_whole_graph(monkeypatch):
    graph = run_graph(monkeypatch, stack_config("dev"), preview=True)
    assert {r.name for r in graph.run.by_type(CONTAINER)} == {
        "qwen35-ray-head",
        "qwen35-ray-worker-spark-2",
        "qwen35-vllm",
        "qwen35-health-agent-spark-2",
        "qwen35-watchdog",
    }
    assert graph.run.named("qwen35-ready")


def test_changing_serve_settings_touches_only_the_server(monkeypatch):
    before = run_graph(monkeypatch, stack_config("dev"))
    cfg = stack_config("dev")
    cfg["qwen35-spark:serve"] = {**cfg["qwen35-spark:serve"], "max_model_len": 8192, "port": 8001}
    after = run_graph(monkeypatch, cfg)
    changed = {
        r.name
        for r in after.run.resources
        if r.typ in (CONTAINER, "docker:index/volume:Volume", IMAGE_BUILD)
        and r.inputs != before.run.named(r.name).inputs
    }
    # The watchdog probes the server's port: its config follows it (the agents' does too, as every
    # health program reads the same stack description).
    assert changed == {"qwen35-vllm", "qwen35-watchdog", "qwen35-health-agent-spark-2"}


def test_vllm_server_sees_the_ray_processes(dev):
    # Ray's driver finds its raylet by scanning local processes: the server needs the host's PIDs.
    server = dev.container("qwen35-vllm").inputs
    assert server["pidMode"] == "host"
    assert server["networkMode"] == "host"


def test_copy_tuning_from_config_reaches_every_node_image():
    from tests.support.program import run_program, stack_config

    config = stack_config("dev")
    config["qwen35-spark:copy"] = {"compression": "gzip", "stall_timeout_s": 30}
    run = run_program(config)
    images = [r for r in run.by_type(NODE_IMAGE) if r.name.startswith("qwen35-image-")]
    assert len(images) == 2
    for image in images:
        assert image.inputs["tuning"] == {"compression": "gzip", "stall_timeout_s": 30}


def test_copy_tree_never_sources_from_a_containerd_store_node(monkeypatch):
    config = four_node_config()
    config["qwen35-spark:nodes"][1]["image_store"] = "containerd"  # spark-2
    graph = run_graph(monkeypatch, config)
    images = {r.name: r.inputs for r in graph.run.by_type(NODE_IMAGE) if r.name.startswith("qwen35-image-")}
    assert len(images) == 4
    sources = {inputs["source"]["name"] for inputs in images.values()}
    assert "spark-2" not in sources and "spark-1" in sources
    assert images["qwen35-image-spark-2"]["destination"]["image_store"] == "containerd"
    # Without the containerd node the tree still fans out: spark-1 and a classic worker serve.
    assert len(sources) >= 2


@pytest.mark.parametrize("graph_name", ["dev", "four"])
def test_resource_names_are_unique(graph_name, request):
    graph = request.getfixturevalue(graph_name)
    names = [(r.typ, r.name) for r in graph.run.resources]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)
    # Pulumi URNs are type + name; container names on one node must not collide either.
    per_node = {}
    for container in graph.run.by_type(CONTAINER):
        key = (graph.provider_of(container.name), container.inputs["name"])
        assert key not in per_node, f"{key} declared twice"
        per_node[key] = container.name


PINNED = "sha256:" + "e" * 64


@pytest.mark.parametrize(
    ("typed", "placed"),
    [
        ("vllm-node:latest", "vllm-node:latest"),
        ("vllm-node", "vllm-node:latest"),
        ("nvcr.io/nvidia/vllm:26.03-py3", "nvcr.io/nvidia/vllm:26.03-py3"),
        ("localhost:5000/vllm-node:nightly", "localhost:5000/vllm-node:nightly"),
        (f"vllm-node:nightly@{PINNED}", "vllm-node:nightly"),
    ],
)
def test_prebuilt_registers_no_build_and_copies_the_configured_reference(monkeypatch, typed, placed):
    cfg = copy.deepcopy(stack_config("dev"))
    cfg["qwen35-spark:image"] = {"strategy": "prebuilt", "prebuilt": typed}
    graph = run_graph(monkeypatch, cfg)
    types = {r.typ for r in graph.run.resources}
    assert IMAGE_BUILD not in types and "qwen35:index:HybridImage" not in types
    for node in ("spark-1", "spark-2"):
        assert node_image_of(graph, node).inputs["image"] == placed
        # Nothing to wait for on the head: the image is there already.
        assert not graph.deps[node_image_of(graph, node).name] & {"qwen35-image-build", "qwen35-image"}
    # The check sees the reference as typed (a pin is verified on the head).
    assert graph.run.named("qwen35-model-support").inputs["image"] == typed


def test_model_support_check_inputs(four):
    check = four.run.named("qwen35-model-support")
    assert check.typ == CHECK
    inputs = check.inputs
    assert inputs["node"]["name"] == "spark-1" and inputs["node"]["host"] == "10.1.230.180"
    assert inputs["node"]["known_hosts"] == "~/.ssh/qwen35_known_hosts"
    # It runs the image the head holds, by ID, as NodeImage reported it.
    assert inputs["image_id"] == four.run.outputs["images"]["spark-1"]["image_id"]
    assert inputs["image"] == "vllm-node:latest"
    assert inputs["mode"] == "enforce"
    assert inputs["memory"] == {
        "nodes": [{"name": f"spark-{i}", "memory_gb": 128.0, "gpus": 1} for i in range(1, 5)],
        "tensor_parallel_size": 4,
        "pipeline_parallel_size": 1,
        "gpu_memory_utilization": 0.85,
        # The recipe's options the memory fit counts (docs/model-support.md, Serving).
        "max_model_len": 32768,
        "kv_cache_dtype": "fp8",
        "speculative_tokens": 1,
        "speculative_method": "mtp",
        "language_model_only": True,
    }
    assert inputs["container_prefix"] == "qwen35"
    # The head's checkpoint: the proof loads it and the memory fit reads its index.
    head_checkpoint = four.run.outputs["checkpoints"]["spark-1"]
    assert inputs["checkpoint_digest"] == head_checkpoint["digest"]
    assert inputs["snapshot_path"] == head_checkpoint["snapshot_path"]
    assert inputs["snapshot_path"].startswith("/home/aurora/")
    assert "qwen35-checkpoint-spark-1" in four.deps["qwen35-model-support"]
    # Not registered on a docker provider: it reaches the head over SSH itself.
    assert not (check.provider or "").startswith("urn:pulumi:stack::project::pulumi:providers:docker")


def test_model_support_outputs(dev):
    support = dev.run.outputs["model_support"]
    assert support["verdict"] == "pass"
    assert set(support) >= {
        "vllm",
        "transformers",
        "architecture",
        "model_type",
        "quantization",
        "memory_fit",
    }


def test_model_check_mode_from_config(monkeypatch):
    cfg = copy.deepcopy(stack_config("dev"))
    cfg["qwen35-spark:image"] = {**cfg["qwen35-spark:image"], "model_check": "report"}
    graph = run_graph(monkeypatch, cfg)
    assert graph.run.named("qwen35-model-support").inputs["mode"] == "report"


def test_node_memory_from_config_reaches_the_check(monkeypatch):
    cfg = copy.deepcopy(stack_config("dev"))
    cfg["qwen35-spark:nodes"][1]["memory_gb"] = 64
    cfg["qwen35-spark:serve"] = {**cfg["qwen35-spark:serve"], "gpu_memory_utilization": 0.7}
    graph = run_graph(monkeypatch, cfg)
    memory = graph.run.named("qwen35-model-support").inputs["memory"]
    assert [n["memory_gb"] for n in memory["nodes"]] == [128.0, 64.0]
    assert memory["gpu_memory_utilization"] == 0.7


@pytest.mark.parametrize(
    ("field", "hostile"),
    [
        ("prebuilt", "vllm-node:latest; docker rm -f x"),
        ("prebuilt", "--privileged"),
        ("prebuilt", "$(curl evil)/x:1"),
        ("base", "vllm-node:`id`"),
        ("donor", "donor@sha256:short"),
    ],
)
def test_hostile_references_register_nothing_and_name_the_field(monkeypatch, field, hostile):
    cfg = copy.deepcopy(stack_config("dev"))
    cfg["qwen35-spark:image"] = {**cfg["qwen35-spark:image"], field: hostile}
    mocks_seen = []
    original = pulumi.runtime.mocks.MockMonitor.RegisterResource

    def recording(self, request):
        mocks_seen.append(request.name)
        return original(self, request)

    monkeypatch.setattr(pulumi.runtime.mocks.MockMonitor, "RegisterResource", recording)
    with pytest.raises(Exception) as info:
        run_program(cfg)
    assert f"image.{field}:" in str(info.value)
    assert mocks_seen == []


# ---- the checkpoint on every node (components/checkpoint) -------------------------------------------


def checkpoint_of(graph: Graph, node: str):
    found = graph.run.named(f"qwen35-checkpoint-{node}")
    assert found.typ == CHECKPOINT and found.inputs["node"]["name"] == node
    return found


def test_checkpoints_fetch_once_on_the_head_and_copy_along_a_tree(four):
    head = checkpoint_of(four, "spark-1").inputs
    assert head.get("source") is None and head["repo"] == "Qwen/Qwen3.5-122B-A10B-FP8"
    assert head["requested_revision"] == "main" and head["source_mode"] == "hub"
    # The token is a secret input of the head's fetch only.
    token, secret = unsecret(head["hf_token"])
    assert token == SECRETS["hf_token"] and secret
    sources = {}
    for node in ("spark-2", "spark-3", "spark-4"):
        placed = checkpoint_of(four, node)
        source = placed.inputs["source"]["name"]
        assert source != node and f"qwen35-checkpoint-{source}" in four.deps[placed.name]
        assert placed.inputs["source_revision"] == four.run.outputs["checkpoints"][source]["revision"]
        assert placed.inputs.get("hf_token") is None
        sources[node] = source
    # 3 workers: 2 rounds (ceil(log2(4))): the head serves one, then both holders serve one each.
    assert sorted(sources.values()).count("spark-1") == 2


def test_containers_wait_for_their_nodes_checkpoint_and_serve_offline_the_pinned_commit(four):
    for node, container in [("spark-1", "qwen35-ray-head"), ("spark-1", "qwen35-vllm")] + [
        (f"spark-{i}", f"qwen35-ray-worker-spark-{i}") for i in (2, 3, 4)
    ]:
        assert f"qwen35-checkpoint-{node}" in four.deps[container]
        assert envs(four, container)["HF_HUB_OFFLINE"] == "1"
    cmd = four.container("qwen35-vllm").inputs["command"]
    sha = four.run.outputs["checkpoints"]["spark-1"]["revision"]
    assert cmd[cmd.index("--revision") + 1] == sha and len(sha) == 40
    assert four.run.outputs["checkpoints"]["spark-2"]["snapshot_path"].endswith(f"/snapshots/{sha}")


def test_without_a_hub_model_there_is_no_checkpoint_and_no_offline_flag(monkeypatch):
    config = stack_config("dev")
    config["qwen35-spark:serve"] = {**config["qwen35-spark:serve"], "model": "/models/qwen35"}
    graph = run_graph(monkeypatch, config)
    assert not graph.run.by_type(CHECKPOINT)
    assert "HF_HUB_OFFLINE" not in envs(graph, "qwen35-ray-head")
    assert "--revision" not in graph.container("qwen35-vllm").inputs["command"]


def test_each_node_mounts_its_own_cache_dir(monkeypatch):
    config = stack_config("dev")
    config["qwen35-spark:model"] = {"cache_dirs": {"spark-2": "/data/hf"}}
    graph = run_graph(monkeypatch, config)
    assert checkpoint_of(graph, "spark-2").inputs["cache_dir"] == "/data/hf"
    mounts = graph.container("qwen35-ray-worker-spark-2").inputs["volumes"]
    assert any(m.get("hostPath") == "/data/hf" for m in mounts)
    assert (
        checkpoint_of(graph, "spark-2").inputs["source_cache_dir"]
        == checkpoint_of(graph, "spark-1").inputs["cache_dir"]
    )


def test_without_a_checkpoint_the_check_proves_the_fixture_configs(monkeypatch):
    config = stack_config("dev")
    config["qwen35-spark:serve"] = {**config["qwen35-spark:serve"], "model": "/models/qwen35"}
    graph = run_graph(monkeypatch, config)
    inputs = graph.run.named("qwen35-model-support").inputs
    assert inputs.get("checkpoint_digest") is None and inputs.get("snapshot_path") is None
    assert not {d for d in graph.deps["qwen35-model-support"] if "checkpoint" in d}


@pytest.mark.parametrize("graph_name", ["dev", "hybrid"])
def test_one_definition_of_the_reference_every_node_holds(request, graph_name):
    # `status` asks the nodes for `image_ref(config.image)`: it must be what NodeImage places.
    from components.config import parse_stack_config
    from components.layout import image_ref

    raw = hybrid_config() if graph_name == "hybrid" else stack_config("dev")
    config = parse_stack_config({k.split(":", 1)[1]: v for k, v in raw.items()})
    graph: Graph = request.getfixturevalue(graph_name)
    for node in ("spark-1", "spark-2"):
        assert node_image_of(graph, node).inputs["image"] == image_ref(config.image)


def test_the_layout_s_values_keep_their_earlier_names():
    # status takes them from the layout; the graph, the bench and the lab tests from where they were.
    from components import checkpoint, layout
    from components.checkpoint import fan_out
    from components.image_build import component

    assert component.image_ref is layout.image_ref and component.content_tag is layout.content_tag
    assert component.build_args is layout.build_args and component.PATCH_DIR == layout.PATCH_DIR
    assert fan_out.node_cache_dir is checkpoint.node_cache_dir is layout.node_cache_dir


def unpinned_config(**fabric) -> dict:
    """The dev stack without the old cluster-wide HCA list: each node's FabricCheck decides."""
    cfg = copy.deepcopy(stack_config("dev"))
    cfg["qwen35-spark:fabric"] = {"socket_ifname": "enp1s0f0np0", **fabric}
    return cfg


def test_each_node_gets_its_own_fabric_checks_ports_and_no_gid_index(monkeypatch):
    graph = run_graph(monkeypatch, unpinned_config())
    checks = {r.name: r for r in graph.run.by_type(FABRIC)}
    assert set(checks) == {"qwen35-fabric-spark-1", "qwen35-fabric-spark-2"}
    head, worker = checks["qwen35-fabric-spark-1"].inputs, checks["qwen35-fabric-spark-2"].inputs
    assert (head["mode"], head["gid"]) == ("enforce", "unset")
    assert head.get("pin") is None and head.get("reference") is None
    assert worker["fabric_ip"] == "192.168.200.13"
    assert worker["reference"] == {"node": "spark-1", "mtu": 9000, "paths": {"enp1s0f0np0": 9000}}
    # The mocks' checks report spark-1 cabled on its f0 functions and spark-2 on its f1 functions.
    head_env, worker_env = envs(graph, "qwen35-ray-head"), envs(graph, "qwen35-ray-worker-spark-2")
    assert head_env["NCCL_IB_HCA"] == "rocep1s0f0:1,roceP2p1s0f0:1"
    assert worker_env["NCCL_IB_HCA"] == "rocep1s0f1:1,roceP2p1s0f1:1"
    assert envs(graph, "qwen35-vllm")["NCCL_IB_HCA"] == head_env["NCCL_IB_HCA"]
    for env in (head_env, worker_env, envs(graph, "qwen35-vllm")):
        assert "NCCL_IB_GID_INDEX" not in env
        assert env["NCCL_IB_DISABLE"] == "0" and env["HF_TOKEN"] == SECRETS["hf_token"]
    fabric = graph.run.outputs["fabric"]
    assert fabric["check"] == "enforce"
    assert fabric["nodes"]["spark-2"]["ib_hca"] == ["rocep1s0f1:1", "roceP2p1s0f1:1"]
    assert fabric["nodes"]["spark-2"]["verdict"] == "pass"


def test_each_nodes_containers_and_check_get_its_own_socket_interface(monkeypatch):
    # Two Sparks cabled on different ports: spark-2 names its own interface (nodes[].socket_ifname).
    cfg = unpinned_config()
    cfg["qwen35-spark:nodes"] = copy.deepcopy(cfg["qwen35-spark:nodes"])
    cfg["qwen35-spark:nodes"][1]["socket_ifname"] = "enp1s0f1np1"
    graph = run_graph(monkeypatch, cfg)
    expect = {"spark-1": "enp1s0f0np0", "spark-2": "enp1s0f1np1"}
    seen = set()
    for container in cluster_containers(graph):
        node = next(label["value"] for label in container.inputs["labels"] if label["label"] == "qwen35.node")
        env = envs(graph, container.name)
        for var in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME", "UCX_NET_DEVICES"):
            assert env[var] == expect[node], (container.name, var)
        seen.add(node)
    assert seen == set(expect)
    assert envs(graph, "qwen35-vllm")["NCCL_SOCKET_IFNAME"] == "enp1s0f0np0"
    for node, ifname in expect.items():
        assert graph.run.named(f"qwen35-fabric-{node}").inputs["socket_ifname"] == ifname


def test_gid_index_resolve_sets_each_nodes_resolved_index(monkeypatch):
    graph = run_graph(monkeypatch, unpinned_config(gid_index="resolve", mtu=9000, check="report"))
    check = graph.run.named("qwen35-fabric-spark-2").inputs
    assert (check["gid"], check["mtu_expected"], check["mode"]) == ("resolve", 9000, "report")
    assert envs(graph, "qwen35-ray-worker-spark-2")["NCCL_IB_GID_INDEX"] == "3"


def test_off_registers_no_fabric_check_and_deploys_the_old_settings(monkeypatch):
    graph = run_graph(monkeypatch, unpinned_config(check="off"))
    assert graph.run.by_type(FABRIC) == []
    assert envs(graph, "qwen35-ray-worker-spark-2")["NCCL_IB_HCA"] == "rocep1s0f0,roceP2p1s0f0"
    assert graph.run.outputs["fabric"] == {
        "check": "off",
        "nodes": {
            n: {"ib_hca": ["rocep1s0f0", "roceP2p1s0f0"], "gid_index": None} for n in ("spark-1", "spark-2")
        },
        # The readiness gate's record of the serving ranks' transport (the mocks echo inputs: none yet).
        "serving": None,
    }


def test_per_node_pins_reach_their_own_check(monkeypatch):
    cfg = unpinned_config()
    cfg["qwen35-spark:nodes"][1] = {**cfg["qwen35-spark:nodes"][1], "ib_hca": ["rocep1s0f1:1"]}
    graph = run_graph(monkeypatch, cfg)
    assert graph.run.named("qwen35-fabric-spark-1").inputs.get("pin") is None
    assert graph.run.named("qwen35-fabric-spark-2").inputs["pin"] == ["rocep1s0f1:1"]
    assert envs(graph, "qwen35-ray-worker-spark-2")["NCCL_IB_HCA"] == "rocep1s0f1:1"


def test_pinned_hcas_keep_a_known_environment_that_waits_for_no_check(monkeypatch):
    import tests.support.program as program

    # A check reporting other ports than the pin: containers of a pinned stack do not take them.
    monkeypatch.setattr(program, "fake_fabric", lambda inputs: {"ib_hca": ["other:1"], "gid_index": 7})
    pinned = run_graph(monkeypatch, stack_config("dev"))
    assert pinned.run.by_type(FABRIC)
    assert envs(pinned, "qwen35-ray-worker-spark-2")["NCCL_IB_HCA"] == "rocep1s0f0,roceP2p1s0f0"
    assert "NCCL_IB_GID_INDEX" not in envs(pinned, "qwen35-ray-worker-spark-2")
    # Unpinned (or `gid_index: resolve`), the check's outputs decide.
    unpinned = run_graph(monkeypatch, unpinned_config(gid_index="resolve"))
    assert envs(unpinned, "qwen35-ray-worker-spark-2")["NCCL_IB_HCA"] == "other:1"
    assert envs(unpinned, "qwen35-ray-worker-spark-2")["NCCL_IB_GID_INDEX"] == "7"


def test_the_lab_declares_the_refusals_it_expects_and_other_stacks_none(dev, monkeypatch):
    """Pulumi.lab.yaml's image.model_check_expects reaches the check as `expect`: the provider says
    those refusals in one line (components/model_support/execute.py); a stack without it warns in full."""
    lab = run_graph(monkeypatch, stack_config("lab")).run.named("qwen35-model-support").inputs
    assert lab["mode"] == "report"
    assert lab["expect"] == {
        "because": "no lab image holds torch or a real vLLM (the Sparks' images do, and enforce)",
        "behaviour": "environment",
        "serve_args": "environment",
        "cluster_layer": "ray",
    }
    assert dev.run.named("qwen35-model-support").inputs.get("expect") is None


# ---- the compile cache: one volume per node, in every vLLM container there --------------

COMPILE_VARS = {
    "VLLM_CACHE_ROOT": "/root/.cache/qwen35-compile/vllm",
    "TORCHINDUCTOR_CACHE_DIR": "/root/.cache/qwen35-compile/inductor",
    "TRITON_CACHE_DIR": "/root/.cache/qwen35-compile/triton",
    "FLASHINFER_WORKSPACE_BASE": "/root/.cache/qwen35-compile/flashinfer",
}


def with_sections(**sections: dict) -> dict:
    """The dev stack's config with `sections` merged over its own, key by key."""
    cfg = copy.deepcopy(stack_config("dev"))
    for key, value in sections.items():
        cfg[f"qwen35-spark:{key}"] = {**cfg.get(f"qwen35-spark:{key}", {}), **value}
    return cfg


def volume_mounts(graph: Graph, name: str) -> dict[str, str]:
    """A container's named volumes: container path -> volume name."""
    volumes = graph.container(name).inputs["volumes"]
    return {v["containerPath"]: v["volumeName"] for v in volumes if v.get("volumeName")}


def container_nodes(graph: Graph) -> dict[str, str]:
    """Every serving container's resource name -> the node its provider is on."""
    return {
        c.name: graph.provider_of(c.name).removeprefix("qwen35-docker-") for c in cluster_containers(graph)
    }


@pytest.mark.parametrize("graph_name", ["dev", "four"])
def test_one_compile_cache_volume_per_node_on_its_own_provider(request, graph_name):
    graph: Graph = request.getfixturevalue(graph_name)
    nodes = graph.run.outputs["nodes"]
    caches = [v for v in graph.run.by_type("docker:index/volume:Volume") if "compile-cache" in v.name]
    assert sorted(v.name for v in caches) == sorted(f"qwen35-compile-cache-{n}" for n in nodes)
    for node in nodes:
        volume = graph.run.named(f"qwen35-compile-cache-{node}")
        assert volume.inputs["name"] == "qwen35-compile-cache"
        assert graph.provider_of(volume.name) == f"qwen35-docker-{node}"
        # After the node's claim (the claim checks the prefix the volume's name carries).
        assert f"qwen35-claim-{node}" in graph.deps[volume.name]


@pytest.mark.parametrize("graph_name", ["dev", "four"])
def test_every_vllm_container_mounts_its_node_s_cache_with_the_variables(request, graph_name):
    graph: Graph = request.getfixturevalue(graph_name)
    on_node = container_nodes(graph)
    assert len(on_node) == len(graph.run.outputs["nodes"]) + 1  # the Ray containers and the server
    for name, node in on_node.items():
        assert volume_mounts(graph, name)["/root/.cache/qwen35-compile"] == "qwen35-compile-cache"
        assert f"qwen35-compile-cache-{node}" in graph.deps[name], name
        assert COMPILE_VARS.items() <= envs(graph, name).items(), name


def test_mp_ranks_mount_their_node_s_cache(monkeypatch):
    from tests.support.program import mp_stack_config

    graph = run_graph(monkeypatch, mp_stack_config(3))
    on_node = container_nodes(graph)
    assert sorted(on_node.values()) == ["spark-1", "spark-2", "spark-3"]
    for name, node in on_node.items():
        assert volume_mounts(graph, name) == {"/root/.cache/qwen35-compile": "qwen35-compile-cache"}
        assert f"qwen35-compile-cache-{node}" in graph.deps[name]
        assert COMPILE_VARS.items() <= envs(graph, name).items()


@pytest.mark.parametrize("keep", [True, False])
def test_keep_on_destroy_decides_whether_the_cache_outlives_destroy(monkeypatch, keep):
    graph = run_graph(monkeypatch, with_sections(model={"keep_on_destroy": keep}))
    for node in graph.run.outputs["nodes"]:
        assert graph.options[f"qwen35-compile-cache-{node}"]["retain_on_delete"] is keep
    # Ray's session directory is never worth keeping.
    assert graph.options["qwen35-ray-tmp"]["retain_on_delete"] is False


def test_the_switch_off_removes_the_volumes_the_mounts_and_the_variables(monkeypatch):
    graph = run_graph(monkeypatch, with_sections(containers={"compile_cache": False}))
    volumes = {v.name for v in graph.run.by_type("docker:index/volume:Volume")}
    assert volumes == {"qwen35-ray-tmp", "qwen35-health"}
    for name in container_nodes(graph):
        assert "/root/.cache/qwen35-compile" not in volume_mounts(graph, name)
        assert not COMPILE_VARS.keys() & envs(graph, name).keys()
        assert not any("compile-cache" in dep for dep in graph.deps[name])


@pytest.mark.parametrize("executor", ["ray", "mp"])
def test_every_serving_container_prints_nccl_s_init_and_network_lines(monkeypatch, executor):
    # Read after the gate: the serving ranks' own transport (issue 52), not only the node proof's.
    graph = run_graph(monkeypatch, stack_config("dev") if executor == "ray" else mp_stack_config(2))
    serving = [c.name for c in cluster_containers(graph)]
    assert "qwen35-vllm" in serving and len(serving) >= (3 if executor == "ray" else 2), serving
    for name in serving:
        env = envs(graph, name)
        assert (env["NCCL_DEBUG"], env["NCCL_DEBUG_SUBSYS"]) == ("INFO", "INIT,NET"), name


def test_under_ray_the_gate_reads_the_server_s_log_where_ray_forwards_every_rank_s_lines(monkeypatch):
    cfg = copy.deepcopy(stack_config("dev"))
    cfg["qwen35-spark:fabric"] = {**cfg.get("qwen35-spark:fabric", {}), "node_proof": "report"}
    graph = run_graph(monkeypatch, cfg)
    (gate,) = graph.run.by_type(GATE)
    (head,) = [name for name in gate.inputs["serving_logs"]]
    assert head == graph.run.outputs["head"]
    assert gate.inputs["serving_logs"][head]["container"] == "qwen35-vllm"
    assert gate.inputs["transport_mode"] == "report"
    assert gate.inputs["nccl_fabric"][head]["ib_hca"]
