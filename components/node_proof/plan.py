"""The node proof's pure decisions: validate the inputs, what a change does (`plan_change`), and the
verdict on every node's report and NCCL lines (`judged`)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from components.nccl import NcclFacts, nccl_problems
from components.node_programs.health_wire import gb1
from components.node_programs.node_proof import KERNEL_STEPS
from components.node_proof.facts import (
    ALONE,
    MISSING,
    RIGHT,
    WRONG,
    busbw,
    failed_steps,
    kernel_findings,
    software_drift,
)
from components.provider_kit.change import Change

ENFORCE, REPORT = "enforce", "report"
MODES = (ENFORCE, REPORT)
GPU_STEPS = ("gpu", "bf16_matmul", "fp8_scaled_mm", "vllm_op", "gpu_memory", *KERNEL_STEPS)
# Every input: a change to any proves again (a proof is not live state; nothing stays on a node).
INPUT_KEYS = (
    "nodes", "master_addr", "port", "mode", "gpu", "run", "bytes", "iterations", "deadline_s",
    "min_busbw_gbs", "container_prefix", "min_available_bytes",
)  # fmt: skip
OUTPUT_KEYS = (
    "verdict", "problems", "warnings", "results", "busbw_gbs", "backend",
    # Per node, what the proof ran under (`node_software`, for other resources to take as an input)
    # and what the last refresh read on the host (`observed_software`): drift between them proves again.
    "node_software", "observed_software",
)  # fmt: skip
GPU_NEXT = (
    'an image built for this GPU ("no kernel image is available": its kernels were not built for '
    "this device's compute capability; GB10 is sm_121)"
)
# Per kernel step, what to do when it is off its reference: the block GEMM's wrong kernel can be turned
# off (vLLM then picks its next one), the fused MoE's and any missing op need another image.
KERNEL_OPS = {
    "fp8_block_gemm": "vLLM's FP8 block-scaled GEMM (Fp8LinearMethod, weight_block_size [128, 128])",
    "fused_moe": "vLLM's fused MoE (fused_experts, FP8 block quant)",
    "attention": "vLLM's attention backend",
}
WRONG_NEXT = {
    "fp8_block_gemm": (
        "exclude the kernel vLLM chose: an image with "
        "ENV VLLM_DISABLED_KERNELS=CutlassFp8BlockScaledMMKernel (vllm#43367: CUTLASS block-scaled "
        "FP8 GEMMs compute wrong on sm_121), then `pulumi up`"
    ),
    "fused_moe": (
        "an image whose vLLM computes it right on this GPU (vllm#43507: no CUTLASS FP8 MoE on SM12x)"
    ),
}
MISSING_NEXT = (
    "an image whose vLLM has this op for FP8 block-quantised models (a release with Qwen3.5 support)"
)
NO_GPU_NEXT = (
    "give the containers the GPU: containers.gpu_runtime true and the NVIDIA container toolkit on "
    "the node (`docker run --rm --gpus all IMAGE nvidia-smi` lists it)"
)
CPU_TORCH_NEXT = (
    "an image whose torch is built with CUDA (this one's is a CPU-only build, `+cpu`: it sees no GPU "
    "however the container is given one); the deployment image's own torch is such a build"
)
MISSING_MODULE_NEXT = (
    "an image whose python3 can import {module}: the deployment image (image.*) with vLLM installed, "
    "not a bare torch image"
)
# Where a GPU step's error says what it is, the next step follows from it, not from the step's name.
NO_KERNEL = "no kernel image"
MISSING_MODULE = re.compile(r"No module named '(?P<module>[\w.]+)'")


def validate(props: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(input, reason) for each bad input, no I/O."""
    problems = []
    if props.get("mode") not in MODES:
        problems.append(("mode", f"{props.get('mode')!r}: give one of {', '.join(MODES)}"))
    nodes = props.get("nodes")
    if not isinstance(nodes, list) or not nodes:
        problems.append(("nodes", "give every node of the stack, the head first"))
    elif [entry.get("rank") for entry in nodes] != list(range(len(nodes))):
        problems.append(("nodes", "ranks must be 0..n-1 in order, the head's 0"))
    port = props.get("port")
    # (a dynamic resource's numbers reach check as floats: 29590.0 is the port 29590)
    if not isinstance(port, int | float) or not float(port).is_integer() or not 1024 <= port <= 65535:
        problems.append(("port", f"{props.get('port')!r}: give a port from 1024 to 65535"))
    if not isinstance(props.get("deadline_s"), int | float) or props["deadline_s"] <= 0:
        problems.append(("deadline_s", f"{props.get('deadline_s')!r}: give a positive number of seconds"))
    return problems


def plan_change(olds: Mapping[str, Any], news: Mapping[str, Any]) -> Change:
    """From recorded state and new inputs, no I/O: an update (the proof runs again) for each changed
    input, never a replacement; and for host software a refresh read otherwise than the proof ran
    under (a driver upgraded, new firmware: `node_software` against `observed_software`)."""
    updates = [key for key in INPUT_KEYS if olds.get(key) != news.get(key)]
    if software_drift(olds.get("node_software"), olds.get("observed_software")):
        updates.append("node_software")
    return Change(replaces=(), updates=tuple(updates))


def backend(gpu: bool) -> str:
    """The group's backend: NCCL with the GPU step, gloo without (the lab)."""
    return "nccl" if gpu else "gloo"


def _cpu_only(torch: str | None, error: str) -> bool:
    """A CPU-only torch: the program says so, or its version does (`2.9.0+cpu`)."""
    return "CPU-only" in error or (torch or "").endswith("+cpu")


def _gpu_step_next(step: str, error: str, torch: str | None) -> str:
    """The next step for a failed GPU step, from what its error says."""
    if missing := MISSING_MODULE.search(error):
        module = missing["module"].split(".")[0]
        return MISSING_MODULE_NEXT.format(module=module) + f" (the image's python3 cannot import {module})"
    if _cpu_only(torch, error):
        return CPU_TORCH_NEXT
    if step == "gpu":
        return NO_GPU_NEXT
    if NO_KERNEL in error:
        return GPU_NEXT
    return "check the image against this GPU (`status` shows each node's GPU and torch) and the error above"


def _step_problem(
    node: str, step: str, error: str, props: Mapping[str, Any], torch: str | None = None
) -> str:
    head = props["nodes"][0]["name"]
    if step == "gpu":
        return f"{node}: {error}; next: {_gpu_step_next(step, error, torch)}"
    if step in GPU_STEPS:
        return f"{node}: the GPU step {step} failed: {error}; next: {_gpu_step_next(step, error, torch)}"
    if step == "join":
        return (
            f"{node}: could not join the group of {head} at {props['master_addr']}:{int(props['port'])} "
            f"within {float(props['deadline_s']):.0f}s: {error}; next: check that {node} reaches "
            f"{head}'s fabric_ip on fabric.probe_port (firewall, route, nodes[].fabric_ip)"
        )
    return f"{node}: the {step} step failed: {error}"


def node_problems(
    props: Mapping[str, Any], entry: Mapping[str, Any], run: Mapping[str, Any], nccl: NcclFacts
) -> tuple[list[str], list[str]]:
    """(problems, warnings) of one node's proof: its run (`report`, or `error`/`exit`/`stderr` when
    it gave none), its steps and, under NCCL, the transport NCCL used against the HCAs it was given."""
    node, report = str(entry["name"]), run.get("report")
    if report is None:
        said = run.get("error") or f"exit {run.get('exit')}: {run.get('stderr', '')[-600:].strip()}"
        return [f"{node}: the proof gave no report ({said}); next: {run.get('hint') or 'see the error'}"], []
    if report.get("error"):
        return [f"{node}: {report['error']}; next: deploy an image with torch and vLLM"], []
    problems = [
        _step_problem(node, step, error, props, report.get("torch"))
        for step, error in failed_steps(report)
        if step not in KERNEL_STEPS  # judged by their figures, below
    ]
    problems += kernel_problems(node, report)
    if report.get("deadline") and not problems:
        # The bound cut a step: the one that ran says what it was waiting for (a join: the head).
        cut = report.get("running")
        problems.append(
            _step_problem(node, cut, report["deadline"], props)
            if cut
            else f"{node}: {report['deadline']}; next: see the NCCL lines of {node}"
        )
    if problems or not props["gpu"] or len(props["nodes"]) < 2:
        return problems, []
    return nccl_problems(node, nccl, list(entry.get("ib_hca") or []))


def kernel_problems(node: str, report: Mapping[str, Any]) -> list[str]:
    """One problem per kernel step that is wrong, missing or failed: the op, the node, the compute
    capability (GB10 is 12.1), the kernel vLLM chose, the figures, and what to do next."""
    device = ((report.get("steps") or {}).get("gpu")) or {}
    where = f"{node} (compute capability {device.get('capability') or '?'})"
    problems = []
    for step, found in kernel_findings(dict(report)).items():
        state, op = found["state"], KERNEL_OPS[step]
        if state in (RIGHT, ALONE):
            continue
        if state == WRONG:
            error = found["rel_error"]
            off = f"relative error {error:.3g}" if isinstance(error, int | float) else "non-finite values"
            problems.append(
                f"{where}: {op} is wrong: {off} against the torch reference, above {found['tolerance']:g}, "
                f"with kernel {found['kernel'] or '?'}; next: {WRONG_NEXT.get(step, GPU_NEXT)}"
            )
        elif state == MISSING:
            problems.append(f"{where}: {op} is missing: {found['error']}; next: {MISSING_NEXT}")
        else:
            problems.append(f"{where}: {op} did not run: {found['error']}; next: {GPU_NEXT}")
    return problems


def node_kernels(report: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Per kernel step, what the output and `status` show: its state, the kernel and its error."""
    return {
        step: {"state": found["state"], "kernel": found["kernel"], "rel_error": found["rel_error"]}
        for step, found in kernel_findings(dict(report)).items()
    }


def node_result(entry: Mapping[str, Any], run: Mapping[str, Any], nccl: NcclFacts, gpu: bool) -> dict:
    """What the `fabric` output and `status` show of one node's proof."""
    report = run.get("report") or {}
    steps = report.get("steps") or {}
    device, memory = steps.get("gpu") or {}, steps.get("gpu_memory") or {}
    return {
        "backend": (steps.get("join") or {}).get("backend") or backend(gpu),
        # gloo: no NCCL ran (no GPU in the stack's containers); None: NCCL named none.
        "network": nccl.network if gpu else "gloo",
        "hcas": list(nccl.ib_hcas),
        "gid_index": dict(nccl.gid_index),
        "gpu": (
            {
                "name": device.get("name"),
                "capability": device.get("capability"),
                "free_bytes": memory.get("free_bytes"),
                "total_bytes": memory.get("total_bytes"),
            }
            if device.get("ok")
            else None
        ),  # fmt: skip
        "failed": [step for step, _ in failed_steps(report)],
        "busbw_gbs": busbw(report),
        "torch": report.get("torch"),
        "kernels": node_kernels(report),
        "nccl_lines": list(nccl.lines[:20]),
    }


def judged(
    props: Mapping[str, Any], runs: Mapping[str, Mapping[str, Any]], nccl: Mapping[str, NcclFacts]
) -> dict:
    """The proof's outputs from every node's run and NCCL facts: the verdict, problems, warnings,
    per node results, the group's bus bandwidth (the head's figure) against fabric.min_busbw_gbps."""
    problems: list[str] = []
    warnings: list[str] = []
    results = {}
    for entry in props["nodes"]:
        name = str(entry["name"])
        found, warned = node_problems(props, entry, runs[name], nccl[name])
        problems += found
        warnings += warned
        results[name] = node_result(entry, runs[name], nccl[name], bool(props["gpu"]))
    head = str(props["nodes"][0]["name"])
    figure = results[head]["busbw_gbs"]
    floor = props.get("min_busbw_gbs")
    if floor is not None and len(props["nodes"]) > 1 and figure is not None and figure < float(floor):
        problems.append(
            f"the all-reduce's bus bandwidth {figure:.2f} GB/s ({figure * 8:.1f} Gb/s) is below "
            f"fabric.min_busbw_gbps {float(floor):g} GB/s; next: see each node's NCCL network and "
            "HCAs (`status`), the MTU and the cabling"
        )
    verdict = "passed" if not problems else ("refused" if props["mode"] == ENFORCE else "problems recorded")
    return {
        "verdict": verdict, "problems": problems, "warnings": warnings, "results": results,
        "busbw_gbs": figure, "backend": backend(props["gpu"]),
    }  # fmt: skip


def skipped(props: Mapping[str, Any], short: Mapping[str, int]) -> dict:
    """The outputs of a proof not run: on these nodes the memory left (MemAvailable) is below
    `min_available_bytes`, as when the serving containers still hold it (an update runs before they
    are replaced). Never a refusal: nothing was judged, and the serving engine is left alone."""
    floor = float(props["min_available_bytes"])
    warnings = [
        f"{node}: not run: {gb1(free)} of memory available, below the proof's "
        f"{gb1(floor)} (the serving containers hold the rest); its CUDA context, NCCL buffers "
        "and all-reduce would compete with them. It runs in full when they are stopped (a first `up`, "
        "or `pulumi up` after `make down`)"
        for node, free in short.items()
    ]
    return {
        "verdict": "skipped", "problems": [], "warnings": warnings, "results": {},
        "busbw_gbs": None, "backend": backend(props["gpu"]),
    }  # fmt: skip


def drift_said(olds: Mapping[str, Any]) -> list[str]:
    """Each node's host software that a refresh read otherwise than the proof ran under, in words."""
    return [
        f"{node}: {key} {was} -> {now}"
        for node, moved in software_drift(olds.get("node_software"), olds.get("observed_software")).items()
        for key, (was, now) in moved.items()
    ]


def refusal(problems: Sequence[str]) -> str:
    return (
        f"node proof: {len(problems)} problem(s) before any serving container:\n"
        + "\n".join(f"  - {p}" for p in problems)
        + "\n  (fabric.node_proof: enforce stops here; `report` records these and goes on)"
    )
