"""Upgrades and rollback under the real engine: a new image (one new top
layer) and a new checkpoint revision reach the nodes while the old server answers, the model-support
check runs before any container is touched, containers are replaced old-first, and a rollback to the
previous image, or to the previous revision, is one `pulumi up` that sends no image or checkpoint
byte. An image the check refuses leaves the old containers serving. Evidence: the engine's events
(stamped as they arrive), its state (`stack export`), the nodes' Docker, the stand-in Hub's request
log, and completions sent all along."""

from __future__ import annotations

import json
import secrets as pysecrets
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import lab
from bench.engine import Prober, Run, build_image
from bench.engine import up as engine_up
from engine import ROOT
from engine.lab_stack import write_config
from lab.standin_hub import load_repo
from tests.engine.conftest import (
    CHECKPOINT,
    CONTAINER,
    GATE,
    HEALTH_CONTAINERS,
    MODEL_SUPPORT,
    NODE_IMAGE,
    REPO_ID,
    Stack,
    clear_caches,
    exported,
    secret_stack,
)
from tests.support.lab_nodes import container_ids, tags_on

pytestmark = pytest.mark.engine

TOP_MB = 48  # the new top layer: big enough that its copy takes a measurable while


def up(stack: Stack) -> Run:
    """`pulumi up --json` of the stack, every engine event stamped on arrival."""
    return engine_up(stack.engine, stack.name)


def image_section(ref: str, check: str = "report") -> dict:
    return {"strategy": "prebuilt", "prebuilt": ref, "model_check": check}


def with_sections(lab_config, **sections) -> dict:
    """The lab stack's config with whole sections replaced (`image` included, which the fixture's
    own signature takes as the lab image)."""
    config = lab_config()
    config.update({f"qwen35-spark:{key}": value for key, value in sections.items()})
    return config


@pytest.fixture(scope="module")
def stack(engine, lab_nodes, lab_config, secrets) -> Iterator[Stack]:
    clear_caches(lab_nodes)
    with secret_stack(engine, "engine-upgrade", lab_config(), secrets) as made:
        made.run("up", "--yes", "--skip-preview", timeout=1800)
        yield made


@pytest.fixture(scope="module")
def new_image(lab_nodes, lab_image) -> Iterator[str]:
    """The lab image plus one new top layer (random bytes), on the head only."""
    name = lab_image.rpartition(":")[0]
    tag = f"{name}:upgrade-{pysecrets.token_hex(3)}"
    nonce = pysecrets.token_hex(8)
    build_image(
        lab_nodes["node-a"],
        lab_image,
        tag,
        f"echo {nonce} > /upgrade && dd if=/dev/urandom of=/upgrade.bin bs=1M count={TOP_MB} status=none",
    )
    yield tag
    for node in lab_nodes.values():
        lab.docker(node, "image", "rm", tag, check=False)


@pytest.fixture(scope="module")
def endpoint(stack) -> tuple[str, str]:
    outputs = stack.run("stack", "output", "--json").json()
    return outputs["endpoint"], outputs["served_model"]


@pytest.fixture(scope="module")
def upgrade(stack, lab_nodes, lab_config, new_image, endpoint, secrets):
    """The upgrade to the new image, with completions sent all along: (run, prober, ids before)."""
    before = container_ids(lab_nodes, stopped=False)
    write_config(stack.config, with_sections(lab_config, image=image_section(new_image)))
    with Prober(*endpoint, secrets["api_key"]) as prober:
        time.sleep(1.0)
        run = up(stack)
        time.sleep(1.0)
    return run, prober, before


def test_upgrade_copies_only_the_new_layer_while_the_old_server_answers(upgrade, stack, lab_image):
    run, prober, _ = upgrade
    assert run.returncode == 0, run.err[-4000:]
    (copy,) = [s for s in run.of(NODE_IMAGE, "node-b") if s.op in ("create-replacement", "create")]
    outs = exported(stack, NODE_IMAGE)
    worker = next(o for name, o in outs.items() if name.endswith("node-b"))
    assert worker["skipped"] is False
    assert (worker["layers_sent"], worker["layers_left_out"]) == (1, len(worker["layers"]) - 1), worker
    assert TOP_MB << 20 <= worker["layer_bytes_sent"] < (TOP_MB + 8) << 20, worker
    answered = prober.answered_between(copy.began, copy.ended)
    print(
        f"upgrade: node-b copy {copy.ended - copy.began:.2f} s, {worker['bytes_sent'] / 1e6:.1f} MB sent "
        f"({worker['layers_sent']} of {len(worker['layers'])} layers), {answered} answers meanwhile"
    )
    assert answered > 0, "the old server answered no completion during the copy"


def test_upgrade_proves_the_new_image_before_any_container_and_replaces_old_first(upgrade):
    run, prober, _ = upgrade
    (proof,) = [s for s in run.of(MODEL_SUPPORT) if s.op in ("create-replacement", "update", "create")]
    containers = run.of(CONTAINER)
    assert containers, [(s.type, s.name, s.op) for s in run.steps]
    first_touch = min(s.began for s in containers)
    assert proof.ended is not None and proof.ended <= first_touch, (proof, containers)
    for name in {s.name for s in containers}:
        ops = [s for s in containers if s.name == name]
        deleted = [s for s in ops if s.op == "delete-replaced"]
        created = [s for s in ops if s.op == "create-replacement"]
        assert deleted and created, (name, ops)
        # host networking and the GPUs: the old container is gone before its successor starts
        assert (deleted[0].ended or deleted[0].began) <= created[0].began, (name, ops)
    (gate,) = [s for s in run.of(GATE) if s.op in ("update", "create", "create-replacement")]
    serving = [s for s in containers if s.name not in HEALTH_CONTAINERS]
    assert gate.ended is not None and gate.ended >= max(s.ended or 0 for s in serving)
    # The health stage follows the gate (its containers run the new image too).
    health = [s for s in containers if s.name in HEALTH_CONTAINERS and s.op == "create-replacement"]
    assert {s.name for s in health} == set(HEALTH_CONTAINERS), [(s.name, s.op) for s in containers]
    assert all(s.began >= gate.ended for s in health), (gate, health)
    window = prober.outage(after=first_touch)
    assert window is not None, "no request failed: the old server cannot have been stopped"
    last_old, first_new = window
    assert first_new != float("inf"), "the new server never answered"
    print(f"upgrade: outage {first_new - last_old:.2f} s (old server last answer to new first)")
    assert last_old >= first_touch - 0.5, "the old server stopped answering before any container changed"


def test_the_previous_image_stays_on_every_node_and_is_declared(upgrade, stack, lab_nodes, lab_image):
    for node in lab_nodes.values():
        assert lab_image in tags_on(node), (node.name, tags_on(node))
    outputs = stack.run("stack", "output", "--json").json()
    assert outputs["keep_previous"] == 1
    status = subprocess.run(
        [str(ROOT / ".venv/bin/python"), "-m", "status", "--stack", stack.name, "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    report = json.loads(status.stdout) if status.stdout.strip().startswith("{") else None
    assert report is not None, status.stderr[-2000:]
    assert report["retention"]["keep_previous"] == 1, report["retention"]
    assert report["retention"]["previous"]["node-b"] == [lab_image], report["retention"]


@pytest.fixture(scope="module")
def rollback(upgrade, stack, lab_config, endpoint, secrets):
    write_config(stack.config, lab_config())
    with Prober(*endpoint, secrets["api_key"]) as prober:
        run = up(stack)
    return run, prober


def test_rollback_is_one_up_that_sends_no_image_byte(rollback, stack, lab_nodes, lab_image, new_image):
    run, prober = rollback
    assert run.returncode == 0, run.err[-4000:]
    outs = exported(stack, NODE_IMAGE)
    assert {o["image"] for o in outs.values()} == {lab_image}
    assert all(o["bytes_sent"] == 0 and o["skipped"] for o in outs.values()), outs
    restarted = max(s.ended for s in run.of(CONTAINER) if s.op == "create-replacement")
    gate = max(s.ended for s in run.of(GATE))
    print(
        f"rollback: containers restarted {restarted - run.started:.1f} s after `pulumi up` began, "
        f"gate passed at {gate - run.started:.1f} s, 0 image bytes sent"
    )
    # now the upgraded image is the kept one
    assert new_image in tags_on(lab_nodes["node-b"])


@pytest.fixture(scope="module")
def refused(rollback, stack, lab_nodes, lab_config, lab_image, endpoint, secrets):
    """An image without Ray (one new top layer), under `image.model_check: enforce`."""
    name = lab_image.rpartition(":")[0]
    tag = build_image(
        lab_nodes["node-a"],
        lab_image,
        f"{name}:noray-{pysecrets.token_hex(3)}",
        "rm -rf /opt/ray/lib/python3*/site-packages/ray /opt/ray/bin/ray",
    )
    before = container_ids(lab_nodes, stopped=False)
    write_config(stack.config, with_sections(lab_config, image=image_section(tag, "enforce")))
    with Prober(*endpoint, secrets["api_key"]) as prober:
        run = up(stack)
        time.sleep(1.0)
    yield run, prober, before, tag
    write_config(stack.config, lab_config())
    for node in lab_nodes.values():
        lab.docker(node, "image", "rm", tag, check=False)


def test_a_refused_image_leaves_the_old_containers_serving(refused, lab_nodes):
    run, prober, before, tag = refused
    assert run.returncode != 0
    text = run.text()
    assert "Ray" in text or "ray" in text, text[-4000:]
    assert not run.of(CONTAINER), [(s.name, s.op) for s in run.of(CONTAINER)]
    # Nothing is torn down: the only delete is the check's own record (delete-before-replace; its
    # proof container was `--rm`, it leaves nothing on a node).
    deleted = [(s.name, s.op) for s in run.steps if s.op.startswith("delete") and s.type != MODEL_SUPPORT]
    assert not deleted, deleted
    assert container_ids(lab_nodes, stopped=False) == before
    assert prober.outage() is None, "a request failed while the refused image was checked"
    assert prober.answers and all(ok for _, ok in prober.answers[-5:])
    diagnostics = [
        e["diagnosticEvent"]["message"]
        for _, e in run.events
        if "diagnosticEvent" in e and e["diagnosticEvent"].get("severity") == "error"
    ]
    print("refused:", " | ".join(m.strip()[:300] for m in diagnostics)[:1200])
    assert any(tag in m or "model-support" in m or "Ray" in m for m in diagnostics), diagnostics
    # The reason reaches the operator as the message alone, with no Python traceback around it.
    framed = [m for m in diagnostics if "Traceback (most recent call last)" in m or 'File "' in m]
    assert not framed, framed


@pytest.fixture(scope="module")
def revision_upgrade(refused, stack, lab_nodes, lab_config, hub, endpoint, secrets, tmp_path_factory):
    """A second commit of the Hub repo (new weights), pinned by `model.revision`."""
    from lab.standin_hub import generate_repo

    repo = generate_repo(tmp_path_factory.mktemp("hub-repo-2"), shards=2, shard_bytes=2 << 20, seed=2)
    second = load_repo(REPO_ID, repo)
    old = hub.push(second)  # the old commit stays on the Hub, as real commits do: a rollback may pin it
    model = dict(lab_config()["qwen35-spark:model"], revision=second.sha)
    write_config(stack.config, with_sections(lab_config, model=model))
    try:
        with Prober(*endpoint, secrets["api_key"]) as prober:
            run = up(stack)
            time.sleep(1.0)
        yield run, prober, old.sha, second.sha
    finally:
        hub.repos[REPO_ID] = old
        hub.earlier.pop(REPO_ID, None)


def test_a_new_revision_arrives_while_the_old_one_serves(revision_upgrade, stack):
    run, prober, old_sha, new_sha = revision_upgrade
    assert run.returncode == 0, run.err[-4000:]
    outs = exported(stack, CHECKPOINT)
    assert {o.get("revision") for o in outs.values()} == {new_sha}, outs
    fetched = [s for s in run.of(CHECKPOINT) if s.op in ("create-replacement", "update", "create")]
    assert fetched, [(s.name, s.op) for s in run.steps]
    first_touch = min(s.began for s in run.of(CONTAINER))
    assert max(s.ended for s in fetched) <= first_touch
    answered = prober.answered_between(min(s.began for s in fetched), max(s.ended for s in fetched))
    assert answered > 0, "no answer while the new files arrived"
    last_old, first_new = prober.outage(after=first_touch) or (0.0, float("inf"))
    assert first_new != float("inf")
    print(f"revision: outage {first_new - last_old:.2f} s, {answered} answers while the files arrived")


@pytest.fixture(scope="module")
def revision_rollback(revision_upgrade, stack, lab_config, hub, endpoint, secrets):
    """Back to the previous commit (still on the Hub, still on every node): its sha pinned again."""
    _, _, old_sha, new_sha = revision_upgrade
    model = dict(lab_config()["qwen35-spark:model"], revision=old_sha)
    write_config(stack.config, with_sections(lab_config, model=model))
    asked = len(hub.requests)
    with Prober(*endpoint, secrets["api_key"]) as prober:
        run = up(stack)
        time.sleep(1.0)
    return run, prober, old_sha, new_sha, hub.requests[asked:]


def test_revision_rollback_is_one_up_that_resends_nothing(revision_rollback, stack):
    run, prober, old_sha, new_sha, hub_requests = revision_rollback
    assert run.returncode == 0, run.err[-4000:]
    outs = exported(stack, CHECKPOINT)
    assert {o.get("revision") for o in outs.values()} == {old_sha}, outs
    assert all(o["bytes_sent"] == 0 and o["files_sent"] == 0 for o in outs.values()), outs
    # The head resolves the pinned commit on the Hub, but no file is downloaded again.
    downloads = [(method, path) for method, path, _ in hub_requests if "/resolve/" in path]
    assert not downloads, downloads
    # The replaced revision's files stay on every node (delete() keeps them): a second rollback is free too.
    for name, o in outs.items():  # lab nodes share this machine's filesystem
        held = {p.name for p in Path(o["snapshot_path"]).parent.iterdir()}
        assert {old_sha, new_sha} <= held, (name, held)
    (gate,) = [s for s in run.of(GATE) if s.op in ("update", "create", "create-replacement")]
    assert gate.ended is not None
    assert prober.answers and all(ok for _, ok in prober.answers[-5:]), "the rolled-back server is silent"
    restarted = max(s.ended for s in run.of(CONTAINER) if s.op == "create-replacement")
    placed = max(s.ended for s in run.of(CHECKPOINT) if s.op == "create-replacement")
    last_old, first_new = prober.outage(after=run.started) or (0.0, 0.0)
    print(
        f"revision rollback: checkpoints placed {placed - run.started:.1f} s, containers restarted "
        f"{restarted - run.started:.1f} s after `pulumi up` began, gate passed at "
        f"{gate.ended - run.started:.1f} s, whole up {run.seconds:.1f} s, outage "
        f"{first_new - last_old:.2f} s; 0 checkpoint bytes sent, {len(hub_requests)} Hub requests "
        "(0 downloads)"
    )
