"""The program under the real Pulumi engine on the lab: preview, first up, no-op up and refresh, a bad
config, destroy. The evidence is the engine's own output (`--json`, `--event-log`, `stack export`) and
the nodes, never the program's logs."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

import lab
from lab.logins import counted_logins
from tests.engine.conftest import (
    CHECKPOINT,
    CLAIM,
    CONTAINER,
    GATE,
    MODEL_SUPPORT,
    NODE_IMAGE,
    PROVIDER,
    VOLUME,
    Stack,
    changed_steps,
    clear_caches,
    finished,
    new_stack,
    secret_stack,
    urn_type,
)

pytestmark = pytest.mark.engine

# What the program registers for two lab nodes (README, "The resource graph").
EXPECTED = {
    PROVIDER: 2,
    CLAIM: 2,
    NODE_IMAGE: 2,
    CHECKPOINT: 2,
    MODEL_SUPPORT: 1,
    VOLUME: 1,
    CONTAINER: 3,
    GATE: 1,
    "qwen35:index:Deployment": 1,
}
OUTPUTS = {"endpoint", "served_model", "dashboard", "images", "checkpoints", "containers", "model_support"}


@pytest.fixture(scope="module")
def stack(engine, lab_nodes, lab_config, secrets) -> Iterator[Stack]:
    """A new stack `engine-lab` with both secrets set; destroyed and removed at the end."""
    clear_caches(lab_nodes)
    with secret_stack(engine, "engine-lab", lab_config(), secrets) as made:
        yield made


def test_preview_lists_every_resource_and_opens_no_ssh_session(stack, lab_nodes):
    with counted_logins(*lab_nodes.values()) as logins:
        preview = stack.run("preview", "--json")
        sessions = logins()
    steps = preview.json()["steps"]
    counts: dict[str, int] = {}
    for step in steps:
        assert step["op"] == "create", step
        counts[urn_type(step["urn"])] = counts.get(urn_type(step["urn"]), 0) + 1
    assert {t: counts.get(t, 0) for t in EXPECTED} == EXPECTED, counts
    assert sessions == {name: 0 for name in lab_nodes}, f"preview opened SSH sessions: {sessions}"


@pytest.fixture(scope="module")
def first_up(stack):
    """`pulumi up --json`: the engine's events, one JSON object a line."""
    result = stack.run("up", "--yes", "--skip-preview", "--json", timeout=1800)
    return result, result.events()


def test_first_up_creates_everything_in_dependency_order(first_up):
    result, events = first_up
    steps = finished(events)
    created = [(t, n) for t, n, op in steps if op == "create"]
    types = [t for t, _ in created]
    assert {t: types.count(t) for t in EXPECTED if t != "qwen35:index:Deployment"} == {
        t: n for t, n in EXPECTED.items() if t != "qwen35:index:Deployment"
    }, steps
    order = [n for _, n in created]

    def at(suffix: str) -> int:
        (index,) = [i for i, name in enumerate(order) if name.endswith(suffix)]
        return index

    # The program's dependencies: the head's copy and checkpoint before the proof, the proof before
    # any container, each node's copy and checkpoint before its container, head before worker.
    assert at("image-node-a") < at("model-support") < at("ray-head")
    assert at("checkpoint-node-a") < at("model-support")
    assert at("image-node-a") < at("image-node-b") < at("ray-worker-node-b")
    assert at("checkpoint-node-a") < at("checkpoint-node-b") < at("ray-worker-node-b")
    assert at("ray-head") < at("ray-worker-node-b") < at("vllm") < at("ready")
    assert "Traceback" not in result.out + result.err


def test_the_endpoint_answers_a_completion_with_the_api_key_only(first_up, stack, secrets):
    outputs = stack.run("stack", "output", "--json").json()
    assert set(outputs) >= OUTPUTS, outputs
    assert outputs["containers"] == {
        "node-a": ["qwen35-ray-head", "qwen35-vllm"],
        "node-b": ["qwen35-ray-worker"],
    }
    client = openai.OpenAI(base_url=outputs["endpoint"], api_key=secrets["api_key"], timeout=30)
    reply = client.chat.completions.create(
        model=outputs["served_model"], messages=[{"role": "user", "content": "hello"}], max_tokens=8
    )
    assert reply.choices[0].message.content
    anonymous = openai.OpenAI(base_url=outputs["endpoint"], api_key="not-the-key", timeout=30)
    with pytest.raises(openai.AuthenticationError):
        anonymous.chat.completions.create(
            model=outputs["served_model"], messages=[{"role": "user", "content": "hello"}], max_tokens=8
        )


def test_secrets_are_in_no_output_state_or_display(first_up, stack, secrets, engine):
    result, events = first_up
    texts = {
        "up display": result.out + result.err,
        "event log": json.dumps(events),
        "stack output": stack.run("stack", "output", "--json").out,
        "stack export": stack.run("stack", "export").out,
    }
    for path in Path(engine.backend).rglob("*"):
        if path.is_file():
            texts[f"backend {path.name}"] = path.read_text(errors="replace")
    for key, value in secrets.items():
        leaked = [where for where, text in texts.items() if value in text]
        assert not leaked, f"{key} in plaintext in: {leaked}"


def test_second_up_and_refresh_find_nothing_to_change(first_up, stack):
    noop = stack.run("up", "--yes", "--skip-preview", "--expect-no-changes", "--json")
    assert changed_steps(noop.events()) == []
    refreshed = stack.run("refresh", "--yes", "--skip-preview", "--expect-no-changes", "--json", check=False)
    assert refreshed.returncode == 0, changed_steps(refreshed.events()) or refreshed.err[-4000:]
    assert changed_steps(refreshed.events()) == []


def test_a_bad_config_fails_before_any_resource_naming_the_field(engine, lab_config):
    config = lab_config()
    nodes = [dict(n) for n in config["qwen35-spark:nodes"]]
    nodes[1]["fabric_ip"] = "127.0.0.300"
    config["qwen35-spark:nodes"] = nodes
    bad = new_stack(engine, "engine-bad", config)
    try:
        shown = bad.run("preview", check=False)
        assert shown.returncode != 0
        text = shown.out + shown.err
        assert "nodes.1.fabric_ip: '127.0.0.300' is not an IP address" in text, text
        assert "Traceback" not in text, text
        events = bad.run("up", "--yes", "--skip-preview", "--json", check=False).events()
        registered = [e["resourcePreEvent"]["metadata"]["type"] for e in events if "resourcePreEvent" in e]
        assert registered == ["pulumi:pulumi:Stack"], registered
    finally:
        bad.remove()


def test_destroy_leaves_no_container_volume_or_tag(first_up, stack, lab_nodes):
    stack.run("destroy", "--yes", timeout=900)
    exported = json.loads(stack.run("stack", "export").out)
    assert [r["type"] for r in exported["deployment"].get("resources") or []] == []
    for node in lab_nodes.values():
        names = lab.docker(node, "ps", "-a", "--format", "{{.Names}}").out.split()
        assert not [n for n in names if n.startswith("qwen35-")], (node.name, names)
        volumes = lab.docker(node, "volume", "ls", "--format", "{{.Name}}").out.split()
        assert not [v for v in volumes if v.startswith("qwen35-")], (node.name, volumes)
    tags = lab.docker(lab_nodes["node-b"], "images", "--format", "{{.Repository}}:{{.Tag}}").out
    assert not re.search(r"^lab-ray:", tags, re.M), tags
