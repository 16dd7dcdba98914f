"""The node proof's kernel comparison judged on the program's report (composed fixtures in
tests/support/node_proof_reports/: no GPU was lent): every kernel right, the block GEMM wrong, the
fused MoE missing, and a CPU-only machine whose GPU step is skipped. The program's torch-free parts
(its tolerances and steps) are imported without torch."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from components.node_programs import node_proof as program
from components.node_proof import judged
from components.node_proof.facts import FAILED, MISSING, RIGHT, WRONG, kernel_findings, kernel_state
from components.node_proof.plan import kernel_problems
from status.fabric import proof_line
from tests.unit.test_node_proof import log, nccl_of, props, runs_of

REPORTS = Path(__file__).resolve().parents[1] / "support" / "node_proof_reports"


def fixture(name: str, node: str = "spark-1", rank: int = 0) -> dict:
    report = json.loads((REPORTS / name).read_text())
    assert report.pop("_fixture")["composed"] is True  # marked: composed, not captured
    return {**report, "node": node, "rank": rank}


def two_nodes(first: str, second: str = "gb10_kernels_right.json", gpu: bool = True) -> dict:
    p = props(gpu=gpu)
    reports = {"spark-1": fixture(first, "spark-1", 0), "spark-2": fixture(second, "spark-2", 1)}
    text = {name: log("spark_roce_v2.28.9.log") for name in ("spark-1", "spark-2")}
    return judged(p, runs_of(p, reports, text), nccl_of(p, text))


def test_the_program_declares_its_kernels_and_bounds_without_torch():
    code = "import sys, components.node_programs.node_proof; print('torch' in sys.modules)"
    imported = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True, text=True, check=True, cwd=Path(__file__).resolve().parents[2],
    )  # fmt: skip
    assert imported.stdout.strip() == "False"
    assert program.KERNEL_STEPS == ("fp8_block_gemm", "fused_moe", "attention")
    assert program.BLOCK == (128, 128)
    assert program.TOLERANCES == {"fp8_block_gemm": 2e-2, "fused_moe": 5e-2}


@pytest.mark.parametrize(
    ("entry", "state"),
    [
        ({"ok": True, "finite": True, "rel_error": 0.003, "tolerance": 0.02}, RIGHT),
        ({"ok": True, "finite": True, "rel_error": 0.02, "tolerance": 0.02}, RIGHT),
        ({"ok": False, "finite": True, "rel_error": 0.021, "tolerance": 0.02}, WRONG),
        # The figures decide, not the program's `ok`.
        ({"ok": True, "finite": True, "rel_error": 0.9, "tolerance": 0.02}, WRONG),
        ({"ok": False, "finite": False, "rel_error": None, "tolerance": 0.02}, WRONG),
        ({"ok": False, "missing": True, "error": "ImportError: x"}, MISSING),
        ({"ok": False, "error": "TypeError: apply() got an unexpected keyword"}, FAILED),
        ({"ok": True, "not_callable_alone": "not callable alone: …"}, "not callable alone"),
    ],
)
def test_a_kernel_state_is_read_from_its_figures(entry, state):
    assert kernel_state(entry) == state


def test_every_kernel_right_passes_and_records_the_kernel_per_node():
    outs = two_nodes("gb10_kernels_right.json")
    assert outs["verdict"] == "passed", outs["problems"]
    kernels = outs["results"]["spark-1"]["kernels"]
    assert kernels["fp8_block_gemm"] == {
        "state": "right", "kernel": "w8a8_block_fp8_linear=W8A8BlockFp8LinearOp", "rel_error": 0.00291,
    }  # fmt: skip
    assert kernels["fused_moe"]["state"] == "right" and kernels["attention"]["state"] == "not callable alone"
    line, _ = proof_line({"output": {"proof": {"mode": "enforce", **outs}}})
    assert "kernels: spark-1 fp8_block_gemm w8a8_block_fp8_linear=W8A8BlockFp8LinearOp (right)" in line
    assert "attention" not in line


def test_a_wrong_block_gemm_is_refused_naming_the_op_node_capability_kernel_and_next_step():
    outs = two_nodes("gb10_block_gemm_wrong.json")
    assert outs["verdict"] == "refused"
    (problem,) = outs["problems"]
    assert problem.startswith(
        "spark-1 (compute capability 12.1): vLLM's FP8 block-scaled GEMM (Fp8LinearMethod, "
        "weight_block_size [128, 128]) is wrong: relative error 1.38 against the torch reference, above "
        "0.02, with kernel fp8_linear=CudaFp8BlockScaledMMKernel; next: "
    ), problem
    assert "VLLM_DISABLED_KERNELS=CutlassFp8BlockScaledMMKernel" in problem and "vllm#43367" in problem
    assert outs["results"]["spark-1"]["kernels"]["fp8_block_gemm"]["state"] == "wrong"
    assert outs["results"]["spark-2"]["kernels"]["fp8_block_gemm"]["state"] == "right"


def test_a_missing_fused_moe_is_a_problem_naming_the_import_error():
    outs = two_nodes("gb10_kernels_right.json", "gb10_fused_moe_missing.json")
    (problem,) = outs["problems"]
    assert problem.startswith(
        "spark-2 (compute capability 12.1): vLLM's fused MoE (fused_experts, FP8 block quant) is "
        "missing: ImportError: cannot import name 'fused_experts'"
    ), problem
    assert "next: an image whose vLLM has this op" in problem


def test_a_kernel_that_did_not_run_is_named_with_the_gpu_next_step():
    report = fixture("gb10_kernels_right.json")
    report["steps"]["fused_moe"] = {"ok": False, "error": "RuntimeError: CUDA error: no kernel image"}
    (problem,) = kernel_problems("spark-1", report)
    assert problem.startswith("spark-1 (compute capability 12.1): vLLM's fused MoE (fused_experts, FP8 ")
    assert "did not run: RuntimeError: CUDA error: no kernel image; next: an image built" in problem


def test_a_cpu_only_machine_runs_no_kernel_and_is_judged_as_before():
    p = props(gpu=False)
    reports = {
        "spark-1": fixture("cpu_only.json", "spark-1", 0),
        "spark-2": fixture("cpu_only.json", "spark-2", 1),
    }
    outs = judged(p, runs_of(p, reports), nccl_of(p, {}))
    assert outs["verdict"] == "passed" and outs["backend"] == "gloo", outs["problems"]
    assert kernel_findings(reports["spark-1"]) == {}
    assert outs["results"]["spark-1"]["kernels"] == {}
    assert "kernels:" not in proof_line({"output": {"proof": {"mode": "enforce", **outs}}})[0]
