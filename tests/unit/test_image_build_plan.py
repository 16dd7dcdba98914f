"""ImageBuild's pure decisions as tables: inputs checked by field, what a change does, and keep /
re-tag / build from the head's facts."""

from __future__ import annotations

import pytest
from pulumi.runtime.rpc import UNKNOWN

from components.image_build import (
    Build,
    HeadImage,
    Keep,
    Retag,
    drifted,
    plan_change,
    plan_create,
    plan_restore,
    validate,
)
from components.provider_kit.change import Change

A, B = "sha256:" + "a" * 64, "sha256:" + "b" * 64
NODE = {"name": "spark-1", "host": "10.0.0.1", "port": 22, "user": "aurora", "known_hosts": "/kh"}
PROPS = {
    "node": NODE,
    "ref": "vllm-node-qwen35:h-0123456789abcdef",
    "context": "/work/patches",
    "context_digest": "sha256:" + "c" * 64,
    "dockerfile": "Dockerfile",
    "platform": "linux/arm64",
    "build_args": {"BASE_IMAGE": "vllm-node:latest", "SMOKE": "1"},
    "network": "host",
    "content_addressed": True,
}
BUILT = {**PROPS, "image_id": A, "observed_image_id": A, "built": True, "seconds": 300.0}


def test_valid_inputs_have_no_problems():
    assert validate(PROPS) == []
    assert validate({**PROPS, "network": None}) == []


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"node": {"name": "spark-1"}}, "node:"),
        ({"ref": "Bad Name:tag"}, "ref:"),
        ({"ref": f"img@{A}"}, "ref:"),
        ({"platform": "arm64"}, "platform:"),
        ({"dockerfile": "../Dockerfile"}, "dockerfile:"),
        ({"context_digest": "abc"}, "context_digest:"),
        ({"network": "host; rm -rf /"}, "network:"),
        ({"context": "patches"}, "context:"),
        ({"build_args": {"BAD-NAME": "x"}}, "build_args:"),
        ({"build_args": {"PIP_ARGS": "a\nb"}}, "build_args.PIP_ARGS:"),
        ({"build_args": ["SMOKE=1"]}, "build_args:"),
    ],
)
def test_each_bad_input_is_named(change, field):
    problems = validate({**PROPS, **change})
    assert len(problems) == 1 and problems[0][0] == field.removesuffix(":"), problems


def test_values_not_known_in_preview_pass():
    assert validate({**PROPS, "ref": UNKNOWN, "build_args": {"BASE_IMAGE": UNKNOWN}}) == []


@pytest.mark.parametrize(
    ("news", "expected"),
    [
        # Same inputs (the context hash among them): nothing to do.
        (PROPS, Change((), ())),
        # Another context (a patch edited): another image, built on create.
        ({**PROPS, "context_digest": "sha256:" + "d" * 64}, Change(("context_digest",), ())),
        ({**PROPS, "ref": "vllm-node-qwen35:h-fedcba9876543210"}, Change(("ref",), ())),
        ({**PROPS, "build_args": {**PROPS["build_args"], "SMOKE": "0"}}, Change(("build_args",), ())),
        ({**PROPS, "platform": "linux/amd64"}, Change(("platform",), ())),
        ({**PROPS, "dockerfile": "Dockerfile.graft"}, Change(("dockerfile",), ())),
        # Another head (or the same name at another address) holds none of this image.
        ({**PROPS, "node": {**NODE, "name": "spark-2"}}, Change(("node",), ())),
        ({**PROPS, "node": {**NODE, "host": "10.0.0.9"}}, Change(("node",), ())),
        # How the head is reached and the build's network: recorded in place.
        ({**PROPS, "node": {**NODE, "known_hosts": "/other"}}, Change((), ("node",))),
        ({**PROPS, "network": None}, Change((), ("network",))),
        # Another clone of the same checkout: the same context, nothing to change.
        ({**PROPS, "context": "/elsewhere/patches"}, Change((), ())),
    ],
)
def test_plan_change(news, expected):
    assert plan_change(BUILT, news) == expected


@pytest.mark.parametrize(
    ("observed", "expected"),
    [
        (A, Change((), ())),
        # refresh found the tag gone, or pointing at another image: `up` restores it.
        ("", Change((), ("observed_image_id",))),
        (B, Change((), ("observed_image_id",))),
    ],
)
def test_drift_found_by_refresh_is_an_update(observed, expected):
    olds = {**BUILT, "observed_image_id": observed}
    assert plan_change(olds, PROPS) == expected
    assert drifted(olds) is bool(expected.updates)


@pytest.mark.parametrize(
    ("content_addressed", "head", "expected"),
    [
        (True, HeadImage(None, False), Build()),
        # A content tag already there is an image of these very inputs: kept, not built again.
        (True, HeadImage(A, False), Keep(A)),
        # A pinned tag says nothing about what it holds.
        (False, HeadImage(A, False), Build()),
    ],
)
def test_plan_create(content_addressed, head, expected):
    assert plan_create({**PROPS, "content_addressed": content_addressed}, head) == expected


@pytest.mark.parametrize(
    ("recorded", "head", "expected"),
    [
        (A, HeadImage(A, True), Keep(A)),
        (A, HeadImage(None, True), Retag(A)),
        (A, HeadImage(B, True), Retag(A)),
        (A, HeadImage(None, False), Build()),
        (A, HeadImage(B, False), Build()),
        (None, HeadImage(B, False), Build()),
    ],
)
def test_plan_restore(recorded, head, expected):
    assert plan_restore(recorded, head) == expected
