"""The image built under the real Pulumi engine: the committed lab stack's hybrid, and a graft.

`image.strategy: hybrid` and `graft` deploy with the program's own ImageBuild: `docker build` on
node-a's daemon over SSH, the context (patches/) streamed from this machine, nothing pushed. For the
hybrid (Pulumi.lab.yaml as committed): the first `up` builds once, proves, copies to node-b and
serves; a no-op `up` builds nothing; a changed file under patches/ rebuilds and replaces what runs
the image; a base image rebuilt under the same reference is drift to refresh, and `up` builds it
again and replaces what runs it; refresh is clean. The graft's stack builds and serves once and
refreshes clean, and a proof that fails (the cluster-layer proof, for a Ray other than the base's)
stops `up` at the build, with no tag and no container touched. (The lab's hybrid has no
config-reachable failing proof: its stand-ins carry no torch, so only the compatibility proof runs,
and the lab's trees pass it.)
"""

from __future__ import annotations

import json
import re
import secrets as pysecrets
from collections.abc import Iterator

import pytest

import lab
from components.image_build.component import PATCH_DIR, built_ref
from engine.lab_stack import engine_lab_config, lab_image_config, write_config
from lab.ray_image import ray_image
from lab.vllm_images import lab_build_inputs
from tests.engine.conftest import (
    CONTAINER,
    NODE_IMAGE,
    Stack,
    answers,
    changed_steps,
    changes,
    errors,
    finished,
    outputs_of,
    secret_stack,
)
from tests.support.lab_nodes import container_ids

pytestmark = pytest.mark.engine

NS = "qwen35-spark"
IMAGE_BUILD = "pulumi-python:dynamic/qwen35:ImageBuild"
R_BUILD = "qwen35-image-build"
# A file under patches/ that only this module writes: patches/wheels/ is ignored by git, and every
# file there is part of the build context (and so of the content tag).
MARKER = PATCH_DIR / "wheels" / "engine-test-changed-file.txt"


def secrets_token() -> str:
    return pysecrets.token_hex(8)


def exited_containers(node: lab.LabNode) -> list[str]:
    """Containers a failed build step could leave (the legacy builder keeps them without --force-rm)."""
    return lab.docker(node, "ps", "-a", "--filter", "status=exited", "--format", "{{.Names}}").out.split()


def build_lines(events: list[dict]) -> list[str]:
    """The build's own lines as the engine displayed them (the provider's progress diagnostics)."""
    return [
        e["diagnosticEvent"].get("message", "")
        for e in events
        if "image-build on node-a:" in e.get("diagnosticEvent", {}).get("message", "")
    ]


def up(stack: Stack, *extra: str) -> list[dict]:
    done = stack.run("up", "--yes", "--skip-preview", "--json", *extra, check=False, timeout=1800)
    if done.returncode != 0:
        pytest.fail(
            "pulumi up failed:\n" + ("\n".join(errors(done.events())) or done.err[-3000:]), pytrace=False
        )
    return done.events()


def assert_clean(stack: Stack) -> None:
    done = stack.run("refresh", "--yes", "--skip-preview", "--expect-no-changes", "--json", check=False)
    assert done.returncode == 0, changed_steps(done.events()) or done.err[-3000:]


def untag(nodes: dict[str, lab.LabNode], ref: str) -> None:
    """The reference off every node, so the first `up` builds and copies it for real."""
    for node in nodes.values():
        lab.docker(node, "rmi", ref, check=False)


# ---- the committed hybrid ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def hybrid_config(lab_nodes, hub) -> dict:
    config = engine_lab_config(None, hub.endpoint)
    MARKER.unlink(missing_ok=True)
    try:
        lab_build_inputs(lab_nodes["node-a"], lab_image_config(config), PATCH_DIR)
    except lab.LabError as exc:
        pytest.fail(f"the hybrid's stand-ins could not be made on node-a: {exc}", pytrace=False)
    return config


@pytest.fixture(scope="module")
def hybrid(engine, lab_nodes, hybrid_config, secrets) -> Iterator[Stack]:
    untag(lab_nodes, built_ref(lab_image_config(hybrid_config)))
    try:
        with secret_stack(engine, "engine-hybrid", hybrid_config, secrets) as made:
            yield made
    finally:
        MARKER.unlink(missing_ok=True)


@pytest.fixture(scope="module")
def first_up(hybrid) -> list[dict]:
    return up(hybrid)


def test_the_first_up_builds_the_hybrid_once_copies_it_and_serves(first_up, hybrid, hybrid_config, secrets):
    builds = [step for step in finished(first_up) if step[0] == IMAGE_BUILD]
    assert builds == [(IMAGE_BUILD, R_BUILD, "create")], builds
    built = outputs_of(first_up, R_BUILD)
    assert built["built"] is True and built["ref"] == built_ref(lab_image_config(hybrid_config)), built
    # Every node runs what was built on the head.
    for node in ("node-a", "node-b"):
        assert outputs_of(first_up, f"qwen35-image-{node}")["image_id"] == built["image_id"], node
    # The build's own lines reached the display: the Dockerfile's steps and the proofs' verdicts.
    shown = "\n".join(build_lines(first_up))
    # The Dockerfile's steps as the builder prints them (a step the layer cache holds prints no
    # output of its own: the rebuild below checks a verdict line).
    assert re.search(r"Step \d+/\d+ : RUN", shown), shown[-3000:]
    answers(hybrid, secrets["api_key"])


def test_a_no_op_up_builds_nothing_and_refresh_is_clean(first_up, hybrid):
    events = up(hybrid, "--expect-no-changes")
    assert changed_steps(events) == []
    assert not [line for line in build_lines(events) if "building" in line], build_lines(events)
    assert_clean(hybrid)


def test_a_changed_file_under_patches_rebuilds_and_replaces_what_runs_the_image(
    first_up, hybrid, hybrid_config, lab_nodes, secrets
):
    before = container_ids(lab_nodes)
    old_ref = outputs_of(first_up, R_BUILD)["ref"]
    # New bytes every run: a tag an earlier run built from the same change would be kept, not built.
    MARKER.write_text(f"a change to the build context {secrets_token()}\n")
    events = up(hybrid)
    ops: dict[tuple[str, str], set[str]] = {}
    for t, n, op in finished(events):
        ops.setdefault((t, n), set()).add(op)
    assert "create-replacement" in ops[(IMAGE_BUILD, R_BUILD)], ops
    new = outputs_of(events, R_BUILD)
    assert new["built"] is True and new["ref"] != old_ref, new
    # Every step after the changed COPY ran again: its own output, not the step's text, is shown.
    shown = "\n".join(build_lines(events))
    assert re.search(r"pip check \(exit \d+\), recorded in", shown), shown[-3000:]
    # The content tag hashes the context as it is now, the new file included.
    assert new["ref"] == built_ref(lab_image_config(hybrid_config)), new
    unchanged = {"same", "read", "refresh"}
    replaced = {n for (t, n), seen in ops.items() if t == CONTAINER and seen - unchanged}
    # Every container runs the image: the health agent and the watchdog too.
    assert replaced == {
        "qwen35-ray-head",
        "qwen35-ray-worker-node-b",
        "qwen35-vllm",
        "qwen35-health-agent-node-b",
        "qwen35-watchdog",
    }, ops
    copied = {n for (t, n), seen in ops.items() if t == NODE_IMAGE and seen - unchanged}
    assert copied == {"qwen35-image-node-a", "qwen35-image-node-b"}, ops
    after = container_ids(lab_nodes)
    assert set(after) == set(before) and all(after[k] != before[k] for k in before), (before, after)
    answers(hybrid, secrets["api_key"])
    assert_clean(hybrid)


def recorded_build(stack: Stack) -> dict:
    """The ImageBuild's outputs as the stack's state holds them."""
    resources = json.loads(stack.run("stack", "export", "--show-secrets").out)["deployment"]["resources"]
    (build,) = [r for r in resources if r["type"] == IMAGE_BUILD]
    return build["outputs"]


def test_a_base_rebuilt_under_its_reference_is_seen_by_refresh_and_up_rebuilds(
    first_up, hybrid, hybrid_config, lab_nodes, secrets
):
    # `vllm-node:latest` rebuilt with a new NCCL or Ray, as an operator does: the same reference, another
    # image. The build's inputs (files, args) are unchanged, so only the base's ID can tell.
    node, base = lab_nodes["node-a"], lab_image_config(hybrid_config).base_ref
    old_base = lab.docker(node, "image", "inspect", "--format", "{{.Id}}", base).out.strip()
    before = recorded_build(hybrid)
    assert before["source_ids"]["BASE_IMAGE"] == old_base, before
    rebuilt = f"FROM {base}\nLABEL qwen35.engine-test.rebuilt={secrets_token()}\n".encode()
    lab.docker(node, "build", "--tag", base, "-", input=rebuilt, timeout=300)
    new_base = lab.docker(node, "image", "inspect", "--format", "{{.Id}}", base).out.strip()
    try:
        assert new_base != old_base
        done = hybrid.run("refresh", "--yes", "--skip-preview", "--json", check=False)
        assert done.returncode == 0, done.err[-3000:]
        # refresh sees the new base as drift of the build, and records it.
        assert changes(done.events()).get(R_BUILD) == "update", changes(done.events())
        refreshed = recorded_build(hybrid)
        assert refreshed["observed_source_ids"]["BASE_IMAGE"] == new_base, refreshed
        assert refreshed["source_ids"]["BASE_IMAGE"] == old_base, refreshed
        container_before = container_ids(lab_nodes)
        events = up(hybrid)
        ops = {(t, n): op for t, n, op in finished(events)}
        assert ops[(IMAGE_BUILD, R_BUILD)] == "update", ops
        built = outputs_of(events, R_BUILD)
        # Built again under the same tag, from the new base; what runs the image follows its ID.
        assert built["built"] is True and built["ref"] == before["ref"], built
        assert built["image_id"] != before["image_id"] and built["source_ids"]["BASE_IMAGE"] == new_base
        for name in ("node-a", "node-b"):
            assert outputs_of(events, f"qwen35-image-{name}")["image_id"] == built["image_id"], name
        running = lab.docker(node, "inspect", "--format", "{{.Image}}", "qwen35-vllm").out.strip()
        assert running == built["image_id"]
        after = container_ids(lab_nodes)
        assert all(after[k] != container_before[k] for k in container_before), (container_before, after)
        answers(hybrid, secrets["api_key"])
        assert_clean(hybrid)
        # The build before is gone from every node, the head included: once no container ran it, the
        # old NodeImages' deletes removed the image the tag no longer names.
        for each in lab_nodes.values():
            found = lab.docker(each, "image", "inspect", before["image_id"], check=False)
            assert found.returncode != 0, f"the previous build is still on {each.name}"
    finally:
        # The lab's base as the other modules know it (the rebuilt one stays as the new build's parent).
        lab.docker(node, "tag", old_base, base)
        # Should the test have failed before the deletes: no later module finds its layers on node-b.
        for each in lab_nodes.values():
            lab.docker(each, "image", "rm", before["image_id"], check=False)


def test_the_hybrid_stack_destroys_cleanly(first_up, hybrid, lab_nodes):
    hybrid.run("destroy", "--yes", timeout=900)
    resources = json.loads(hybrid.run("stack", "export").out)["deployment"].get("resources") or []
    assert [r["type"] for r in resources] == []
    for node in lab_nodes.values():
        names = lab.docker(node, "ps", "-a", "--format", "{{.Names}}").out.split()
        assert not [n for n in names if n.startswith("qwen35-")], (node.name, names)


# ---- a graft -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def graft_config(lab_nodes, hub) -> dict:
    base, _ = ray_image(lab_nodes["node-a"])
    image = {
        "strategy": "graft",
        "base": base,
        "donor": "lab-vllm-graft-donor:0.17.1",
        "name": "lab-vllm-qwen35-graft",
        "platform": "linux/amd64",
        "pip_args": ["--no-index", "--find-links", "/opt/qwen35/wheels"],
        "build_network": "host",
        "smoke": False,
        "model_check": "report",
    }
    config = engine_lab_config(None, hub.endpoint, image=image)
    try:
        lab_build_inputs(lab_nodes["node-a"], lab_image_config(config), PATCH_DIR)
    except lab.LabError as exc:
        pytest.fail(f"the graft's donor stand-in could not be made on node-a: {exc}", pytrace=False)
    return config


@pytest.fixture(scope="module")
def graft(engine, lab_nodes, graft_config, secrets) -> Iterator[Stack]:
    untag(lab_nodes, built_ref(lab_image_config(graft_config)))
    with secret_stack(engine, "engine-graft", graft_config, secrets) as made:
        yield made


@pytest.fixture(scope="module")
def graft_up(graft) -> list[dict]:
    return up(graft)


def test_a_graft_stack_builds_once_serves_and_refreshes_clean(graft_up, graft, lab_nodes, secrets):
    builds = [step for step in finished(graft_up) if step[0] == IMAGE_BUILD]
    assert builds == [(IMAGE_BUILD, R_BUILD, "create")], builds
    built = outputs_of(graft_up, R_BUILD)
    assert built["built"] is True
    shown = "\n".join(build_lines(graft_up))
    assert '"verdict": "pass"' in shown or '"verdict":"pass"' in shown, shown[-3000:]
    answers(graft, secrets["api_key"])
    # The Ray the graft carried runs the cluster: the Ray head on node-a runs the grafted image.
    head = lab.docker(lab_nodes["node-a"], "inspect", "--format", "{{.Image}}", "qwen35-ray-head").out.strip()
    assert head == built["image_id"]
    assert_clean(graft)
    assert changed_steps(up(graft, "--expect-no-changes")) == []


def test_a_failing_proof_stops_up_at_the_build_with_no_tag_and_no_container_touched(
    graft_up, graft, graft_config, lab_nodes, secrets
):
    # A Ray other than the base's: the cluster-layer proof in the build refuses it.
    image = {**graft_config[f"{NS}:image"], "ray_version": "==2.59.0"}
    config = {**graft_config, f"{NS}:image": image}
    refused_ref = built_ref(lab_image_config(config))
    before = container_ids(lab_nodes)
    exited = exited_containers(lab_nodes["node-a"])
    write_config(graft.config, config)
    try:
        done = graft.run("up", "--yes", "--skip-preview", "--json", check=False, timeout=1800)
        assert done.returncode != 0
        said = "\n".join(errors(done.events()))
        assert "cluster-layer proof failed" in said and "nothing was tagged" in said, said[-3000:]
        assert "Traceback" not in said, said
        changed = [step for step in changed_steps(done.events()) if step[0] != IMAGE_BUILD]
        assert changed == [], changed
        assert container_ids(lab_nodes) == before
        assert lab.docker(lab_nodes["node-a"], "image", "inspect", refused_ref, check=False).returncode != 0
        assert exited_containers(lab_nodes["node-a"]) == exited
    finally:
        write_config(graft.config, graft_config)
    # Back to the config that built: nothing to build, nothing replaced, still serving.
    events = up(graft)
    assert [s for s in changed_steps(events) if s[0] in (CONTAINER, NODE_IMAGE, IMAGE_BUILD)] == [], (
        changed_steps(events)
    )
    answers(graft, secrets["api_key"])
