"""The program under the real Pulumi engine on the lab: preview, first up, no-op up and refresh, a bad
config, destroy. The evidence is the engine's own output (`--json`, `--event-log`, `stack export`) and
the nodes, never the program's logs.

The Docker provider's container behaviours the program relies on, each of which the Terraform
provider's v3.9.0 (what pulumi-docker 4.11.2 wraps) gets wrong, are proven here too: node-a and node-b
rotate their logs in daemon.json, and a second `up` and a refresh still change nothing; a refresh keeps
a stopped server (and its logs) and `up` starts it; a replacement and `destroy` succeed when a container
was removed by hand; a stack last deployed under the old pin ups with no container replaced."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

import lab
from engine import install_plugin
from engine.__main__ import destroy_stack
from engine.lab_stack import write_config
from lab.layout import ROTATED_LOGS
from lab.logins import counted_logins
from tests.engine.conftest import (
    CHECKPOINT,
    CLAIM,
    CONTAINER,
    GATE,
    HEALTH_SECRET,
    MODEL_SUPPORT,
    NODE_IMAGE,
    PROVIDER,
    VOLUME,
    Stack,
    answers,
    changed_steps,
    changes,
    clear_caches,
    errors,
    finished,
    new_stack,
    secret_stack,
    urn_name,
    urn_type,
)

pytestmark = pytest.mark.engine

# What the program registers for two lab nodes (README, "What a stack deploys").
EXPECTED = {
    PROVIDER: 2,
    CLAIM: 2,
    NODE_IMAGE: 2,
    CHECKPOINT: 2,
    MODEL_SUPPORT: 1,
    VOLUME: 4,  # the Ray head's temp volume, a compile cache per node, the watchdog's state
    CONTAINER: 5,  # Ray head, Ray worker, vLLM; the health agent on node-b, the watchdog on node-a
    GATE: 1,
    HEALTH_SECRET: 1,
    "qwen35:index:Deployment": 1,
}
SERVER = "qwen35-vllm"
OUTPUTS = {
    "endpoint",
    "served_model",
    "dashboard",
    "images",
    "checkpoints",
    "containers",
    "model_support",
    "health",
    "scrape_targets",
}


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
    # After the gate: the agent, then the watchdog (it asks the agent).
    assert at("ready") < at("health-agent-node-b") < at("watchdog")
    assert "Traceback" not in result.out + result.err


def test_the_endpoint_answers_a_completion_with_the_api_key_only(first_up, stack, secrets):
    outputs = stack.run("stack", "output", "--json").json()
    assert set(outputs) >= OUTPUTS, outputs
    assert outputs["containers"] == {
        "node-a": ["qwen35-ray-head", "qwen35-vllm", "qwen35-watchdog"],
        "node-b": ["qwen35-ray-worker", "qwen35-health-agent"],
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


def containers_on(node: lab.LabNode) -> list[str]:
    return [
        n
        for n in lab.docker(node, "ps", "-a", "--format", "{{.Names}}").out.split()
        if n.startswith("qwen35-")
    ]


def container_state(node: lab.LabNode, name: str) -> tuple[str, bool]:
    """(ID, running) of a container on a node."""
    found = lab.docker(node, "inspect", "--format", "{{.Id}} {{.State.Running}}", name).out.split()
    return found[0], found[1] == "true"


def test_second_up_and_refresh_find_nothing_to_change(first_up, stack, lab_nodes):
    # The condition under test: each container carries the daemon's default log options, which the
    # v3.9.0 provider stored and then wanted to remove (a replacement of every container on every up).
    for node in lab_nodes.values():
        for name in containers_on(node):
            opts = json.loads(
                lab.docker(node, "inspect", "--format", "{{json .HostConfig.LogConfig.Config}}", name).out
            )
            assert opts == dict(ROTATED_LOGS), (node.name, name, opts)
    noop = stack.run("up", "--yes", "--skip-preview", "--expect-no-changes", "--json")
    assert changed_steps(noop.events()) == []
    refreshed = stack.run("refresh", "--yes", "--skip-preview", "--expect-no-changes", "--json", check=False)
    assert refreshed.returncode == 0, changed_steps(refreshed.events()) or refreshed.err[-4000:]
    assert changed_steps(refreshed.events()) == []


# The plugin version pulumi-docker 4.11.2 registered this program's providers with.
OLD_PIN = "4.11.2"


def test_a_stack_last_deployed_under_the_old_pin_ups_without_replacing_a_container(
    first_up, stack, engine, lab_nodes
):
    """The state an `up` under pulumi-docker==4.11.2 left differs in the providers' `version`; the
    same containers must stay (the first `up` after the version change updates the providers only)."""
    install_plugin(engine, engine.pulumi.parent / "pulumi-resource-docker", "resource", "docker", OLD_PIN)
    exported = json.loads(stack.run("stack", "export").out)
    providers = [r for r in exported["deployment"]["resources"] if r["type"] == PROVIDER]
    assert len(providers) == 2, providers
    for resource in providers:
        assert resource["inputs"]["version"] == "5.2.0", resource["inputs"]
        resource["inputs"]["version"] = resource["outputs"]["version"] = OLD_PIN
    stack.run("stack", "import", "--file", "/dev/stdin", stdin=json.dumps(exported))
    before = {
        node.name: {n: container_state(node, n)[0] for n in containers_on(node)}
        for node in lab_nodes.values()
    }
    done = stack.run("up", "--yes", "--skip-preview", "--json", check=False)
    assert done.returncode == 0, errors(done.events()) or done.err[-3000:]
    changed = changed_steps(done.events())
    assert changed and {t for t, _, _ in changed} == {PROVIDER}, changed
    assert {op for _, _, op in changed} == {"update"}, changed
    after = {
        node.name: {n: container_state(node, n)[0] for n in containers_on(node)}
        for node in lab_nodes.values()
    }
    assert after == before
    versions = {
        r["inputs"]["version"]
        for r in json.loads(stack.run("stack", "export").out)["deployment"]["resources"]
        if r["type"] == PROVIDER
    }
    assert versions == {"5.2.0"}, versions


def test_a_stopped_server_is_drift_its_container_and_logs_stay_and_up_starts_it(
    first_up, stack, lab_nodes, secrets
):
    head = lab_nodes["node-a"]
    old_id, running = container_state(head, SERVER)
    assert running
    lab.docker(head, "stop", SERVER)
    logs = lab.docker(head, "logs", SERVER)
    assert (logs.out + logs.err).strip(), "the stopped server left no log lines to keep"
    refreshed = stack.run("refresh", "--yes", "--skip-preview", "--json", check=False, timeout=900)
    assert refreshed.returncode == 0, refreshed.err[-3000:]
    found = changes(refreshed.events())
    # Drift on the server (the gate's probe finds nothing serving too), never a deletion of it.
    assert found.get(SERVER) == "update", found
    assert set(found) <= {SERVER, "qwen35-ready"}, found
    # The refresh removed nothing on the node: the same container, stopped, its logs all there.
    assert container_state(head, SERVER) == (old_id, False)
    kept = lab.docker(head, "logs", SERVER)
    assert (kept.out, kept.err) == (logs.out, logs.err)
    done = stack.run("up", "--yes", "--skip-preview", "--json", check=False)
    assert done.returncode == 0, errors(done.events()) or done.err[-3000:]
    assert container_state(head, SERVER)[1], "up did not start the server again"
    answers(stack, secrets["api_key"])
    clean = stack.run("refresh", "--yes", "--skip-preview", "--expect-no-changes", "--json", check=False)
    assert clean.returncode == 0, changes(clean.events())


def test_a_replacement_succeeds_when_the_old_container_was_removed_by_hand(
    first_up, stack, lab_nodes, lab_config, secrets
):
    head = lab_nodes["node-a"]
    lab.docker(head, "rm", "-f", SERVER)
    # No refresh first: the state still holds the removed server, and the changed command line
    # replaces it (deleting the old one first, which is already gone).
    base = lab_config()
    serve = {**base["qwen35-spark:serve"], "max_model_len": 2048}
    write_config(stack.config, lab_config(serve=serve))
    done = stack.run("up", "--yes", "--skip-preview", "--json", check=False)
    assert done.returncode == 0, errors(done.events()) or done.err[-3000:]
    ops = {
        (urn_name(m["urn"]), m["op"])
        for m in (e["resOutputsEvent"]["metadata"] for e in done.events() if "resOutputsEvent" in e)
    }
    assert (SERVER, "delete-replaced") in ops or (SERVER, "replace") in ops, sorted(ops)
    assert container_state(head, SERVER)[1]
    answers(stack, secrets["api_key"])


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


def test_destroy_after_a_worker_was_removed_by_hand_leaves_no_container_volume_or_tag(
    first_up, stack, lab_nodes
):
    lab.docker(lab_nodes["node-b"], "rm", "-f", "qwen35-ray-worker")
    # `make down`'s own destroy, with the state still holding the removed worker.
    assert destroy_stack(stack.engine, stack.name, stack.config) == 0
    for node in lab_nodes.values():
        assert containers_on(node) == [], node.name
        volumes = lab.docker(node, "volume", "ls", "--format", "{{.Name}}").out.split()
        # The compile cache stays, as the checkpoint does (model.keep_on_destroy, default true).
        left = [v for v in volumes if v.startswith("qwen35-") and v != "qwen35-compile-cache"]
        assert not left, (node.name, volumes)
    tags = lab.docker(lab_nodes["node-b"], "images", "--format", "{{.Repository}}:{{.Tag}}").out
    assert not re.search(r"^lab-ray:", tags, re.M), tags


def test_make_down_succeeds_after_a_failed_up(engine, lab_nodes, lab_config):
    """An `up` that fails at the model-support check (the lab image under `enforce`) leaves the
    providers, claims, image copies and checkpoints; `make down`'s destroy removes them all. Last in
    the module: the lab stack's claims on node-a and node-b are gone by then."""
    config = lab_config()
    config["qwen35-spark:image"] = {**config["qwen35-spark:image"], "model_check": "enforce"}
    failed = new_stack(engine, "engine-failed", config)
    try:
        up = failed.run("up", "--yes", "--skip-preview", "--json", check=False)
        assert up.returncode != 0
        assert any("model" in message for message in errors(up.events())), errors(up.events())
        left = json.loads(failed.run("stack", "export").out)["deployment"].get("resources") or []
        assert any(r["type"] == NODE_IMAGE for r in left), [r["type"] for r in left]
        assert destroy_stack(engine, failed.name, failed.config) == 0
        assert not failed.config.exists()
        listed = {s["name"] for s in engine.run("stack", "ls", "--json").json()}
        assert failed.name not in listed
    finally:
        failed.remove()
