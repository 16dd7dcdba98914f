"""What the check reads on the head, parsed into values: the checkpoint snapshot's facts
(`node_programs/model_facts.py`: weight bytes and where that size came from, layer count,
config.json, MTP and vision tensor bytes), the repo digests of the head's image (for a pinned
reference), and the proofs' reports. Pure: the commands are in `programs.py`, running them is
`execute.py`'s, and the decisions on these facts (`check_fit`, `pin_mismatch`) are in `plan.py`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from components.model_support import programs
from components.model_support.errors import ModelSupportError
from components.model_support.plan import STAGE_HINTS, ProofExit, image_label
from components.remote import RemoteError, Result, stderr_tail


def parse_checkpoint_facts(node: str, snapshot_path: str, result: Result) -> dict[str, Any]:
    """The facts program's report; RemoteError when it gave none, ModelSupportError when the snapshot
    holds no weights the check can size."""
    report = last_json_line(result.text) if result.ok else None
    if report is None:
        raise RemoteError(
            node, programs.model_facts_argv(snapshot_path), result.returncode, result.stderr,
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


def last_json_line(text: str) -> dict[str, Any] | None:
    """The report: the last non-empty stdout line, when it is a JSON object."""
    for line in reversed(text.strip().splitlines()):
        line = line.strip()
        if not line:
            continue
        try:
            value = json.loads(line)
        except ValueError:
            return None
        return value if isinstance(value, dict) else None
    return None


def parse_proof(props: Mapping[str, Any], result: Result) -> dict[str, Any]:
    """The proof's report from its container run; ModelSupportError when it gave none."""
    node = props["node"]["name"]
    report = last_json_line(result.text)
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
    report = last_json_line(result.text)
    if report is not None and report.get("verdict") in ("pass", "fail"):
        return report
    if result.returncode in (126, 127):
        return {"verdict": "fail", "failed_stage": "ray", "error": "the image has no runnable python3"}
    raise ModelSupportError(
        f"{props['node']['name']}: the cluster-layer proof ended without a report in image "
        f"{props.get('image')} (exit {result.returncode})\n"
        f"  stderr: {stderr_tail(result.stderr, lines=20)}"
    )
