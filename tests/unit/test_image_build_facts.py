"""ImageBuild's facts: the head's answers parsed into values, and where a build's log says it stopped."""

from __future__ import annotations

import pytest

from components.image_build import (
    BuildLog,
    FactsError,
    HeadImage,
    parse_build_log,
    parse_head_image,
    parse_image_id,
)
from components.remote import Result

A, B = "sha256:" + "a" * 64, "sha256:" + "b" * 64


def answer(rc: int, out: str = "", err: str = "") -> Result:
    return Result(("docker",), rc, out.encode(), err.encode(), "spark-1")


@pytest.mark.parametrize(
    ("result", "recorded", "expected"),
    [
        # The tag is there, pointing at the recorded image.
        (answer(0, f'{A} ["img:t","img:old"]\n{A} ["img:t","img:old"]\n'), A, HeadImage(A, True)),
        # The tag is gone and so is the image: a build.
        (
            answer(1, "", "Error: No such image: img:t\nError: No such object: " + A),
            A,
            HeadImage(None, False),
        ),
        # The tag is gone but the image is still there (under another tag, or none): a re-tag.
        (answer(1, f"{A} []\n", "Error: No such image: img:t"), A, HeadImage(None, True)),
        # The tag was moved to another image; the recorded one is still there.
        (answer(0, f'{B} ["img:t"]\n{A} []\n'), A, HeadImage(B, True)),
        # Read (no recorded ID asked for): only the tag.
        (answer(0, f'{B} ["img:t"]\n'), None, HeadImage(B, False)),
        (answer(1, "", "Error response from daemon: No such image: img:t"), None, HeadImage(None, False)),
    ],
)
def test_parse_head_image(result, recorded, expected):
    assert parse_head_image(result, "img:t", recorded) == expected


@pytest.mark.parametrize(
    ("result", "match"),
    [
        (
            answer(1, "", "Cannot connect to the Docker daemon at unix:///var/run/docker.sock"),
            "Cannot connect",
        ),
        (answer(255, "", "ssh: connect to host h port 22: Connection refused"), "exit 255"),
        (answer(0, "not-an-id []\n"), "not an image ID"),
    ],
)
def test_what_is_not_an_answer_about_the_tag_is_an_error(result, match):
    with pytest.raises(FactsError, match=match):
        parse_head_image(result, "img:t", None)


def test_parse_image_id():
    assert parse_image_id(answer(0, A + "\n")) == A
    with pytest.raises(FactsError, match="could not be inspected"):
        parse_image_id(answer(1, "", "No such image"))


LEGACY_REFUSED = """\
Step 1/22 : ARG BASE_IMAGE
Step 7/22 : RUN set -eu;     test -n "${BASE_VLLM_DIR}" || exit 1
 ---> Running in 0123abcd
missing: vllm.model_executor.layers.mamba.mamba_utils.MambaStateCopyFuncCalculator
\x1b[91mcompatibility proof failed (exit 1): the copied Qwen3.5 modules would not import in the base
\x1b[0mThe command '/bin/sh -c set -eu; ...' returned a non-zero code: 1
"""
BUILDKIT_REFUSED = """\
#5 [proof 1/3] FROM docker.io/library/base
#5 DONE 0.0s
#9 [stage-1 4/6] RUN set -eu;     case "${PROOFS}" in "") echo skipped;; esac
#9 1.204 {"verdict": "fail", "failed_stage": "environment"}
#9 1.210 behaviour proof failed (exit 2), see the verdict above: this image cannot serve Qwen3.5 as
#9 ERROR: process "/bin/sh -c set -eu; ..." did not complete successfully: exit code: 1
"""
GRAFT_REFUSED = "Step 3/9 : RUN set -eu; graft\ngraft failed (exit 3): the base's cluster layer could not\n"
BROKEN = "Step 1/4 : FROM vllm-node:latest\npull access denied for vllm-node, repository does not exist\n"


@pytest.mark.parametrize(
    ("log", "expected"),
    [
        (
            LEGACY_REFUSED,
            BuildLog(
                'RUN set -eu;     test -n "${BASE_VLLM_DIR}" || exit 1', ("the compatibility proof (exit 1)",)
            ),
        ),
        (
            BUILDKIT_REFUSED,
            BuildLog(
                '[stage-1 4/6] RUN set -eu;     case "${PROOFS}" in "") echo skipped;; esac',
                ("the behaviour proof (exit 2)",),
            ),
        ),
        (GRAFT_REFUSED, BuildLog("RUN set -eu; graft", ("the graft (exit 3)",))),
        (BROKEN, BuildLog("FROM vllm-node:latest", ())),
        ("", BuildLog(None, ())),
    ],
)
def test_parse_build_log(log, expected):
    assert parse_build_log(log.splitlines()) == expected


def test_the_stage_names_the_refusing_proof_and_its_step():
    stage = parse_build_log(LEGACY_REFUSED.splitlines()).stage
    assert stage.startswith("the compatibility proof (exit 1) (step `RUN set -eu;")
    assert parse_build_log(BROKEN.splitlines()).stage == "step `FROM vllm-node:latest`"
    assert parse_build_log([]).stage == "the start (no step ran)"


@pytest.mark.parametrize(
    ("ref", "listed"),
    [
        ("docker.io/library/qwen35-hybrid:h-1", "qwen35-hybrid:h-1"),
        ("docker.io/team/qwen35-hybrid:h-1", "team/qwen35-hybrid:h-1"),
        ("index.docker.io/library/qwen35-hybrid:h-1", "qwen35-hybrid:h-1"),
        ("qwen35-hybrid:h-1", "qwen35-hybrid:h-1"),
    ],
)
def test_a_docker_hub_spelling_finds_the_tag_the_daemon_lists_short(ref, listed):
    # Docker lists `docker.io/library/x:t` as `x:t`: read literally, the tag looked absent, so every
    # create rebuilt and every refresh saw drift.
    assert parse_head_image(answer(0, f'{A} ["{listed}"]\n'), ref, A) == HeadImage(A, True)


def test_another_registry_is_not_shortened():
    assert parse_head_image(answer(0, f'{A} ["qwen35-hybrid:h-1"]\n'), "ghcr.io/qwen35-hybrid:h-1", None) == (
        HeadImage(None, False)
    )


X, Y = "sha256:" + "1" * 64, "sha256:" + "2" * 64
SOURCES = {"BASE_IMAGE": "vllm-node:latest", "DONOR_IMAGE": f"donor@{Y}"}


def test_the_sources_the_tag_was_built_from_and_their_ids_now():
    # The tag's image labelled with the base it was built from (X); the base now is Y (rebuilt);
    # the donor, pinned by digest, is listed under RepoDigests.
    out = (
        f'{A} ["img:t"] [] {{"qwen35.source.base_image":"{X}","maintainer":"a b"}}\n'
        f'{Y} ["vllm-node:latest"] [] null\n'
        f'{B} [] ["donor@{Y}"] {{}}\n'
    )
    assert parse_head_image(answer(0, out), "img:t", None, SOURCES) == HeadImage(
        A, False, {"BASE_IMAGE": X}, {"BASE_IMAGE": Y, "DONOR_IMAGE": B}
    )


def test_a_source_missing_on_the_head_is_empty_and_no_failure():
    out = f'{A} ["img:t"] [] null\n'
    found = parse_head_image(answer(1, out, "Error: No such image: vllm-node:latest"), "img:t", None, SOURCES)
    assert found == HeadImage(A, False, {}, {"BASE_IMAGE": "", "DONOR_IMAGE": ""})


def test_a_source_named_without_a_tag_is_latest():
    out = f'{X} ["docker.io/library/base:latest"] [] null\n'
    found = parse_head_image(answer(0, out), "img:t", None, {"BASE_IMAGE": "base"})
    assert found.sources == {"BASE_IMAGE": X} and found.tag_id is None


def test_labels_that_are_not_json_are_an_error():
    with pytest.raises(FactsError, match="not an image ID|Expecting"):
        parse_head_image(answer(0, f'{A} ["img:t"] [] {{broken\n'), "img:t", None, SOURCES)
