"""What a node's proof printed, parsed into values (pure): its report's findings (the report itself
is read by provider_kit's `read_report`; NCCL's own INFO lines by `components/nccl.py`'s `parse_nccl_log`;
a node's /proc/meminfo by health_wire's `mem_available`)."""

from __future__ import annotations

from typing import Any

from components.node_programs.node_proof import KERNEL_STEPS


def busbw(report: dict[str, Any] | None) -> float | None:
    """The sized all-reduce's bus bandwidth in GB/s, or None when it did not run."""
    sized = ((report or {}).get("steps") or {}).get("sized_all_reduce") or {}
    value = sized.get("busbw_gbs")
    return float(value) if sized.get("ok") and isinstance(value, int | float) else None


# The proof's steps in the order it runs them (its report's keys are sorted).
STEPS = (
    "gpu",
    "bf16_matmul",
    "fp8_scaled_mm",
    "vllm_op",
    "gpu_memory",
    *KERNEL_STEPS,
    "join",
    "all_reduce",
    "sized_all_reduce",
)


def failed_steps(report: dict[str, Any] | None) -> list[tuple[str, str]]:
    """(step, error line) for each step that failed, in the order the proof ran them."""
    steps = (report or {}).get("steps") or {}
    ordered = [name for name in STEPS if name in steps] + sorted(set(steps) - set(STEPS))
    return [(name, str(steps[name].get("error", "failed"))) for name in ordered if not steps[name].get("ok")]


# A kernel step's state, as `kernel_findings` reads it.
RIGHT, WRONG, MISSING, FAILED, ALONE = "right", "wrong", "missing", "failed", "not callable alone"


def kernel_state(entry: dict[str, Any]) -> str:
    """What one kernel step found: within its tolerance, off it (or not finite), not in this vLLM
    (an import error), not run to a result, or not callable alone. Judged again from the figures
    (the relative error against the tolerance it was held to), not from the program's `ok`."""
    if entry.get("not_callable_alone"):
        return ALONE
    if entry.get("missing"):
        return MISSING
    error, bound = entry.get("rel_error"), entry.get("tolerance")
    if entry.get("finite") is False:
        return WRONG
    if isinstance(error, int | float) and isinstance(bound, int | float):
        return RIGHT if error <= bound else WRONG
    return FAILED


def kernel_findings(report: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    """Per kernel step the proof ran (none without the GPU step): its state, the kernel vLLM chose,
    the relative error and its tolerance, and the error line where it gave no result."""
    steps = (report or {}).get("steps") or {}
    return {
        name: {
            "state": kernel_state(steps[name]),
            "kernel": steps[name].get("kernel"),
            "rel_error": steps[name].get("rel_error"),
            "tolerance": steps[name].get("tolerance"),
            "error": steps[name].get("error") or steps[name].get("not_callable_alone"),
        }
        for name in KERNEL_STEPS
        if isinstance(steps.get(name), dict)
    }


# What a refresh reads again on a node's host (cheap, no container); the image's versions (torch,
# NCCL, vLLM) come from the proof's run and change only with the image, an input already.
HOST_KEYS = ("driver", "cuda", "kernel", "firmware")
IMAGE_KEYS = ("torch", "nccl", "vllm")


def node_software(host: dict[str, Any] | None, report: dict[str, Any] | None) -> dict[str, Any]:
    """One node's software: the host's facts (None each where unread) and the image's versions from
    its proof's report (None each where the proof did not run)."""
    image = (report or {}).get("software") or {}
    found = {key: (host or {}).get(key) for key in HOST_KEYS}
    return {**found, **{key: image.get(key) for key in IMAGE_KEYS}}


def software_drift(recorded: Any, observed: Any) -> dict[str, dict[str, tuple[Any, Any]]]:
    """Node -> {fact: (proved under, read now)} for each host fact a refresh read otherwise than the
    proof ran under. A fact unread on either side (None) is no drift: a node out of reach on refresh
    must not prove again."""
    if not isinstance(recorded, dict) or not isinstance(observed, dict):
        return {}
    drift = {}
    for node, now in observed.items():
        was = recorded.get(node)
        if not isinstance(was, dict) or not isinstance(now, dict):
            continue
        moved = {
            key: (was.get(key), now.get(key))
            for key in HOST_KEYS
            if was.get(key) is not None and now.get(key) is not None and was.get(key) != now.get(key)
        }
        if moved:
            drift[node] = moved
    return drift
