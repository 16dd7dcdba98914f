"""ImageBuild against a lab node, for real: the provider's create builds the lab's hybrid on node-a's
own daemon over SSH (the context streamed from here), read is clean, a moved or removed tag is drift
that update restores by a re-tag (no build) or, with the image gone too, a build; a failing proof
fails naming its stage with no tag and no stopped container left; delete leaves the head alone."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest
from pulumi.dynamic import CreateResult

import lab
from components.config import ImageConfig
from components.image_build import BUILD_TAG_PREFIX, ImageBuildError, ImageBuildProvider, context_digest
from components.image_build.component import (
    SOURCE_ARGS,
    BuiltImage,
    BuiltImageArgs,
    build_args,
    content_tag,
    context_rules,
    dockerfile,
)
from lab.images import busybox_image, image_id
from tests.lab.test_hybrid_build import lab_context, lab_image_config, standins
from tests.support.program import registered_by
from tests.support.provider_host import Engine, ProviderHost

pytestmark = pytest.mark.lab

# A repository of its own: the hybrid build tests' tags are never touched.
REPO = "lab-image-build-test"


@pytest.fixture(scope="module")
def cfg() -> ImageConfig:
    return lab_image_config()


@pytest.fixture(scope="module")
def context(cfg: ImageConfig, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return lab_context(cfg, tmp_path_factory.mktemp("image-build"))


def props_for(node: lab.LabNode, cfg: ImageConfig, context: Path, **extra_args: str) -> dict:
    """The inputs BuiltImage gives its ImageBuild, for the lab stack's image on `node`."""
    args = {**build_args(cfg), **extra_args}
    return {
        "node": {**lab.node_config(node), "name": node.name},
        "ref": f"{REPO}:{content_tag(context, args, cfg.platform)}",
        "context": str(context),
        "context_digest": context_digest(context, context_rules(args)),
        "context_rules": context_rules(args),
        "sources": list(SOURCE_ARGS),
        "dockerfile": dockerfile(cfg),
        "platform": cfg.platform,
        "build_args": args,
        "network": cfg.build_network,
        "content_addressed": True,
        "image_id": None,
        "observed_image_id": None,
        "source_ids": None,
        "observed_source_ids": None,
        "built": None,
        "seconds": None,
    }


def forget(node: lab.LabNode, *refs: str) -> None:
    """Remove tags this test made (the image goes with its last tag)."""
    for ref in refs:
        lab.docker(node, "image", "rm", ref, check=False)


def stopped_containers(node: lab.LabNode) -> set[str]:
    found = lab.docker(
        node, "ps", "-aq", "--no-trunc", "--filter", "status=exited", "--filter", "status=created"
    )
    return set(found.out.split())


def build_tags(node: lab.LabNode) -> list[str]:
    found = lab.docker(node, "image", "ls", REPO, "--format", "{{.Tag}}")
    return [tag for tag in found.out.split() if tag.startswith(BUILD_TAG_PREFIX)]


def call(method, *args):
    """A provider call with the lines it told the operator (stderr, as the engine shows them)."""
    told = io.StringIO()
    with contextlib.redirect_stderr(told):
        result = method(*args)
    return result, told.getvalue()


@pytest.fixture(scope="module")
def created(node_a: lab.LabNode, cfg: ImageConfig, context: Path):
    standins(node_a, cfg)
    props = props_for(node_a, cfg, context)
    forget(node_a, props["ref"])
    result, told = call(ImageBuildProvider().create, props)
    yield props, result, told
    forget(node_a, props["ref"], f"{REPO}:holder")


def test_first_create_builds_on_the_head_and_relays_the_build(node_a, created):
    props, result, told = created
    outs = result.outs
    assert outs["built"] is True and outs["image_id"].startswith("sha256:"), outs
    assert result.id == f"node-a/{props['ref']}"
    assert image_id(node_a, props["ref"]) == outs["image_id"] == outs["observed_image_id"]
    # The build's own lines reached the operator: its steps, and the patches' own output.
    assert "qwen35: image-build on node-a: Step " in told, told[-2000:]
    assert "PROOFS is empty: behaviour proofs skipped" in told, told[-2000:]
    assert build_tags(node_a) == []


def test_read_is_clean_and_diff_sees_no_change(created):
    props, result, _ = created
    read = ImageBuildProvider().read(result.id, result.outs)
    assert read.id == result.id and read.outs == result.outs
    assert ImageBuildProvider().diff(result.id, read.outs, props).changes is False


def restore(node: lab.LabNode, result, props: dict):
    """refresh, then the `up` that follows: read, diff, update; the update's outputs and its lines."""
    read = ImageBuildProvider().read(result.id, result.outs)
    diff = ImageBuildProvider().diff(result.id, read.outs, props)
    assert diff.changes is True and diff.replaces == [], (read.outs["observed_image_id"], diff)
    updated, told = call(ImageBuildProvider().update, result.id, read.outs, props)
    assert image_id(node, props["ref"]) == updated.outs["image_id"] == updated.outs["observed_image_id"]
    return read.outs, updated.outs, told


def test_a_moved_tag_is_drift_and_update_retags_without_a_build(node_a, created):
    props, result, _ = created
    other = busybox_image(node_a)
    lab.docker(node_a, "tag", other, props["ref"])
    read, outs, told = restore(node_a, result, props)
    assert read["observed_image_id"] == other != result.outs["image_id"]
    assert outs["image_id"] == result.outs["image_id"] and outs["built"] is False
    assert "re-tagged" in told and "Step " not in told, told


def test_a_removed_tag_is_drift_and_update_retags_the_image_still_there(node_a, created):
    props, result, _ = created
    lab.docker(node_a, "tag", props["ref"], f"{REPO}:holder")
    lab.docker(node_a, "image", "rm", props["ref"])
    read, outs, told = restore(node_a, result, props)
    assert read["observed_image_id"] == ""
    assert outs["image_id"] == result.outs["image_id"] and outs["built"] is False
    assert "Step " not in told, told


def test_with_the_image_gone_too_update_builds_again(node_a, created):
    props, result, _ = created
    forget(node_a, f"{REPO}:holder", props["ref"])
    # The image itself may be shared (the hybrid build test's tag holds the same layers and ID): state
    # that recorded an image no longer on the head stands for it, rather than removing what others hold.
    gone = "sha256:" + "0" * 64
    assert lab.docker(node_a, "image", "inspect", gone, check=False).returncode != 0
    recorded = CreateResult(result.id, {**result.outs, "image_id": gone, "observed_image_id": gone})
    read, outs, told = restore(node_a, recorded, props)
    assert read["observed_image_id"] == ""
    assert outs["built"] is True and "Step " in told, told[-2000:]
    assert outs["image_id"] != gone


def test_a_failing_proof_fails_naming_its_stage_and_leaves_nothing(node_a, cfg, context, created):
    # As test_hybrid_build makes it fail: without mamba_utils.py the compatibility proof refuses.
    props = props_for(node_a, cfg, context, EXTRA_DONOR_FILES="")
    forget(node_a, props["ref"])
    before = stopped_containers(node_a)
    with pytest.raises(ImageBuildError) as refused:
        call(ImageBuildProvider().create, props)
    message = str(refused.value)
    assert message.startswith(f"node-a: building {props['ref']} failed at the compatibility proof (exit 1)")
    assert "MambaStateCopyFuncCalculator" in message and "next: the proof's verdict is above" in message
    assert image_id(node_a, props["ref"]) is None
    assert build_tags(node_a) == []
    assert stopped_containers(node_a) - before == set()


def test_delete_leaves_the_head_alone(node_a, created):
    props, result, _ = created
    held = image_id(node_a, props["ref"])
    assert held
    assert ImageBuildProvider().delete(result.id, result.outs) is None
    assert image_id(node_a, props["ref"]) == held


def test_the_engine_path_keeps_a_content_tag_already_built(node_a, cfg, context, created):
    """BuiltImage's child as the engine drives it (pickled provider, Check/Create/Read/Diff over
    gRPC in `python -m pulumi.dynamic`): as on a new stack's first `up`, the content tag is already on
    the head, built from the base and donor there now (made so here first: a create keeps it, or builds
    when it is missing or records no sources), so create keeps it: no build."""
    node = {**lab.node_config(node_a), "name": node_a.name}
    records = registered_by(
        lambda: BuiltImage("lab", BuiltImageArgs(image=cfg, node=node, context=context)), "lab"
    )
    (build,) = [r for r in records if r.typ.endswith("qwen35:ImageBuild")]
    with ProviderHost() as host:
        engine = Engine(host)
        engine.create(build.typ, build.name, build.inputs, timeout=1200)
        state = engine.create(build.typ, build.name, build.inputs, timeout=300)
        outs = state.public_outputs()
        assert outs["built"] is False and outs["image_id"] == image_id(node_a, build.inputs["ref"]), outs
        assert state.id == f"node-a/{build.inputs['ref']}"
        refreshed = engine.refresh(state)
        assert refreshed.public_outputs()["observed_image_id"] == outs["image_id"]
        assert engine.up(refreshed, build.inputs).op == "same"
        assert "nothing to build" in host.stderr
