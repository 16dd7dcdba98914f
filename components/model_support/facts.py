"""What the check reads on the head before any container starts: the checkpoint snapshot's facts
(`node_programs/model_facts.py`: weight bytes and where that size came from, layer count,
config.json, MTP and vision tensor bytes) and the repo digests of the head's image (for a pinned
reference). Reads, never changes; the parsers below are pure. The decisions on these facts
(`check_fit`, `pin_mismatch`) are in `plan.py`.
"""

from __future__ import annotations

import json
from typing import Any

from components.model_support import programs
from components.model_support.plan import ModelSupportError, last_json_line
from components.remote import RemoteError, Result, SshTransport

FACTS_TIMEOUT_S = 120


def checkpoint_facts(transport: SshTransport, snapshot_path: str) -> dict[str, Any]:
    """Size, source of that size and layer count of the snapshot, read on the head."""
    result = transport.run(
        programs.model_facts_argv(snapshot_path),
        stdin=programs.model_facts_source(),
        timeout=FACTS_TIMEOUT_S,
    )
    return parse_checkpoint_facts(transport.name, snapshot_path, result)


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


def image_repo_digests(transport: SshTransport, image_id: str) -> list[str]:
    """The repo digests the head's Docker records for the image NodeImage placed there."""
    result = transport.run(programs.repo_digests_argv(image_id), timeout=FACTS_TIMEOUT_S)
    result.check("the image NodeImage placed on the head must still be there: `pulumi up --refresh`")
    return parse_repo_digests(result.out)


def parse_repo_digests(out: str) -> list[str]:
    """`docker image inspect --format '{{json .RepoDigests}}'`'s answer (`null` for none)."""
    return list(json.loads(out or "null") or [])
