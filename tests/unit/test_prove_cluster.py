"""patches/prove_cluster.py's `ray` stage against stand-in packages (a `vllm` and a `ray` that only
carry a version): no Ray, the wrong Ray, no vLLM are each named. The cluster and executor stages run
for real in the lab build and the release tier."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

PROGRAM = Path(__file__).resolve().parents[2] / "patches" / "prove_cluster.py"


def packages(root: Path, ray: str | None, vllm: str | None = "0.17.1") -> Path:
    if vllm:
        (root / "vllm").mkdir(parents=True)
        (root / "vllm" / "__init__.py").write_text("raise ImportError('importing vllm needs torch')\n")
        (root / "vllm" / "_version.py").write_text(f"__version__ = version = {vllm!r}\n")
    if ray:
        (root / "ray").mkdir(parents=True)
        (root / "ray" / "__init__.py").write_text(f"__version__ = {ray!r}\n")
    return root


def prove(path: Path, *args: str) -> tuple[int, dict]:
    done = subprocess.run(
        [sys.executable, "-S", str(PROGRAM), *args],
        capture_output=True, text=True, env={"PYTHONPATH": str(path)}, timeout=60, cwd=path,
    )  # fmt: skip
    return done.returncode, json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    ("ray", "vllm", "wanted", "code", "named"),
    [
        (None, "0.17.1", "==2.49.1", 1, ["no Ray in the interpreter that runs vLLM 0.17.1", "Ray ==2.49.1"]),
        ("2.60.0", "0.17.1", "==2.49.1", 1, ["Ray 2.60.0 in the image, the stack needs Ray ==2.49.1"]),
        ("2.60.0", None, "", 1, ["no `vllm` in this interpreter"]),
        ("2.49.1", "0.17.1", "==2.49.1", 0, []),
        ("2.49.1", "0.17.1", "", 0, []),
        # A graft: the base's exact version and the stack's image.ray_version, both met or named.
        ("2.60.0", "0.17.1", "==2.60.0,==2.49.1", 1, ["the stack needs Ray ==2.60.0,==2.49.1"]),
        ("2.60.0", "0.17.1", "==2.60.0,==2.60.0", 0, []),
    ],
    ids=["no-ray", "wrong-ray", "no-vllm", "wanted-ray", "any-ray", "graft-conflict", "graft-agrees"],
)
def test_the_ray_stage_names_the_missing_piece(tmp_path, ray, vllm, wanted, code, named):
    returncode, report = prove(packages(tmp_path, ray, vllm), "--stages", "ray", "--ray-version", wanted)
    assert returncode == code, report
    assert report["verdict"] == ("pass" if code == 0 else "fail")
    assert report["failed_stage"] == (None if code == 0 else "ray"), report
    for part in named:
        assert part in report["error"], report
    if code == 0:
        assert report["ray"] == ray and report["vllm"] == vllm


def test_an_unknown_stage_is_a_usage_error(tmp_path):
    returncode, report = prove(tmp_path, "--stages", "ray,kubernetes")
    assert returncode == 2 and "kubernetes" in report["error"]


def test_the_cluster_stage_is_never_run_without_saying_which_ray(tmp_path):
    # --stages cluster alone still runs the ray stage first: here it stops there (no Ray).
    returncode, report = prove(packages(tmp_path, None), "--stages", "cluster")
    assert returncode == 1 and report["failed_stage"] == "ray", report
