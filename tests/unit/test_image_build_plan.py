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
        ({"context_rules": ["!wheels\nREADME.md"]}, "context_rules:"),
        ({"context_rules": "!wheels"}, "context_rules:"),
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


# ---- the source images (base, donor) the build follows -------------------------------------------

X, Y = "sha256:" + "1" * 64, "sha256:" + "2" * 64
FOLLOWING = {**PROPS, "sources": ["BASE_IMAGE"]}
BUILT_FROM_X = {
    **BUILT,
    **FOLLOWING,
    "source_ids": {"BASE_IMAGE": X},
    "observed_source_ids": {"BASE_IMAGE": X},
}


@pytest.mark.parametrize(
    ("sources", "problem"),
    [
        (["DONOR_IMAGE"], "'DONOR_IMAGE' is not one of the build args (BASE_IMAGE, SMOKE)"),
        ("BASE_IMAGE", "a list of build-arg names, not 'BASE_IMAGE'"),
    ],
)
def test_a_source_that_is_not_a_build_arg_is_refused(sources, problem):
    assert validate({**PROPS, "sources": sources}) == [("sources", problem)]
    assert validate(FOLLOWING) == []


@pytest.mark.parametrize(
    ("observed", "expected"),
    [
        ({"BASE_IMAGE": X}, Change((), ())),
        # The base rebuilt under the same reference: the same inputs, another image; `up` builds.
        ({"BASE_IMAGE": Y}, Change((), ("observed_source_ids",))),
        # The base gone from the head: nothing could be built from it, and the image stands.
        ({"BASE_IMAGE": ""}, Change((), ())),
    ],
)
def test_a_source_rebuilt_under_its_reference_is_drift_that_up_builds(observed, expected):
    olds = {**BUILT_FROM_X, "observed_source_ids": observed}
    assert plan_change(olds, FOLLOWING) == expected


def test_a_stack_recorded_before_sources_were_followed_records_them_in_place():
    assert plan_change(BUILT, FOLLOWING) == Change((), ("sources",))


@pytest.mark.parametrize(
    ("head", "expected"),
    [
        # The content tag's image was built from the base the head holds now: kept.
        (HeadImage(A, False, {"BASE_IMAGE": X}, {"BASE_IMAGE": X}), Keep(A)),
        # Built from a base since rebuilt under its reference: another input, built.
        (HeadImage(A, False, {"BASE_IMAGE": X}, {"BASE_IMAGE": Y}), Build()),
        # An image that records no sources (built before they were followed): built.
        (HeadImage(A, False, {}, {"BASE_IMAGE": X}), Build()),
        # The base is not on the head: the build pulls it or says it is missing.
        (HeadImage(A, False, {"BASE_IMAGE": X}, {"BASE_IMAGE": ""}), Build()),
    ],
)
def test_a_content_tag_is_kept_only_if_built_from_the_sources_there_now(head, expected):
    assert plan_create(FOLLOWING, head) == expected


@pytest.mark.parametrize(
    ("head", "expected"),
    [
        (HeadImage(A, True, {}, {"BASE_IMAGE": X}), Keep(A)),
        (HeadImage(A, True, {}, {"BASE_IMAGE": Y}), Build()),
        (HeadImage(B, True, {}, {"BASE_IMAGE": Y}), Build()),
        # Gone from the head since the build: the image as built stays.
        (HeadImage(A, True, {}, {"BASE_IMAGE": ""}), Keep(A)),
    ],
)
def test_up_builds_again_when_a_source_moved_since_the_build(head, expected):
    assert plan_restore(A, head, {"BASE_IMAGE": X}) == expected
