"""What a node's proof printed, parsed into values (pure): its report's findings (the report itself
is read by provider_kit's `read_report`; NCCL's own INFO lines by `components/nccl.py`'s `parse_nccl_log`;
a node's /proc/meminfo by health_wire's `mem_available`)."""

from __future__ import annotations

from typing import Any


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
    "join",
    "all_reduce",
    "sized_all_reduce",
)


def failed_steps(report: dict[str, Any] | None) -> list[tuple[str, str]]:
    """(step, error line) for each step that failed, in the order the proof ran them."""
    steps = (report or {}).get("steps") or {}
    ordered = [name for name in STEPS if name in steps] + sorted(set(steps) - set(STEPS))
    return [(name, str(steps[name].get("error", "failed"))) for name in ordered if not steps[name].get("ok")]
