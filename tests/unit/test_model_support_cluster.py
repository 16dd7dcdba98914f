"""The model-support check proves the cluster layer before the behaviour proof, for every
strategy. The head is faked, but the cluster proof that the fake `docker run` answers with is the real
patches/prove_cluster.py shipped through the real bootstrap (run here with `python3 -`, a stand-in
`vllm` on its path): an image without Ray, or with another Ray, is refused naming Ray and its version,
before any container of the deployment starts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from components import model_support, nodes
from components.model_support import (
    ModelSupportCheckProvider,
    ModelSupportError,
    cluster_argv,
    execute,
)
from components.remote import Result
from tests.unit.test_model_support import IMAGE_ID, PASS_REPORT, props

CLUSTER = {"ray_version": "==2.49.1", "stages": "ray"}


class Head:
    """A head whose `docker run` of the cluster proof runs the shipped program here, in a Python whose
    path holds the stand-in packages; the behaviour proof's run answers a pass."""

    def __init__(self, packages: Path):
        self.packages = packages
        self.runs: list[list[str]] = []
        self.name = "spark-1"

    def __call__(self, _target):
        return self

    def run(self, argv, stdin=None, timeout=None) -> Result:
        assert argv[:2] == ["docker", "run"], argv
        self.runs.append(list(argv))
        if model_support.CLUSTER_PROGRAM in stdin.decode() and "--stages" in argv:
            program_args = argv[argv.index("-") :]
            done = subprocess.run(
                [sys.executable, "-S", *program_args], input=stdin, capture_output=True,
                env={"PYTHONPATH": str(self.packages)}, timeout=60, cwd=self.packages,
            )  # fmt: skip
            return Result(tuple(argv), done.returncode, done.stdout, done.stderr, "spark-1")
        return Result(tuple(argv), 0, (json.dumps(PASS_REPORT) + "\n").encode(), b"", "spark-1")


def standin_packages(root: Path, ray: str | None) -> Path:
    (root / "vllm").mkdir(parents=True)
    (root / "vllm" / "__init__.py").write_text("raise ImportError('importing vllm needs torch')\n")
    (root / "vllm" / "_version.py").write_text("__version__ = '0.17.1'\n")
    if ray:
        (root / "ray").mkdir()
        (root / "ray" / "__init__.py").write_text(f"__version__ = {ray!r}\n")
    return root


@pytest.fixture
def head(monkeypatch, tmp_path):
    def make(ray: str | None) -> Head:
        fake = Head(standin_packages(tmp_path / "site", ray))
        monkeypatch.setattr(nodes, "SshTransport", fake)
        return fake

    return make


@pytest.mark.parametrize(
    ("ray", "named"),
    [
        (
            None,
            [
                "Ray: none (the stack needs ==2.49.1)",
                "no Ray in the interpreter that runs vLLM 0.17.1",
                "graft",
            ],
        ),
        ("2.60.0", ["Ray: 2.60.0 (the stack needs ==2.49.1)", "Ray 2.60.0 in the image, the stack needs"]),
    ],
    ids=["no-ray", "other-ray"],
)
def test_an_image_without_the_ray_the_stack_needs_is_refused_before_the_behaviour_proof(head, ray, named):
    fake = head(ray)
    with pytest.raises(ModelSupportError) as info:
        execute.ensure(props(cluster=CLUSTER))
    message = str(info.value)
    for part in ["spark-1: the model-support check refused image vllm-node:latest", "stage 'ray'", *named]:
        assert part in message, f"{part!r} not in:\n{message}"
    assert len(fake.runs) == 1, "the behaviour proof ran after a refused cluster layer"


def test_the_wanted_ray_passes_and_both_proofs_run(head):
    fake = head("2.49.1")
    outs = execute.ensure(props(cluster=CLUSTER))
    layer = outs["cluster_layer"]
    assert layer["verdict"] == "pass" and layer["ray"] == "2.49.1", layer
    assert outs["verdict"] == "pass" and len(fake.runs) == 2


def test_report_mode_records_a_missing_ray_and_goes_on(head):
    head(None)
    outs = execute.ensure(props(cluster=CLUSTER, mode="report"))
    assert outs["cluster_layer"]["verdict"] == "fail" and outs["cluster_layer"]["failed_stage"] == "ray"
    assert outs["verdict"] == "pass"


def test_under_executor_mp_an_image_without_ray_passes_and_the_outputs_say_why(head):
    # Enforce mode, and an image with no Ray at all: the Ray proof is not run (nothing of Ray runs).
    fake = head(None)
    outs = execute.ensure(props(cluster={"executor": "mp"}))
    assert outs["verdict"] == "pass"
    assert outs["cluster_layer"]["verdict"] == "not-run" and outs["cluster_layer"]["executor"] == "mp"
    assert "no Ray container runs" in outs["cluster_layer"]["reason"]
    assert len(fake.runs) == 1 and "--stages" not in fake.runs[0], "the cluster proof ran under mp"


def test_the_cluster_proof_runs_offline_by_image_id_with_room_for_ray():
    argv = cluster_argv(props(cluster={"ray_version": "==2.49.1", "stages": "ray,cluster,executor"}), "c1")
    assert argv[argv.index("--network") + 1] == "none" and "--shm-size" in argv
    assert argv[argv.index("--entrypoint") + 1] == "python3"
    assert argv[argv.index(IMAGE_ID) :] == [
        IMAGE_ID, "-", "--stages", "ray,cluster,executor", "--ray-version", "==2.49.1",
    ]  # fmt: skip


def test_a_changed_ray_version_runs_the_check_again():
    diff = ModelSupportCheckProvider().diff(
        "x", props(cluster=CLUSTER), props(cluster={**CLUSTER, "ray_version": "==2.60.0"})
    )
    assert diff.replaces == ["cluster"]


def test_enforcing_over_a_recorded_cluster_failure_refuses_without_a_run():
    recorded = {"verdict": "fail", "failed_stage": "ray", "error": "no Ray", "ray": None}
    olds = {**props(cluster=CLUSTER, mode="report"), "verdict": "pass", "cluster_layer": recorded}
    with pytest.raises(ModelSupportError, match="cluster layer failed at stage 'ray'"):
        ModelSupportCheckProvider().update("x", olds, {**olds, "mode": "enforce"})


def test_unchanged_inputs_after_a_create_need_no_new_run(head):
    # The engine diffs the recorded outputs against the new inputs: the proof's report must not
    # overwrite the `cluster` input it was asked with.
    head("2.49.1")
    created = ModelSupportCheckProvider().create(props(cluster=CLUSTER))
    diff = ModelSupportCheckProvider().diff(created.id, created.outs, props(cluster=CLUSTER))
    assert created.outs["cluster"] == CLUSTER and not diff.replaces, diff.replaces


@pytest.fixture
def said(monkeypatch) -> dict[str, list[str]]:
    said: dict[str, list[str]] = {"warn": [], "info": []}
    monkeypatch.setattr("pulumi.log.warn", lambda message, *_a, **_k: said["warn"].append(message))
    monkeypatch.setattr("pulumi.log.info", lambda message, *_a, **_k: said["info"].append(message))
    return said


def test_a_refusal_the_stack_expects_is_said_once_in_one_line(head, said):
    head(None)
    expect = {"because": "no lab image holds Ray", "cluster_layer": "ray"}
    outs = execute.ensure(props(cluster=CLUSTER, mode="report", expect=expect))
    assert outs["cluster_layer"]["failed_stage"] == "ray"  # recorded all the same
    assert said["warn"] == []
    assert len(said["info"]) == 1 and "\n" not in said["info"][0]
    assert "cluster_layer at 'ray'" in said["info"][0] and "no lab image holds Ray" in said["info"][0]


@pytest.mark.parametrize(
    "expect",
    [None, {"because": "x", "cluster_layer": "executor"}, {"because": "x", "behaviour": "environment"}],
)
def test_a_refusal_the_stack_does_not_expect_warns_in_full(head, said, expect):
    head(None)
    execute.ensure(props(cluster=CLUSTER, mode="report", expect=expect))
    assert said["info"] == []
    assert len(said["warn"]) == 1 and "next:" in said["warn"][0] and "stage 'ray'" in said["warn"][0]


def test_an_expected_refusal_still_stops_an_enforcing_stack(head):
    head(None)
    with pytest.raises(ModelSupportError, match="stage 'ray'"):
        execute.ensure(
            props(cluster=CLUSTER, mode="enforce", expect={"because": "x", "cluster_layer": "ray"})
        )
