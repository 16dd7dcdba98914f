"""HybridImage under mocks: the Image resource's inputs, and the content-addressed tag."""

from __future__ import annotations

import shutil

import pulumi
import pytest

from components.config import ImageConfig, parse_stack_config
from components.hybrid_image import PATCH_DIR, HybridImage, HybridImageArgs, build_args, content_tag
from tests.support.program import RecordingMocks, dev_raw


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


def test_build_args_from_config():
    cfg = parse_stack_config(dev_raw()).image
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
        provider = pulumi.ProviderResource("docker", "head-docker", {"host": "ssh://x@h:22"})
        made["image"] = HybridImage(
            "hybrid", HybridImageArgs(image=image), pulumi.ResourceOptions(providers={"docker": provider})
        )

    run()
    return mocks, made["image"]


def test_image_resource_inputs_under_mocks():
    cfg = parse_stack_config(dev_raw()).image
    mocks, component = _build_under_mocks(cfg)
    images = [r for r in mocks.resources if r.typ == "docker:index/image:Image"]
    assert len(images) == 1
    image = images[0]
    assert image.name == "hybrid-build"
    assert image.inputs["imageName"] == f"vllm-node-qwen35:{component.tag}"
    assert component.tag == content_tag(PATCH_DIR, build_args(cfg), "linux/arm64")
    assert image.inputs["skipPush"] is True
    assert image.inputs.get("buildOnPreview") is False
    build = image.inputs["build"]
    assert build["platform"] == "linux/arm64"
    assert build["context"] == str(PATCH_DIR)
    assert build["dockerfile"] == str(PATCH_DIR / "Dockerfile")
    assert build["args"] == build_args(cfg)
    assert image.provider and "head-docker" in image.provider


def test_explicit_tag_wins():
    cfg = ImageConfig(strategy="hybrid", tag="v1")
    _, component = _build_under_mocks(cfg)
    assert component.ref == "vllm-node-qwen35:v1"
