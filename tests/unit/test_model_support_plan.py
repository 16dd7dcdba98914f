"""The model-support check's plan as tables: inputs, recorded outputs and reports in, decisions out
(no node, no transport). The runs these decisions drive are in test_model_support.py."""

from __future__ import annotations

import base64
import json
import pickletools
from dataclasses import replace

import dill
import pytest
from pulumi.dynamic.dynamic import serialize_provider

from components.model_support import ModelSupportCheckProvider, ModelSupportError
from components.model_support.facts import parse_checkpoint_facts, parse_cluster, parse_repo_digests
from components.model_support.plan import (
    RERUN_KEYS,
    SOFT_KEYS,
    Change,
    Steps,
    check_id,
    create_problems,
    enforced,
    pin_mismatch,
    plan_change,
    plan_steps,
    recorded_refusal,
)
from components.remote import RemoteError, Result
from tests.unit.test_model_support import CONSTRUCT_FAIL, MEMORY, NODE, PASS_REPORT, PIN, props

PINNED = f"nvcr.io/nvidia/vllm:26.03-py3@{PIN}"
SNAPSHOT = "/c/models--a--b/snapshots/s"
NOTHING = Steps(fit=False, pin=False, cluster=False, serve_args=False, deadline_s=900.0)


@pytest.mark.parametrize(
    ("changes", "steps"),
    [
        ({}, NOTHING),
        # A checkpoint on the head and memory inputs: the fit is read and checked first.
        ({"snapshot_path": SNAPSHOT}, replace(NOTHING, fit=True)),
        ({"snapshot_path": SNAPSHOT, "memory": None}, NOTHING),
        ({"image": PINNED}, replace(NOTHING, pin=True)),
        ({"cluster": {"ray_version": "==2.49.1"}}, replace(NOTHING, cluster=True)),
        ({"serve_argv": ["vllm", "serve", "m"]}, replace(NOTHING, serve_args=True)),
        ({"cluster": {}, "serve_argv": []}, NOTHING),
        ({"deadline_s": 60}, replace(NOTHING, deadline_s=60.0)),
        ({"deadline_s": None}, NOTHING),
    ],
)
def test_the_steps_of_create_follow_the_inputs(changes, steps):
    assert plan_steps(props(**changes)) == steps


ARGV = ["vllm", "serve", "m"]


@pytest.mark.parametrize(
    ("olds", "news", "steps"),
    [
        # An update: only a changed command line is proven again, nothing else runs.
        (
            {"serve_argv": ARGV},
            {"serve_argv": [*ARGV, "--max-num-seqs", "8"]},
            replace(NOTHING, behaviour=False, serve_args=True),
        ),
        (
            {"serve_argv": ARGV, "rank_argvs": {}},
            {"serve_argv": ARGV, "rank_argvs": {"s2": ARGV}},
            replace(NOTHING, behaviour=False, serve_args=True),
        ),
        ({"serve_argv": ARGV}, {"serve_argv": ARGV, "mode": "report"}, replace(NOTHING, behaviour=False)),
        (
            {"serve_argv": ARGV},
            {"serve_argv": ARGV, "deadline_s": 60},
            replace(NOTHING, behaviour=False, deadline_s=60.0),
        ),
        # What a replacement proves (never an update: diff replaced): the whole check.
        (
            {"serve_argv": ARGV},
            {"serve_argv": ARGV, "image_id": "sha256:" + "ff" * 32},
            replace(NOTHING, serve_args=True),
        ),
    ],
)
def test_an_update_proves_again_only_a_changed_command_line(olds, news, steps):
    assert plan_steps(props(**news), props(**olds)) == steps


@pytest.mark.parametrize(
    ("changes", "replaces", "updates"),
    [
        ({}, (), ()),
        ({"image_id": "sha256:" + "ff" * 32}, ("image_id",), ()),
        ({"memory": {**MEMORY, "tensor_parallel_size": 1}}, ("memory",), ()),
        # A new command line is proven again in place (the update runs the argument proof alone).
        ({"serve_argv": ["vllm", "serve", "m"]}, (), ("serve_argv",)),
        ({"rank_argvs": {"spark-2": ["vllm", "serve", "m"]}}, (), ("rank_argvs",)),
        ({"cluster": {"ray_version": "==2.60.0"}}, ("cluster",), ()),
        # How the head is reached, what the image is called, how a failure is handled: in place.
        ({"node": {**NODE, "host": "10.0.0.9"}, "mode": "report"}, (), ("node", "mode")),
        ({"deadline_s": 60, "container_prefix": "x"}, (), ("deadline_s", "container_prefix")),
        (
            {"checkpoint_digest": "sha256:b", "snapshot_path": "/o"},
            ("checkpoint_digest",),
            ("snapshot_path",),
        ),
        # Recorded outputs are not inputs: a report field differing changes nothing.
        ({"verdict": "fail", "memory_fit": {"fits": True}}, (), ()),
    ],
)
def test_plan_change_is_a_table(changes, replaces, updates):
    change = plan_change(props(), props(**changes))
    assert change == Change(replaces, updates, delete_before_replace=True)
    assert change.changes == bool(replaces or updates)


def test_every_input_is_either_rerun_or_soft_never_both():
    assert not set(RERUN_KEYS) & set(SOFT_KEYS)


RAY_FAIL = {"verdict": "fail", "failed_stage": "ray", "error": "no Ray", "ray": None}


@pytest.mark.parametrize(
    ("olds", "news", "says"),
    [
        ({**PASS_REPORT}, {"mode": "enforce"}, None),
        ({**CONSTRUCT_FAIL}, {"mode": "report"}, None),
        ({**CONSTRUCT_FAIL}, {"mode": "enforce"}, "stage 'construct'"),
        (
            {**PASS_REPORT, "cluster_layer": RAY_FAIL},
            {"mode": "enforce"},
            "cluster layer failed at stage 'ray'",
        ),
        ({**PASS_REPORT, "cluster_layer": RAY_FAIL}, {"mode": "report"}, None),
        ({**PASS_REPORT, "cluster_layer": {"verdict": "pass"}}, {"mode": "enforce"}, None),
    ],
)
def test_enforcing_over_a_recorded_failure_is_refused_without_a_run(olds, news, says):
    refusal = recorded_refusal(props(mode="report", **olds), props(**news))
    assert (refusal is None) if says is None else (says in refusal), refusal


@pytest.mark.parametrize(
    ("image", "digests", "mismatch"),
    [
        ("vllm-node:latest", [], False),  # not pinned: nothing to compare
        (PINNED, [f"nvcr.io/nvidia/vllm@{PIN}"], False),
        (PINNED, ["nvcr.io/nvidia/vllm@sha256:" + "00" * 32], True),
        (PINNED, [], True),
    ],
)
def test_a_pin_must_be_among_the_heads_repo_digests(image, digests, mismatch):
    message = pin_mismatch("spark-1", props(image=image), digests)
    assert (message is not None) is mismatch
    if mismatch:
        assert message.startswith(f"spark-1: image {PINNED} is pinned to {PIN}")
        assert "docker pull nvcr.io/nvidia/vllm@" in message


@pytest.mark.parametrize(
    ("changes", "fields"),
    [
        ({}, []),
        # check() lets an image ID through while the engine does not know it yet; create does not.
        ({"image_id": None}, ["image_id"]),
        ({"image_id": ""}, ["image_id"]),
        ({"image_id": "latest"}, ["image_id"]),
        ({"node": {"name": "spark-1"}, "mode": "maybe"}, ["node", "mode"]),
    ],
)
def test_create_needs_usable_inputs_and_the_heads_image_id(changes, fields):
    assert [problem.split(":", 1)[0] for problem in create_problems(props(**changes))] == fields


@pytest.mark.parametrize(("mode", "stops"), [("enforce", True), ("report", False), (None, True)])
def test_enforce_is_the_default_mode(mode, stops):
    given = props(mode=mode)
    if mode is None:
        del given["mode"]
    assert enforced(given) is stops


def test_the_id_names_the_head_the_image_and_the_checkpoint():
    assert check_id(props(checkpoint_digest="sha256:0123456789abcdef")) == "spark-1-abababababab-0123456789ab"
    assert check_id(props()) == "spark-1-abababababab-none"


def result(code: int, stdout: str = "", stderr: str = "") -> Result:
    return Result(("docker", "run"), code, stdout.encode(), stderr.encode(), "spark-1")


@pytest.mark.parametrize(
    ("done", "verdict", "stage"),
    [
        (result(0, 'log\n{"verdict": "pass", "ray": "2.49.1"}\n'), "pass", None),
        (result(1, '{"verdict": "fail", "failed_stage": "ray", "ray": null}\n'), "fail", "ray"),
        (result(127, "", "exec: python3: not found"), "fail", "ray"),
        (result(126, '{"no": "verdict"}\n'), "fail", "ray"),
    ],
)
def test_the_cluster_report_is_read_from_the_last_line(done, verdict, stage):
    report = parse_cluster(props(), done)
    assert report["verdict"] == verdict and report.get("failed_stage") == stage


@pytest.mark.parametrize("done", [result(1, "Traceback\n", "boom"), result(0, '{"verdict": "maybe"}\n')])
def test_a_cluster_proof_without_a_report_is_an_error(done):
    with pytest.raises(ModelSupportError, match="cluster-layer proof ended without a report"):
        parse_cluster(props(), done)


# ---- the facts' parsers ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("out", "digests"),
    [
        ("null", []),
        ("", []),
        ("[]", []),
        (json.dumps(["a@sha256:1", "b@sha256:2"]), ["a@sha256:1", "b@sha256:2"]),
    ],
)
def test_repo_digests_are_parsed(out, digests):
    assert parse_repo_digests(out) == digests


FACTS = {"weight_bytes": 126 * 10**9, "weight_source": "index", "num_layers": 48}


def test_the_checkpoint_facts_are_the_programs_report():
    done = result(0, "starting\n" + json.dumps(FACTS) + "\n")
    assert parse_checkpoint_facts("spark-1", "/c/s", done) == FACTS


@pytest.mark.parametrize(
    ("done", "error", "says"),
    [
        (result(127, "", "python3: not found"), RemoteError, "the head needs python3"),
        (result(0, "no report\n"), RemoteError, "the head needs python3"),
        (result(0, '{"error": "/c/s is not a directory"}\n'), ModelSupportError, "/c/s is not a directory"),
        (result(0, '{"weight_bytes": 0}\n'), ModelSupportError, "no model.safetensors.index.json"),
    ],
)
def test_checkpoint_facts_that_cannot_size_the_model_are_named(done, error, says):
    with pytest.raises(error, match=says):
        parse_checkpoint_facts("spark-1", "/c/s", done)


def test_the_provider_pickles_by_reference_to_the_package():
    # Stacks hold it as the SDK serialized it: a reference to `components.model_support`, no code.
    pickled = base64.b64decode(serialize_provider(ModelSupportCheckProvider()))
    names = [arg for op, arg, _pos in pickletools.genops(pickled) if op.name == "SHORT_BINUNICODE"]
    assert names == ["components.model_support", "ModelSupportCheckProvider"]
    assert type(dill.loads(pickled)) is ModelSupportCheckProvider
