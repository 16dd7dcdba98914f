"""End to end on the lab: the containers the program declares, started for real, judged by the real gate.

The program runs under mocks with the lab stack (Pulumi.lab.yaml); each `pulumi_docker.Container` it
declares becomes `docker run` over SSH on the node its docker provider points at (tests/lab/declared.py),
with only the image swapped: the mocked NodeImage's ID for the lab Ray image's ID on that node (Debian +
Ray + a stand-in `vllm` that says it is one). Then the project's readiness gate provider decides, the
way `pulumi up` (create) and `pulumi refresh` (read) would run it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import openai
import pytest

import lab
from components import readiness_gate
from components.readiness_gate import GateFailed, ReadinessGateProvider
from lab.ray_image import ray_images
from lab.standin_vllm import STANDIN_NOTE
from tests.lab.declared import docker_run_argv, plain
from tests.program import ProgramRun, Registered, run_program, stack_config

pytestmark = pytest.mark.lab

API_KEY = "lab-e2e-key"
CONTAINER = "docker:index/container:Container"
VOLUME = "docker:index/volume:Volume"
PROVIDER = "pulumi:providers:docker"
# Dependency order, as the program's depends_on has it: head, then workers, then the server.
ROLE_ORDER = {"ray-head": 0, "ray-worker": 1, "vllm": 2}
# Short deadlines for the failure cases: each waits its whole deadline before it may say no.
NEVER_JOINS_DEADLINE_S = 30
CRASH_DEADLINE_S = 15
DRIFT_DEADLINE_S = 20
# The probe's default poll interval (components/readiness.py).
PROBE_INTERVAL_S = 5
# A cluster the previous test showed healthy passes in ~15 s; a precondition need not wait the stack's 180.
PRECONDITION_DEADLINE_S = 90
# Time beyond a deadline for SSH, `ray status` and the log tail.
GATE_SLACK_S = 45


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


def gate_props(run: ProgramRun, deadline_s: float | None = None) -> dict[str, Any]:
    """The readiness gate's inputs as the provider receives them (optionally a shorter deadline)."""
    (gate,) = [
        r for r in run.by_type("pulumi-python:dynamic/qwen35:ReadinessGate") if r.name.endswith("-ready")
    ]
    props = {k: v for k, v in plain(gate.inputs).items() if k != "__provider"}
    if deadline_s is not None:
        props["deadline_s"] = deadline_s
    return props


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

    def __init__(self, run: ProgramRun, nodes: dict[str, lab.LabNode], images: dict[str, str]):
        self.run = run
        self.nodes = nodes
        self.images = images
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
            inputs = {**container.inputs, "image": self.images[container.node]}
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
def lab_images(node_a, node_b) -> dict[str, str]:
    """The lab Ray image on both nodes (built once, then cached in QWEN35_CACHE)."""
    try:
        return ray_images([node_a, node_b])
    except lab.LabError as exc:
        pytest.fail(f"the lab Ray image could not be made: {exc}", pytrace=False)


@pytest.fixture
def deployment(program, lab_images, node_a, node_b) -> Iterator[LabDeployment]:
    nodes = {node.name: node for node in (node_a, node_b)}
    deployed = LabDeployment(program, nodes, lab_images)
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


def create_gate(props: dict[str, Any]) -> dict[str, Any]:
    """What `pulumi up` does for the gate: the provider's create, with the server's log on failure."""
    return ReadinessGateProvider().create(props).outs


def test_declared_specs_bring_up_a_serving_two_node_cluster(deployment, program):
    assert [(c.role, c.node) for c in deployment.containers] == [
        ("ray-head", "node-a"),
        ("ray-worker", "node-b"),
        ("vllm", "node-a"),
    ]
    dropped = deployment.start()
    # Pulumi.lab.yaml asks for no GPU or device; only what this kernel will not grant may go.
    assert all("ulimit memlock" in note for note in dropped), dropped
    started = time.monotonic()
    try:
        outs = create_gate(gate_props(program))
    except GateFailed as exc:
        pytest.fail(f"the gate refused a healthy cluster:\n{exc}{diagnosis(str(exc))}", pytrace=False)
    print(f"e2e: gate passed in {time.monotonic() - started:.1f}s: {outs['report']}")
    report = outs["report"]
    assert (report["ray_nodes"], report["ray_gpus"]) == (2, 2.0)
    assert report["completion_tokens"] > 0

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


def test_worker_that_never_joins_fails_the_gate_by_its_deadline(deployment, program):
    deployment.start(roles=("ray-head", "vllm"))
    (worker,) = deployment.of_role("ray-worker")
    started = time.monotonic()
    with pytest.raises(GateFailed) as failed:
        create_gate(gate_props(program, NEVER_JOINS_DEADLINE_S))
    elapsed = time.monotonic() - started
    message = str(failed.value)
    missing = f"{worker.name} on {worker.node}"
    print(f"e2e: gate failed after {elapsed:.1f}s ({missing} never started):\n{message}")
    # It waited (it polls every PROBE_INTERVAL_S and stops when the next poll would pass the deadline).
    assert NEVER_JOINS_DEADLINE_S - PROBE_INTERVAL_S - 1 <= elapsed < NEVER_JOINS_DEADLINE_S + GATE_SLACK_S
    assert "stage 'ray'" in message and "1/2 nodes" in message, message
    # It names the node that never joined (Ray's node list against the stack's fabric addresses).
    assert f"not joined: {worker.node} (127.0.0.3)" in message, message
    # The server's log tail is in the error: it is still waiting for the missing GPU.
    assert "last 30 lines of the server log" in message, message


def test_server_that_crashes_after_start_fails_the_gate_with_its_log_tail(deployment, program):
    deployment.start()
    create_gate(gate_props(program, PRECONDITION_DEADLINE_S))  # healthy first
    (server,) = deployment.of_role("vllm")
    lab.docker(deployment.nodes[server.node], "kill", server.name)
    with pytest.raises(GateFailed) as failed:
        create_gate(gate_props(program, CRASH_DEADLINE_S))
    message = str(failed.value)
    print(f"e2e: gate after the server was killed:\n{message}")
    # The container exited and the lab stack has no restart policy: the gate says so at once.
    assert "the server container has exited (exit code 137)" in message, message
    assert "stage 'connect'" in message, message
    assert "last 30 lines of the server log" in message and "Application startup complete" in message, message


def test_worker_container_removed_is_drift_and_fails_the_gate(deployment, program, monkeypatch):
    deployment.start()
    outs = create_gate(gate_props(program, PRECONDITION_DEADLINE_S))  # healthy first
    (worker,) = deployment.of_role("ray-worker")
    assert deployment.exists(worker)
    lab.docker(deployment.nodes[worker.node], "rm", "--force", worker.name)
    # What the docker provider's Read finds on refresh: the declared container is gone.
    assert not deployment.exists(worker), f"{worker.name} still exists on {worker.node}"
    # The gate's refresh (read) reports it gone too, so `pulumi refresh` shows the drift.
    monkeypatch.setattr(readiness_gate, "REFRESH_DEADLINE_S", DRIFT_DEADLINE_S)
    gate_id = "node-a-qwen35-vllm-id"
    assert ReadinessGateProvider().read(gate_id, {**gate_props(program), **outs}).id == ""
    with pytest.raises(GateFailed) as failed:
        create_gate(gate_props(program, DRIFT_DEADLINE_S))
    message = str(failed.value)
    print(f"e2e: gate after {worker.name} was removed:\n{message}")
    # Either the engine is still up and waits for its worker, or it exited on losing it (as vLLM does).
    assert "not ready after" in message or "the server container has exited" in message, message
    assert "1/2 nodes" in message or "EngineDeadError" in message or "engine dead" in message, message
