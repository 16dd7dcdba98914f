"""End to end on the lab: the resources the program declares, created for real, judged by the real gate.

The program runs under mocks with the lab stack (Pulumi.lab.yaml). Its dynamic resources (a NodeImage
per node, the readiness gate) are driven the way the engine drives them: their registered inputs, with
the provider the SDK pickled into `__provider`, go to a fresh `python -m pulumi.dynamic` process over
gRPC (tests/support/provider_host.py): Check, Create, Read, Diff, Update and Delete. Only the image is
swapped: the NodeImages place the lab Ray image (Debian + Ray + a stand-in `vllm` that says it is one)
instead of the hybrid build. Each `pulumi_docker.Container` becomes `docker run` over SSH on the node
its docker provider points at (tests/support/declared.py), running the image ID its own node's
NodeImage reported. The Checkpoints are created the same way first: node-a fetches the model repo from
a stand-in Hub on loopback with the real `huggingface_hub` client, node-b receives it from node-a; the
stand-in `vllm` serves only from each node's own cache, offline.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import openai
import pytest

import lab
from components.node_programs.readiness import parse_ray_status
from lab.ray_image import ray_image
from lab.standin_hub import StandinHub, generate_repo
from lab.standin_vllm import STANDIN_NOTE
from tests.support.declared import docker_run_argv
from tests.support.node_image_lab import remove_with_record
from tests.support.program import READINESS_GATE, ProgramRun, Registered, run_program, stack_config
from tests.support.provider_host import Engine, ProviderFailed, ProviderHost, State

pytestmark = pytest.mark.lab

API_KEY = "lab-e2e-key"
CONTAINER = "docker:index/container:Container"
MODEL_SUPPORT = "pulumi-python:dynamic/qwen35:ModelSupportCheck"
VOLUME = "docker:index/volume:Volume"
PROVIDER = "pulumi:providers:docker"
# Dependency order, as the program's depends_on has it: head, then workers, then the server; after
# the gate, the health agents, then the watchdog.
ROLE_ORDER = {"ray-head": 0, "ray-worker": 1, "vllm": 2, "health-agent": 3, "watchdog": 4}
HEALTH_ROLES = ("health-agent", "watchdog")
# Short deadlines for the failure cases: each waits its whole deadline before it may say no.
NEVER_JOINS_DEADLINE_S = 30
CRASH_DEADLINE_S = 15
DRIFT_DEADLINE_S = 20
# A cluster the previous test showed healthy passes in ~15 s; a precondition need not wait the stack's 180.
PRECONDITION_DEADLINE_S = 90
# How long a Ray head may take to come up before a test that needs it says so: minutes on a machine
# that builds images or venvs beside the lab; what the test then judges starts once it is up.
HEAD_UP_S = 600
# What a create may take beyond the gate's deadline (SSH, the probe's last round, its log tail).
CALL_SLACK_S = 360


@dataclass(frozen=True)
class Declared:
    """One container as the program declares it, and the lab node its docker provider reaches."""

    resource: str
    name: str
    role: str
    node: str
    inputs: dict[str, Any]


def provider_node(run: ProgramRun, resource: Registered) -> str:
    """The lab node a resource's docker provider (`ssh://user@host:port`) points at."""
    provider_name = (resource.provider or "").split("::")[-2]
    host = run.named(provider_name).inputs["host"].rpartition("@")[2].rpartition(":")[0]
    by_host = {spec.host: spec.name for spec in lab.NODE_SPECS}
    if host not in by_host:
        raise AssertionError(f"{resource.name}: provider {provider_name} points at {host}, not a lab node")
    return by_host[host]


def declared_containers(run: ProgramRun) -> list[Declared]:
    found = []
    for resource in run.by_type(CONTAINER):
        labels = {item["label"]: item["value"] for item in resource.inputs.get("labels", [])}
        found.append(
            Declared(
                resource.name,
                resource.inputs["name"],
                labels["qwen35.role"],
                provider_node(run, resource),
                resource.inputs,
            )
        )
    return sorted(found, key=lambda c: ROLE_ORDER[c.role])


def gate_inputs(run: ProgramRun, deadline_s: float | None = None) -> tuple[Registered, dict[str, Any]]:
    """The readiness gate as the program registered it (secret api_key and `__provider` included),
    optionally with a shorter deadline."""
    (gate,) = [r for r in run.by_type(READINESS_GATE) if r.name.endswith("-ready")]
    inputs = dict(gate.inputs)
    if deadline_s is not None:
        inputs["deadline_s"] = deadline_s
    return gate, inputs


# `ulimit -H` option and unit (bytes per unit) for the limits the program declares.
_ULIMIT_QUERY = {"memlock": ("-l", 1024), "stack": ("-s", 1024), "nofile": ("-n", 1)}


def node_limits(node: lab.LabNode) -> dict[str, int]:
    """The hard limits a container on `node` can get at most (-1: unlimited), asked on the node."""
    script = "; ".join(f"ulimit -H {option}" for option, _ in _ULIMIT_QUERY.values())
    values = lab.on_node(node, ["sh", "-c", script]).out.split()
    return {
        name: -1 if value == "unlimited" else int(value) * unit
        for (name, (_, unit)), value in zip(_ULIMIT_QUERY.items(), values, strict=True)
    }


class LabDeployment:
    """The declared containers on the lab nodes: start some or all, remove one, clean up everything."""

    def __init__(
        self, run: ProgramRun, nodes: dict[str, lab.LabNode], placed: dict[str, State], revision: str = ""
    ):
        self.run = run
        self.nodes = nodes
        # The commit the head's Checkpoint really resolved (the mocks fake one for `--revision`).
        self.revision = revision
        # The declared image of a container is its node's NodeImage `image_id` (a distinct fake per
        # node under mocks); on the lab it becomes the ID that NodeImage really reported.
        declared_ids = {node: out["image_id"] for node, out in run.outputs["images"].items()}
        self.node_of_image = {image_id: node for node, image_id in declared_ids.items()}
        self.images = {node: state.outputs["image_id"] for node, state in placed.items()}
        self.containers = declared_containers(run)
        self.volumes = [(provider_node(run, v), v.inputs["name"]) for v in run.by_type(VOLUME)]
        self.limits = {name: node_limits(node) for name, node in nodes.items()}

    def of_role(self, role: str) -> list[Declared]:
        return [c for c in self.containers if c.role == role]

    def start(self, roles: tuple[str, ...] = ("ray-head", "ray-worker", "vllm")) -> list[str]:
        """`docker run` each declared container of `roles` in dependency order; what was dropped."""
        dropped_all = []
        for node, volume in self.volumes:
            lab.docker(self.nodes[node], "volume", "create", volume)
        for container in self.containers:
            if container.role not in roles:
                continue
            image_node = self.node_of_image.get(container.inputs["image"])
            assert image_node == container.node, f"{container.name} on {container.node} runs {image_node}'s"
            inputs = {**container.inputs, "image": self.images[container.node]}
            command = list(inputs.get("command") or [])
            if "--revision" in command and self.revision:
                command[command.index("--revision") + 1] = self.revision
                inputs["command"] = command
            argv, dropped = docker_run_argv(inputs, self.limits[container.node])
            dropped_all += [f"{container.name} on {container.node}: {note}" for note in dropped]
            lab.docker(self.nodes[container.node], *argv[1:], timeout=120)
        for note in dropped_all:
            print(f"e2e: dropped {note}")
        return dropped_all

    def exists(self, container: Declared) -> bool:
        """What the docker provider's Read sees: does the container exist on its node?"""
        found = lab.docker(self.nodes[container.node], "inspect", container.name, check=False)
        return found.returncode == 0

    def logs(self, container: Declared) -> str:
        found = lab.docker(self.nodes[container.node], "logs", "--tail", "40", container.name, check=False)
        return (found.out + "\n" + found.err).strip()

    def clean(self) -> None:
        for container in reversed(self.containers):
            lab.docker(self.nodes[container.node], "rm", "--force", container.name, check=False)
        for node, volume in self.volumes:
            lab.docker(self.nodes[node], "volume", "rm", "--force", volume, check=False)


@pytest.fixture(scope="module")
def program() -> ProgramRun:
    return run_program(stack_config("lab"), stack="lab", secrets={"api_key": API_KEY})


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    """A fresh provider process for this module's dynamic resources, as `pulumi up` starts one."""
    with ProviderHost() as host:
        yield Engine(host, stack="lab")
        stderr = host.stderr
    assert API_KEY not in stderr, "the API key reached the provider process's log"


def node_image_inputs(program: ProgramRun, resource: Registered, tag: str, states: dict[str, State]) -> dict:
    """A NodeImage's registered inputs with the lab image, and with each input that is another
    NodeImage's output (a worker's `source_image_id`) resolved to that resource's real output, as the
    engine resolves it (under mocks it is a fake ID per node)."""
    fakes = {out["image_id"]: node for node, out in program.outputs["images"].items()}
    inputs = {**resource.inputs, "image": tag}
    for key, value in inputs.items():
        if isinstance(value, str) and value in fakes:
            inputs[key] = states[fakes[value]].outputs["image_id"]
    return inputs


@pytest.fixture(scope="module")
def placed(program, engine, node_a, node_b) -> Iterator[dict[str, State]]:
    """The program's NodeImages created through the provider host, placing the lab Ray image (built or
    loaded from the cache on the head only; the NodeImage for node-b copies it there if it lacks it)."""
    try:
        tag, _ = ray_image(node_a)
    except lab.LabError as exc:
        pytest.fail(f"the lab Ray image could not be made: {exc}", pytrace=False)
    remove_with_record(node_b, tag)  # node-b's NodeImage places the tag itself, whatever a past run left
    states: dict[str, State] = {}
    for resource in program.node_images():
        inputs = node_image_inputs(program, resource, tag, states)
        state = engine.create(resource.typ, resource.name, inputs, timeout=900)
        states[resource.inputs["destination"]["name"]] = state
        print(f"e2e: {resource.name}: {state.public_outputs()}")
    yield states
    for state in states.values():  # the tests may have replaced a state: the current ones
        engine.delete(state)


CHECKPOINT = "pulumi-python:dynamic/qwen35:Checkpoint"
# What a worker's Checkpoint takes from its source's Checkpoint (fake values under mocks).
SOURCE_OUTPUTS = {
    "source_revision": "revision",
    "source_manifest": "manifest",
    "source_refs": "refs",
    "manifest_digest": "digest",
}


def checkpoint_inputs(resource: Registered, endpoint: str, states: dict[str, State]) -> dict:
    """A Checkpoint's registered inputs with its source's real outputs (as the engine resolves them),
    and on the head the stand-in Hub's endpoint and a Python with the Hub client (this venv's: lab
    nodes share this machine's filesystem)."""
    inputs = dict(resource.inputs)
    source = inputs.get("source")
    if source:
        for key, output in SOURCE_OUTPUTS.items():
            inputs[key] = states[source["name"]].outputs[output]
    else:
        inputs["fetch"] = {**inputs.get("fetch", {}), "python": sys.executable, "endpoint": endpoint}
    return inputs


@pytest.fixture(scope="module")
def checkpoints(program, engine, node_a, node_b, tmp_path_factory) -> Iterator[dict[str, State]]:
    """The program's Checkpoints created through the provider host, head first, then along the tree."""
    declared = program.by_type(CHECKPOINT)
    repo = generate_repo(tmp_path_factory.mktemp("hub-repo"), shards=2, shard_bytes=2 << 20)
    states: dict[str, State] = {}
    with StandinHub({declared[0].inputs["repo"]: repo}) as hub:
        for resource in declared:
            shutil.rmtree(resource.inputs["cache_dir"], ignore_errors=True)
            inputs = checkpoint_inputs(resource, hub.endpoint, states)
            states[resource.inputs["node"]["name"]] = engine.create(
                resource.typ, resource.name, inputs, timeout=600
            )
    yield states
    for resource in declared:
        shutil.rmtree(resource.inputs["cache_dir"], ignore_errors=True)


@pytest.fixture
def deployment(program, placed, checkpoints, node_a, node_b) -> Iterator[LabDeployment]:
    nodes = {node.name: node for node in (node_a, node_b)}
    deployed = LabDeployment(program, nodes, placed, checkpoints["node-a"].outputs["revision"])
    deployed.clean()  # a run that was killed may have left containers behind
    try:
        yield deployed
    finally:
        deployed.clean()


def diagnosis(message: str) -> str:
    """A known cause named from the server log, so a failing run says what to change."""
    if "Failed to connect to Ray cluster" in message:
        return (
            "\n  diagnosis: the vLLM container could not attach to the head's raylet. A Ray driver finds"
            " its node's raylet by scanning local processes (ray._private.services.find_node_ids), so"
            " the server container must share the Ray head's PID namespace (pid_mode 'host', or"
            " 'container:<ray head>'), besides its /tmp/ray."
        )
    return ""


def create_gate(engine: Engine, program: ProgramRun, deadline_s: float | None = None) -> State:
    """What `pulumi up` does for the gate: Check and Create in the provider process."""
    gate, inputs = gate_inputs(program, deadline_s)
    timeout = float(inputs["deadline_s"]) + CALL_SLACK_S
    return engine.create(gate.typ, gate.name, inputs, timeout=timeout)


def gate_refused(engine: Engine, program: ProgramRun, deadline_s: float) -> str:
    """The gate's create fails: the provider's error (GateFailed, with the probe's report) as text."""
    with pytest.raises(ProviderFailed) as failed:
        create_gate(engine, program, deadline_s)
    message = str(failed.value)
    assert failed.value.method == "Create" and "GateFailed" in message, message
    return message


def test_node_images_place_the_image_on_every_node_through_the_provider_host(placed, engine, program, node_b):
    assert sorted(placed) == ["node-a", "node-b"]
    tag = placed["node-b"].outputs["image"]
    on_b = lab.docker(node_b, "image", "inspect", "-f", "{{.Id}}", tag).out
    assert placed["node-b"].outputs["image_id"] == on_b
    for node, state in placed.items():
        # Refresh sees what was placed; a preview with the same inputs shows no change.
        assert engine.refresh(state).outputs["image_id"] == state.outputs["image_id"], node
        resource = program.named(state.urn.rsplit("::", 1)[-1])
        same = node_image_inputs(program, resource, state.inputs["image"], placed)
        assert engine.up(state, same).op == "same", node
    # node-b's copy knows which image its source (node-a's NodeImage) observed.
    assert placed["node-b"].inputs["source_image_id"] == placed["node-a"].outputs["image_id"]
    # A rebuild trigger replaces node-b's NodeImage in the engine's order (the new one created, then
    # the old one deleted): the node keeps its image, and a refresh finds no drift.
    resource = program.named("qwen35-image-node-b")
    rebuilt = {**node_image_inputs(program, resource, tag, placed), "trigger": "rebuild-2"}
    replaced = engine.up(placed["node-b"], rebuilt)
    assert replaced.op == "replace" and replaced.diff.delete_before_replace is False, replaced.diff
    assert lab.docker(node_b, "image", "inspect", "-f", "{{.Id}}", tag).out == on_b
    assert engine.refresh(replaced.state).outputs["image_id"] == on_b
    assert engine.up(replaced.state, rebuilt).op == "same"
    placed["node-b"] = replaced.state


def test_the_model_support_check_runs_on_the_head_before_ray(placed, checkpoints, engine, program, node_a):
    """The check as the lab stack declares it, through the provider host, on the head's placed image and
    the head's real checkpoint. Pulumi.lab.yaml sets `model_check: report`: the lab Ray image has no
    torch, so the real proof fails at `environment`, the verdict is recorded and Ray may start."""
    (check,) = program.by_type(MODEL_SUPPORT)
    head = checkpoints["node-a"].outputs
    registered = {
        **check.inputs,
        "image_id": placed["node-a"].outputs["image_id"],
        "checkpoint_digest": head["digest"],
        "snapshot_path": head["snapshot_path"],
    }
    state = engine.create(check.typ, check.name, registered, timeout=600)
    outputs = state.public_outputs()
    print(f"e2e: {check.name}: {outputs}")
    assert outputs["verdict"] == "fail" and outputs["failed_stage"] == "environment", outputs
    # The head's checkpoint index was read on node-a and fits the lab's declared memory.
    assert outputs["memory_fit"]["fits"] is True and outputs["memory_fit"]["weights_from"] in (
        "index",
        "shards",
    )
    # Unchanged inputs: no second run (the unit tests check that every container waits for it).
    assert engine.up(state, registered).op == "same"
    engine.delete(state)


def test_declared_specs_bring_up_a_serving_two_node_cluster(deployment, program, engine):
    assert [(c.role, c.node) for c in deployment.containers] == [
        ("ray-head", "node-a"),
        ("ray-worker", "node-b"),
        ("vllm", "node-a"),
        ("health-agent", "node-b"),
        ("watchdog", "node-a"),
    ]
    dropped = deployment.start()
    # Pulumi.lab.yaml asks for no GPU or device; only what this kernel will not grant may go.
    assert all("ulimit memlock" in note for note in dropped), dropped
    started = time.monotonic()
    try:
        gate = create_gate(engine, program)
    except ProviderFailed as exc:
        pytest.fail(f"the gate refused a healthy cluster:\n{exc}{diagnosis(str(exc))}", pytrace=False)
    print(f"e2e: gate passed in {time.monotonic() - started:.1f}s: {gate.outputs['report']}")
    report = gate.outputs["report"]
    assert (report["ray_nodes"], report["ray_gpus"]) == (2, 2.0)
    assert report["completion_tokens"] > 0
    # The API key reached the provider as a plain value and stays a secret in the state.
    assert "api_key" in gate.secret_keys

    client = openai.OpenAI(base_url=program.outputs["endpoint"], api_key=API_KEY, max_retries=0, timeout=30)
    assert [m.id for m in client.models.list().data] == [program.outputs["served_model"]]
    answer = client.chat.completions.create(
        model=program.outputs["served_model"],
        messages=[{"role": "user", "content": "which nodes answered?"}],
    )
    text = answer.choices[0].message.content
    assert STANDIN_NOTE in text, "the stand-in must say it is one"
    # The answer passed through a Ray worker on each node: the cluster really spans both.
    assert "@127.0.0.2" in text and "@127.0.0.3" in text, text
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=program.outputs["endpoint"], api_key="wrong", max_retries=0).models.list()
    # After the gate, the health stage as declared (Pulumi.lab.yaml: report): the watchdog on node-a
    # reaches the agent and judges the cluster it has seen ready.
    deployment.start(roles=HEALTH_ROLES)
    state = watchdog_state(program, lambda s: s.get("state") == "healthy")
    assert state["mode"] == "report" and state["restarts"] == [] and state["spent"] is None, state
    # `pulumi refresh` of a serving cluster: the gate is still there; `pulumi destroy`: nothing left to do.
    assert engine.refresh(gate).id == gate.id
    engine.delete(gate)


def watchdog_state(program: ProgramRun, done, deadline_s: float = 60.0) -> dict:
    """The declared watchdog's /state once `done(state)` holds (the last one read, on timeout)."""
    url = program.outputs["health"]["state_url"]
    last: dict = {}
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=5) as answer:
                last = json.loads(answer.read())
            if done(last):
                return last
        except (OSError, ValueError) as exc:
            last = {"error": str(exc)}
        time.sleep(1)
    pytest.fail(f"the watchdog at {url} did not get there in {deadline_s:g} s: {last}", pytrace=False)


def head_up(deployment: LabDeployment, bound_s: float = HEAD_UP_S) -> float:
    """Wait until the declared Ray head's `ray status` lists its own node; the seconds it took. The
    clock of what a test then judges starts here, so a loaded machine's slow start is not judged."""
    (head,) = deployment.of_role("ray-head")
    started = time.monotonic()
    last = ""
    while time.monotonic() - started < bound_s:
        found = lab.docker(deployment.nodes[head.node], "exec", head.name, "ray", "status", check=False)
        if found.returncode == 0 and parse_ray_status(found.out).nodes >= 1:
            return time.monotonic() - started
        last = ((found.err or found.out).strip().splitlines() or [""])[-1]
        time.sleep(2)
    pytest.fail(
        f"the Ray head {head.name} on {head.node} was not up after {bound_s:g} s (last: {last!r});"
        f" its log:\n{deployment.logs(head)}",
        pytrace=False,
    )


def test_worker_that_never_joins_fails_the_gate_by_its_deadline(deployment, program, engine):
    deployment.start(roles=("ray-head", "vllm"))
    (worker,) = deployment.of_role("ray-worker")
    # The gate's deadline is for the worker, not for the head: a head that is slow to start on a loaded
    # machine would leave the gate at "no running Ray instance" instead of "1/2 nodes".
    print(f"e2e: the Ray head was up in {head_up(deployment):.0f}s")
    message = gate_refused(engine, program, NEVER_JOINS_DEADLINE_S)
    print(f"e2e: gate failed ({worker.name} on {worker.node} never started):\n{message}")
    # It waited out its deadline (the probe says so; how long that took is bench material, not a test).
    assert re.search(rf"not ready after {NEVER_JOINS_DEADLINE_S:g} s", message), message
    assert "stage 'ray'" in message and "1/2 nodes" in message, message
    # It names the node that never joined (Ray's node list against the stack's fabric addresses).
    assert f"not joined: {worker.node} (127.0.0.3)" in message, message
    # The server's log tail is in the error: it is still waiting for the missing GPU.
    assert "last 30 lines of the server log" in message, message


def test_server_that_crashes_after_start_fails_the_gate_with_its_log_tail(deployment, program, engine):
    deployment.start()
    create_gate(engine, program, PRECONDITION_DEADLINE_S)  # healthy first
    (server,) = deployment.of_role("vllm")
    lab.docker(deployment.nodes[server.node], "kill", server.name)
    message = gate_refused(engine, program, CRASH_DEADLINE_S)
    print(f"e2e: gate after the server was killed:\n{message}")
    # The container exited and the lab stack has no restart policy: the gate says so at once.
    assert "the server container has exited (exit code 137)" in message, message
    assert "stage 'connect'" in message and "not ready after" not in message, message
    assert "last 30 lines of the server log" in message and "Application startup complete" in message, message


def test_worker_container_removed_is_drift_and_fails_the_gate(deployment, program, engine):
    deployment.start()
    gate = create_gate(engine, program, PRECONDITION_DEADLINE_S)  # healthy first
    # A shorter deadline alone is an in-place update (no new probe), and bounds the refresh below.
    _, shorter = gate_inputs(program, DRIFT_DEADLINE_S)
    updated = engine.up(gate, shorter)
    assert updated.op == "update" and updated.state.id == gate.id
    assert updated.state.outputs["deadline_s"] == DRIFT_DEADLINE_S
    (worker,) = deployment.of_role("ray-worker")
    assert deployment.exists(worker)
    lab.docker(deployment.nodes[worker.node], "rm", "--force", worker.name)
    # What the docker provider's Read finds on refresh: the declared container is gone.
    assert not deployment.exists(worker), f"{worker.name} still exists on {worker.node}"
    # The gate's refresh (Read) reports it gone too, so `pulumi refresh` shows the drift.
    assert engine.refresh(updated.state).id == ""
    message = gate_refused(engine, program, DRIFT_DEADLINE_S)
    print(f"e2e: gate after {worker.name} was removed:\n{message}")
    # Either the engine is still up and waits for its worker, or it exited on losing it (as vLLM does).
    assert "not ready after" in message or "the server container has exited" in message, message
    assert "1/2 nodes" in message or "EngineDeadError" in message or "engine dead" in message, message


def test_checkpoints_on_every_node_through_the_provider_host(checkpoints, program, engine):
    head, worker = checkpoints["node-a"].outputs, checkpoints["node-b"].outputs
    assert head["digest"] == worker["digest"] and head["revision"] == worker["revision"]
    assert worker["bytes_sent"] >= worker["bytes"] > 0 and head["bytes_sent"] == 0
    for node, state in checkpoints.items():
        assert engine.refresh(state).outputs["problems"] == {}, node


def test_no_server_while_a_node_lacks_the_checkpoint_and_up_repairs_it(
    deployment, program, engine, checkpoints
):
    """Served offline from each node's own cache: a worker without its copy keeps the server down;
    refresh sees the missing files, and `pulumi up` (an update in place) sends them back."""
    worker = checkpoints["node-b"]
    shutil.rmtree(worker.outputs["snapshot_path"])
    refreshed = engine.refresh(worker)
    assert "config.json" in refreshed.outputs["problems"], refreshed.outputs["problems"]
    try:
        deployment.start()
        # The server waits for node-b's Ray worker, then its rank there fails: the container exits.
        message = gate_refused(engine, program, PRECONDITION_DEADLINE_S)
        (server,) = deployment.of_role("vllm")
        print(f"e2e: gate with node-b's checkpoint gone:\n{message}")
        assert "not in this node's cache" in message + deployment.logs(server), message
    finally:
        registered = checkpoint_inputs(program.named("qwen35-checkpoint-node-b"), "", checkpoints)
        repaired = engine.up(refreshed, registered)
    assert repaired.op == "update", repaired.op
    assert repaired.state.outputs["files_sent"] == 0  # only the snapshot links were missing
    assert engine.refresh(repaired.state).outputs["problems"] == {}
    checkpoints["node-b"] = repaired.state
