"""BuiltImage (image_build/component.py) under mocks: its ImageBuild child's inputs, the content tag."""

from __future__ import annotations

import shutil

import pulumi
import pytest

from components.config import ImageConfig, parse_stack_config
from components.image_build import context_digest, context_files
from components.image_build.component import (
    PATCH_DIR,
    BuiltImage,
    BuiltImageArgs,
    build_args,
    content_tag,
    context_rules,
    dockerfile,
)
from components.image_build.programs import WHEELS_IN_IMAGE, missing_wheels
from tests.support.program import RecordingMocks, dev_raw

IMAGE_BUILD = "pulumi-python:dynamic/qwen35:ImageBuild"
HEAD = {"name": "spark-1", "host": "10.0.0.1", "user": "aurora", "known_hosts": "/kh", "port": 22}


@pytest.fixture
def context(tmp_path):
    (tmp_path / "Dockerfile").write_text("FROM scratch\n")
    (tmp_path / "patch_vllm_qwen35.py").write_text("print('patch')\n")
    (tmp_path / "__pycache__").mkdir()
    (tmp_path / "__pycache__" / "x.pyc").write_bytes(b"junk")
    return tmp_path


def test_tag_is_stable_for_unchanged_inputs(context):
    args = build_args(ImageConfig())
    assert content_tag(context, args, "linux/arm64") == content_tag(context, args, "linux/arm64")
    assert content_tag(context, args, "linux/arm64").startswith("h-")


@pytest.mark.parametrize(
    "change",
    [
        lambda ctx, a: (ctx / "Dockerfile").write_text("FROM scratch\nRUN true\n"),
        lambda ctx, a: (ctx / "patch_vllm_qwen35.py").write_text("print('patch v2')\n"),
        lambda ctx, a: (ctx / "new_file.py").write_text(""),
        lambda ctx, a: a.update(TRANSFORMERS_SPEC="transformers==5.3.0"),
        lambda ctx, a: a.update(BASE_IMAGE="vllm-node:v2"),
    ],
    ids=["dockerfile", "patch-script", "added-file", "transformers-pin", "base-image"],
)
def test_tag_changes_with_any_input(context, change):
    args = build_args(ImageConfig())
    before = content_tag(context, args, "linux/arm64")
    change(context, args)
    assert content_tag(context, args, "linux/arm64") != before


def test_tag_changes_with_platform_but_not_with_bytecode(context):
    args = build_args(ImageConfig())
    before = content_tag(context, args, "linux/arm64")
    assert content_tag(context, args, "linux/amd64") != before
    (context / "__pycache__" / "y.pyc").write_bytes(b"more junk")
    assert content_tag(context, args, "linux/arm64") == before


def test_tag_ignores_where_the_checkout_lives(context, tmp_path_factory):
    other = tmp_path_factory.mktemp("elsewhere") / "patches"
    shutil.copytree(context, other)
    args = build_args(ImageConfig())
    assert content_tag(other, args, "linux/arm64") == content_tag(context, args, "linux/arm64")


def test_stray_wheels_change_nothing_unless_the_pip_flags_install_from_them(context):
    (context / ".dockerignore").write_text((PATCH_DIR / ".dockerignore").read_text())
    (context / "wheels").mkdir()
    plain = build_args(ImageConfig(strategy="hybrid"))
    flags = ["--no-index", "--find-links", WHEELS_IN_IMAGE]
    offline = build_args(ImageConfig(strategy="hybrid", pip_args=flags))
    assert context_rules(plain) == [] and context_rules(offline) == ["!wheels"]
    # No wheel yet where the flags install from: the build says so before it sends anything
    # (test_image_build_provider.py); the program itself, and preview, need no wheel there.
    assert missing_wheels(context, context_rules(offline)).startswith(
        "image.pip_args name /opt/qwen35/wheels"
    )
    assert missing_wheels(context, context_rules(plain)) is None
    before = {
        "plain": content_tag(context, plain, "linux/arm64"),
        "offline": content_tag(context, offline, "linux/arm64"),
    }
    (context / "wheels" / "transformers-5.2.0-py3-none-any.whl").write_bytes(b"wheel")
    assert missing_wheels(context, context_rules(offline)) is None
    # A wheel left in patches/wheels/ neither changes the tag nor reaches the image of a build that
    # does not install from it; one that does follows it.
    assert content_tag(context, plain, "linux/arm64") == before["plain"]
    assert content_tag(context, offline, "linux/arm64") != before["offline"]
    # patches/ itself: its README is no build input.
    assert "README.md" not in [p.name for p in context_files(PATCH_DIR)]


def test_build_args_from_config():
    raw = dev_raw()
    raw["image"] = {"strategy": "hybrid"}
    cfg = parse_stack_config(raw).image
    args = build_args(cfg)
    assert args["BASE_IMAGE"] == "vllm-node:latest"
    assert args["DONOR_IMAGE"] == "hellohal2064/vllm-qwen3.5-gb10:latest"
    # The dev stack leaves the pin to the default: what vLLM 0.17 pins (5.2.0 fails the config proof).
    assert args["TRANSFORMERS_SPEC"] == "transformers==4.57.6"
    assert args["SMOKE"] == "1" and args["PIP_ARGS"] == ""
    assert args["PROOFS"] == "config,construct,load"


def test_without_torch_the_build_skips_the_proofs_and_the_smoke():
    args = build_args(ImageConfig(strategy="hybrid", smoke=False))
    assert (args["PROOFS"], args["SMOKE"]) == ("", "0")


def _build_under_mocks(image: ImageConfig):
    mocks = RecordingMocks()
    pulumi.runtime.set_mocks(mocks, project="qwen35-spark", stack="unit", preview=False)
    made = {}

    @pulumi.runtime.test
    def run():
        made["image"] = BuiltImage("hybrid", BuiltImageArgs(image=image, node=HEAD))

    run()
    return mocks, made["image"]


def test_image_resource_inputs_under_mocks():
    cfg = ImageConfig(strategy="hybrid")
    mocks, component = _build_under_mocks(cfg)
    images = [r for r in mocks.resources if r.typ == IMAGE_BUILD]
    assert len(images) == 1
    image = images[0]
    # The name of the pulumi_docker.Image child it replaced (docs/image-build.md).
    assert image.name == "hybrid-build"
    assert image.inputs["ref"] == f"vllm-node-qwen35:{component.tag}"
    assert component.tag == content_tag(PATCH_DIR, build_args(cfg), "linux/arm64")
    assert image.inputs["content_addressed"] is True
    assert image.inputs["platform"] == "linux/arm64"
    assert image.inputs["context"] == str(PATCH_DIR)
    assert image.inputs["context_digest"] == context_digest(PATCH_DIR)
    assert image.inputs["dockerfile"] == "Dockerfile"
    assert image.inputs["build_args"] == build_args(cfg)
    # The base and donor followed by ID; no pip flags from the context's wheels: no rule added.
    assert image.inputs["sources"] == ["BASE_IMAGE", "DONOR_IMAGE"]
    assert image.inputs["context_rules"] == []
    # Built by the head's own Docker over SSH: the head's node dict, no docker provider.
    assert image.inputs["node"]["name"] == "spark-1" and image.inputs["node"]["known_hosts"] == "/kh"
    assert "docker" not in (image.provider or "")


def test_explicit_tag_wins():
    cfg = ImageConfig(strategy="hybrid", tag="v1")
    mocks, component = _build_under_mocks(cfg)
    assert component.ref == "vllm-node-qwen35:v1"
    # A pinned tag says nothing about what it holds: a tag already on the head is no reason to skip.
    (image,) = [r for r in mocks.resources if r.typ == IMAGE_BUILD]
    assert image.inputs["content_addressed"] is False


GRAFT = {"strategy": "graft", "base": "vllm-node:0.14", "donor": "hellohal2064/vllm-qwen3.5-gb10:0.17.1"}


def test_graft_build_args_carry_the_base_and_donor_and_prove_the_cluster_layer():
    args = build_args(ImageConfig(**GRAFT))
    assert args == {
        "BASE_IMAGE": "vllm-node:0.14",
        "DONOR_IMAGE": "hellohal2064/vllm-qwen3.5-gb10:0.17.1",
        "PIP_ARGS": "",
        "RAY_VERSION": "",
        "CLUSTER_PROOFS": "ray,cluster,executor",
        "PROOFS": "config,construct,load",
        "SMOKE": "1",
    }
    # Without torch (the lab's stand-ins): the cluster layer is still proven, short of vLLM's executor.
    assert build_args(ImageConfig(**GRAFT, ray_version="2.49.1"))["RAY_VERSION"] == "==2.49.1"
    lab = build_args(ImageConfig(**GRAFT, smoke=False, pip_args=["--no-index"]))
    assert (lab["CLUSTER_PROOFS"], lab["PROOFS"], lab["SMOKE"], lab["PIP_ARGS"]) == (
        "ray,cluster",
        "",
        "0",
        "--no-index",
    )


@pytest.mark.parametrize(
    ("image", "expected"),
    [({"strategy": "hybrid"}, "Dockerfile"), (GRAFT, "Dockerfile.graft")],
)
def test_each_built_strategy_has_its_dockerfile_in_the_context(image, expected):
    assert dockerfile(ImageConfig(**image)) == expected and (PATCH_DIR / expected).is_file()


def test_prebuilt_builds_nothing():
    with pytest.raises(ValueError, match="builds nothing"):
        dockerfile(ImageConfig())


def test_the_graft_build_under_mocks_uses_its_dockerfile():
    cfg = ImageConfig(**GRAFT, name="vllm-qwen35-graft")
    mocks, component = _build_under_mocks(cfg)
    (image,) = [r for r in mocks.resources if r.typ == IMAGE_BUILD]
    assert image.inputs["dockerfile"] == "Dockerfile.graft"
    assert image.inputs["build_args"] == build_args(cfg)
    assert component.ref == f"vllm-qwen35-graft:{content_tag(PATCH_DIR, build_args(cfg), 'linux/arm64')}"
