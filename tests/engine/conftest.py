"""The engine tier: the real Pulumi CLI (built from Go modules by `make engine`) deploys the program
onto the lab. An engine that cannot be built, or a lab that cannot start, fails these tests with the
reason; they are never skipped."""

from __future__ import annotations

import contextlib
import json
import secrets as pysecrets
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import openai
import pytest

import lab
from engine import Engine, EngineError, ensure_engine
from engine.lab_stack import engine_lab_config, real_answers, real_engine_config, stack_file, write_config
from lab import tiny_qwen35
from lab.layout import lab_dir
from lab.ray_image import ray_image
from lab.standin_hub import StandinHub
from tests.support.hub_fixture import hub_fixture
from tests.support.lab_nodes import session_nodes

REPO_ID = "lab/standin-qwen35"
# The program's resource types, as the engine names them in URNs and events.
NODE_IMAGE = "pulumi-python:dynamic/qwen35:NodeImage"
CHECKPOINT = "pulumi-python:dynamic/qwen35:Checkpoint"
MODEL_SUPPORT = "pulumi-python:dynamic/qwen35:ModelSupportCheck"
GATE = "pulumi-python:dynamic/qwen35:ReadinessGate"
CLAIM = "pulumi-python:dynamic/qwen35:StackClaim"
CONTAINER = "docker:index/container:Container"
VOLUME = "docker:index/volume:Volume"
HEALTH_SECRET = "pulumi-python:dynamic/qwen35:HealthSecret"
# The health stage's containers (resource names): declared after the gate, so never before it.
HEALTH_CONTAINERS = ("qwen35-watchdog", "qwen35-health-agent-node-b")
PROVIDER = "pulumi:providers:docker"


# Steps that change nothing on a node.
UNCHANGED = ("same", "read", "refresh")


def urn_name(urn: str) -> str:
    return urn.rsplit("::", 1)[-1]


def urn_type(urn: str) -> str:
    return urn.split("::")[-2].rsplit("$", 1)[-1]


# ---- reading `pulumi … --json` events ----------------------------------------------------------------


def steps(events: list[dict]) -> list[dict]:
    """The metadata of every resource step the engine finished, in the order it finished them."""
    return [e["resOutputsEvent"]["metadata"] for e in events if "resOutputsEvent" in e]


def finished(events: list[dict]) -> list[tuple[str, str, str]]:
    """(type, name, op) of every resource step the engine finished, in the order it finished them."""
    return [(meta["type"], urn_name(meta["urn"]), meta["op"]) for meta in steps(events)]


def changed_steps(events: list[dict]) -> list[tuple[str, str, str]]:
    """The finished steps that are not `same`, `read` or `refresh`."""
    return [step for step in finished(events) if step[2] not in UNCHANGED]


def changes(events: list[dict]) -> dict[str, str]:
    """name -> op of every step that changed something (a refresh that found a difference shows as
    an update or delete step, or a refresh step with diffs)."""
    found = {}
    for meta in steps(events):
        if meta["op"] not in UNCHANGED or meta.get("diffs"):
            found[urn_name(meta["urn"])] = meta["op"]
    return found


def outputs_of(events: list[dict], name: str) -> dict:
    """The outputs the last step on `name` left (a replacement has several steps)."""
    made = [(m.get("new") or {}).get("outputs") for m in steps(events) if urn_name(m["urn"]) == name]
    made = [outputs for outputs in made if outputs]
    assert made, f"no step on {name} left outputs"
    return made[-1]


def errors(events) -> list[str]:
    """The messages of the error diagnostics among `events`."""
    return [
        e["diagnosticEvent"].get("message", "")
        for e in events
        if e.get("diagnosticEvent", {}).get("severity") == "error"
    ]


def exported(stack: Stack, type_: str) -> dict[str, dict]:
    """name -> outputs of the live resources of `type_` in the engine's state."""
    state = json.loads(stack.run("stack", "export").out)
    return {
        r["urn"].rsplit("::", 1)[-1]: r.get("outputs") or {}
        for r in state["deployment"].get("resources") or []
        if r["type"] == type_ and not r.get("delete")
    }


def up_or_fail(stack: Stack) -> list[dict]:
    """`pulumi up --json`'s events; a failed `up` fails the test with the engine's error messages."""
    done = stack.run("up", "--yes", "--skip-preview", "--json", check=False, timeout=1800)
    if done.returncode != 0:
        pytest.fail(
            "pulumi up failed:\n" + ("\n".join(errors(done.events())) or done.err[-3000:]), pytrace=False
        )
    return done.events()


@pytest.fixture(scope="session")
def engine(tmp_path_factory) -> Engine:
    """The CLI with its plugins, and a backend folder of this test session's own."""
    try:
        return ensure_engine(backend=tmp_path_factory.mktemp("pulumi-state"))
    except EngineError as exc:
        pytest.fail(f"the engine could not be built: {exc}", pytrace=False)


@pytest.fixture(scope="session")
def lab_nodes() -> Iterator[dict[str, lab.LabNode]]:
    with session_nodes(["node-a", "node-b"]) as nodes:
        yield nodes


@pytest.fixture(scope="session")
def lab_image(lab_nodes) -> str:
    """The lab Ray image's tag, on node-a (the head) only: NodeImage copies it to node-b."""
    tag, _ = ray_image(lab_nodes["node-a"])
    return tag


hub = hub_fixture(REPO_ID, shards=2, shard_bytes=2 << 20, scope="session")


@dataclass
class Stack:
    """One stack of the project in the test backend, and its Pulumi.<stack>.yaml."""

    engine: Engine
    name: str
    config: Path

    def run(self, *args: str, check: bool = True, timeout: float = 1800, stdin: str | None = None):
        return self.engine.run(*args, stack=self.name, check=check, timeout=timeout, stdin=stdin)

    def remove(self) -> None:
        self.run("stack", "rm", "--yes", "--force", check=False)
        self.config.unlink(missing_ok=True)
        # A stack forgotten after a failed destroy must not keep its StackClaims on the shared lab.
        for node in lab.NODE_NAMES:
            claim = lab_dir() / node / "home" / ".qwen35" / "stacks" / f"qwen35-spark--{self.name}.json"
            claim.unlink(missing_ok=True)

    def set_secret(self, key: str, value: str) -> None:
        # The value on stdin: never an argument (it would show in `ps`).
        self.run("config", "set", "--secret", f"qwen35-spark:{key}", stdin=value)


def new_stack(engine: Engine, name: str, config: dict) -> Stack:
    """`pulumi stack init` (it writes the passphrase's salt into Pulumi.<name>.yaml), then the config."""
    path = stack_file(name)
    path.unlink(missing_ok=True)
    engine.run("stack", "init", name)
    write_config(path, config)
    return Stack(engine, name, path)


@contextlib.contextmanager
def secret_stack(engine: Engine, name: str, config: dict, secrets: dict[str, str]) -> Iterator[Stack]:
    """A new stack with both secrets set (`pulumi config set --secret`); destroyed and removed after."""
    made = new_stack(engine, name, config)
    try:
        for key, value in secrets.items():
            made.set_secret(key, value)
        yield made
    finally:
        made.run("destroy", "--yes", check=False, timeout=900)
        made.remove()


def clear_caches(lab_nodes) -> None:
    """Each node's HF cache of the lab stack, emptied so a first `up` fetches and copies for real."""
    for name in lab_nodes:
        shutil.rmtree(lab_dir() / name / "hf-cache", ignore_errors=True)


def answers(stack: Stack, api_key: str) -> None:
    """The stack's `endpoint` output answers one chat completion with `api_key`."""
    outputs = stack.run("stack", "output", "--json").json()
    client = openai.OpenAI(base_url=outputs["endpoint"], api_key=api_key, timeout=30)
    reply = client.chat.completions.create(
        model=outputs["served_model"], messages=[{"role": "user", "content": "hi"}], max_tokens=4
    )
    assert reply.choices[0].message.content


@pytest.fixture(scope="session")
def secrets() -> dict[str, str]:
    return {
        "api_key": "sk-engine-" + pysecrets.token_hex(12),
        "hf_token": "hf_engine" + pysecrets.token_hex(12),
    }


@pytest.fixture(scope="session")
def lab_config(lab_image, hub):
    return lambda **sections: engine_lab_config(lab_image, hub.endpoint, **sections)


# ---- the real engine: vLLM's CPU build serving the tiny Qwen3.5-MoE (engine/real_vllm.yaml) -----------

REAL_STACK = "engine-real"


@pytest.fixture(scope="session")
def real_image(lab_nodes) -> str:
    """The real-vLLM lab image's tag, on both nodes (loaded from the cache, or built once on node-a):
    NodeImage finds it everywhere and sends nothing, and its layers stay when a stack's destroy removes
    the tags it placed."""
    from lab.vllm_cpu_image import vllm_cpu_image

    tags = {vllm_cpu_image(node)[0] for node in lab_nodes.values()}
    assert len(tags) == 1, tags
    return tags.pop()


@pytest.fixture(scope="session")
def real_repo(tmp_path_factory) -> Path:
    """The tiny real checkpoint's files (lab/tiny_qwen35.py)."""
    return tiny_qwen35.write(tmp_path_factory.mktemp("tiny-qwen35"))


@pytest.fixture(scope="session")
def real_hub(real_repo) -> Iterator[StandinHub]:
    """The stand-in Hub serving the tiny real checkpoint."""
    with StandinHub({tiny_qwen35.REPO_ID: real_repo}) as served:
        yield served


@pytest.fixture(scope="session")
def real_reference(lab_nodes, real_image, real_repo) -> Path:
    """transformers' answers on the same checkpoint, for the real stack's answer check (computed in
    the real-vLLM image on node-a, once per checkpoint and image: lab/answers_reference.py)."""
    from lab.answers_reference import make_reference

    try:
        return make_reference(lab_nodes["node-a"], real_image, real_repo, real_answers())
    except lab.LabError as exc:
        pytest.fail(f"the answer check's reference could not be made: {exc}", pytrace=False)


@dataclass
class RealStack:
    """The real-engine stack after its first `up`."""

    stack: Stack
    first_up: list[dict]
    api_key: str


@contextlib.contextmanager
def real_stack_up(
    engine: Engine, name: str, image: str, hub: StandinHub, secrets: dict, reference: Path | None, **sections
):
    """A real-engine stack of its own (destroyed after: its two ranks each hold a core while up)."""
    config = real_engine_config(image, hub.endpoint, reference, **sections)
    with secret_stack(engine, name, config, secrets) as made:
        yield RealStack(made, up_or_fail(made), secrets["api_key"])
