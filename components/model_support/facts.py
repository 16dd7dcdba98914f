"""What the check reads on the head, parsed into values: the checkpoint snapshot's facts
(`node_programs/model_facts.py`: weight bytes and where that size came from, layer count,
config.json, MTP and vision tensor bytes), the repo digests of the head's image (for a pinned
reference), and the proofs' reports. Pure: the commands are in `programs.py`, running them is
`execute.py`'s, and the decisions on these facts (`check_fit`, `pin_mismatch`) are in `plan.py`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from enum import Enum
from typing import Any

from components.model_support.errors import ModelSupportError
from components.node_programs.proof_bootstrap import Exit as BootstrapExit
from components.provider_kit.reports import read_report
from components.remote import RemoteError, Result, stderr_tail


class ProofExit(int, Enum):
    """The proof program's exit statuses (its contract), and the bootstrap's deadline."""

    PASS = 0
    FAILED = 1
    USAGE = 2
    DEADLINE = int(BootstrapExit.DEADLINE)


# What to do when a stage fails: docs/troubleshooting.md's rows say the same.
STAGE_HINTS = {
    "environment": (
        "the image's python3 cannot run the proof (vLLM, transformers or torch missing or broken): "
        "use an image with vLLM >= 0.17 (image.strategy: prebuilt, image.prebuilt)"
    ),
    "config": (
        "the image's vLLM/transformers cannot load this checkpoint's config.json: use an image whose "
        "vLLM knows this model_type (vLLM >= 0.17 for qwen3_5 / qwen3_5_moe), or pin transformers "
        "to what that vLLM expects"
    ),
    "construct": (
        "the image's vLLM cannot build this architecture (the seed's hybrid stops here at "
        "_mark_tower_model): use a prebuilt image with vLLM >= 0.17 (image.strategy: prebuilt)"
    ),
    "load": (
        "an error naming tensors missing from the checkpoint index (IncompleteLoad, "
        "IncompleteCheckpoint) means the checkpoint on the head is incomplete or not the revision its "
        "config.json belongs to: `pulumi up --refresh` re-sends it; otherwise its tensor names do not "
        "land in the model's parameters: the image's vLLM and this checkpoint (or revision) do not "
        "match; use a vLLM that supports this checkpoint"
    ),
}


def image_label(props: Mapping[str, Any], report: Mapping[str, Any] | None = None) -> str:
    """The image as messages name it: reference, image ID, and the versions the proof found."""
    image_id = str(props.get("image_id") or "")
    vllm = (report or {}).get("vllm") or "unknown"
    transformers = (report or {}).get("transformers") or "unknown"
    return f"{props.get('image')} ({image_id[:19]}…, vLLM {vllm}, transformers {transformers})"


def parse_checkpoint_facts(node: str, snapshot_path: str, result: Result) -> dict[str, Any]:
    """The facts program's report; RemoteError when it gave none, ModelSupportError when the snapshot
    holds no weights the check can size."""
    report = read_report(result) if result.ok else None
    if report is None:
        raise RemoteError(
            node, list(result.argv), result.returncode, result.stderr,
            "the head needs python3 (it already runs the readiness probe and NodeImage's helpers)",
        )  # fmt: skip
    if report.get("error") or not report.get("weight_bytes"):
        raise ModelSupportError(
            f"{node}: checkpoint snapshot {snapshot_path}: "
            f"{report.get('error') or 'no model.safetensors.index.json and no *.safetensors shards'}\n"
            "  next: the checkpoint on the head is incomplete; `pulumi up --refresh` re-sends it"
        )
    return report


def parse_repo_digests(out: str) -> list[str]:
    """`docker image inspect --format '{{json .RepoDigests}}'`'s answer (`null` for none)."""
    return list(json.loads(out or "null") or [])


def parse_proof(props: Mapping[str, Any], result: Result) -> dict[str, Any]:
    """The proof's report from its container run; ModelSupportError when it gave none."""
    node = props["node"]["name"]
    report = read_report(result)
    if result.returncode in (ProofExit.PASS, ProofExit.FAILED, ProofExit.USAGE) and report is not None:
        if report.get("verdict") not in ("pass", "fail"):
            raise ModelSupportError(f"{node}: the proof's report has no verdict: {json.dumps(report)[:300]}")
        if (report["verdict"] == "pass") != (result.returncode == ProofExit.PASS):
            raise ModelSupportError(
                f"{node}: the proof exited {result.returncode} but reported {report['verdict']!r}"
            )
        return report
    if result.returncode == ProofExit.DEADLINE:
        why = f"the proof did not finish within its deadline ({props.get('deadline_s')} s)"
        hint = "raise the check's deadline, or see whether the head is short of memory or CPU"
    elif result.returncode == 125:
        why = "docker could not start the check's container"
        hint = "the image ID must be on the head (NodeImage placed it): run `pulumi up --refresh`"
    elif result.returncode in (126, 127):
        why = "the image has no runnable python3"
        hint = STAGE_HINTS["environment"]
    else:
        why = f"the proof ended without a report (exit {result.returncode})"
        hint = "its stderr is above; a crash of the image's python is an environment failure"
    raise ModelSupportError(
        f"{node}: the model-support check could not run in image {image_label(props)}: {why}\n"
        f"  stderr: {stderr_tail(result.stderr, lines=20)}\n  next: {hint}"
    )


def parse_cluster(props: Mapping[str, Any], result: Result) -> dict[str, Any]:
    """The cluster proof's report from its container run (an image without python3 fails at 'ray');
    ModelSupportError when it gave none."""
    report = read_report(result)
    if report is not None and report.get("verdict") in ("pass", "fail"):
        return report
    if result.returncode in (126, 127):
        return {"verdict": "fail", "failed_stage": "ray", "error": "the image has no runnable python3"}
    raise ModelSupportError(
        f"{props['node']['name']}: the cluster-layer proof ended without a report in image "
        f"{props.get('image')} (exit {result.returncode})\n"
        f"  stderr: {stderr_tail(result.stderr, lines=20)}"
    )
