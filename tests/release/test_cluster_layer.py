"""The cluster layer on real releases: what a graft of the seed's pair holds, vLLM 0.17.1 from PyPI with the
Ray release the seed's base pins (an overlay installed with `--target`, first on PYTHONPATH and PATH),
passes patches/prove_cluster.py (Ray beside vLLM at that version, a one-node Ray cluster, vLLM's Ray
executor with its torch) and, in the same interpreter and overlay, the behaviour proofs. The cluster
proof runs in a PID namespace of its own (`unshare`), so its `ray stop` sees only its own Ray."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.release.conftest import SEED_BASE_VERSION
from tests.release.releases import PATCHES, ReleaseError, pinned, ray_overlay, run_proof

pytestmark = pytest.mark.release

PROVE_CLUSTER = PATCHES / "prove_cluster.py"
TIMEOUT_S = 600


@pytest.fixture(scope="module")
def base_ray() -> str:
    """The Ray the seed's base (vLLM 0.14.0's environment) pins."""
    return pinned(SEED_BASE_VERSION, "ray")


@pytest.fixture(scope="module")
def overlay(prebuilt: Path, base_ray: str) -> Path:
    try:
        return ray_overlay(base_ray, prebuilt)
    except ReleaseError as exc:
        pytest.fail(f"the Ray {base_ray} overlay could not be made: {exc}", pytrace=False)


def prove_cluster(python: Path, overlay: Path, *args: str) -> tuple[int, dict, str]:
    unshare = shutil.which("unshare")
    assert unshare, "the cluster proof needs util-linux's unshare (a PID namespace for `ray stop`)"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(
        PYTHONPATH=str(overlay),
        PATH=f"{overlay / 'bin'}:{python.parent}:{env.get('PATH', '/usr/bin:/bin')}",
        HF_HUB_OFFLINE="1",
    )
    argv = [unshare, "--pid", "--fork", "--mount-proc", str(python), str(PROVE_CLUSTER), *args]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=TIMEOUT_S, cwd="/")
    lines = done.stdout.strip().splitlines()
    assert lines, f"prove_cluster.py printed nothing (exit {done.returncode}):\n{done.stderr[-3000:]}"
    return done.returncode, json.loads(lines[-1]), done.stderr


def test_vllm_0_17_1_with_the_base_s_ray_passes_the_cluster_layer_and_behaviour_proofs(
    prebuilt, overlay, base_ray
):
    code, report, stderr = prove_cluster(prebuilt, overlay, "--ray-version", f"=={base_ray}")
    why = f"{json.dumps(report)[:2000]}\n{stderr[-2000:]}"
    assert code == 0 and report["verdict"] == "pass", why
    assert report["ray"] == base_ray and report["vllm"] == "0.17.1", why
    assert [(c["stage"], c["ok"]) for c in report["checks"]] == [
        ("ray", True), ("cluster", True), ("executor", True),
    ], why  # fmt: skip
    # The overlay's Ray is the one proven (the venv's own pip install of vLLM brought one too).
    assert str(overlay) in report["checks"][0]["detail"], why
    # vLLM's wheel states its Ray requirement, and the base's Ray is within it.
    assert report["vllm_ray_requirement"] and report["vllm_ray_requirement"].startswith("ray"), why
    proof = run_proof(prebuilt, overlays=(overlay,))
    assert proof.returncode == 0 and proof.report["verdict"] == "pass", proof.why()


def test_a_ray_other_than_the_stack_needs_is_named(prebuilt, overlay, base_ray):
    code, report, _ = prove_cluster(prebuilt, overlay, "--stages", "ray", "--ray-version", "==2.9.3")
    assert code == 1 and report["failed_stage"] == "ray", report
    assert f"Ray {base_ray} in the image, the stack needs Ray ==2.9.3" in report["error"], report
