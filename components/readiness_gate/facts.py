"""The probe's report as a value: pure, no I/O."""

from __future__ import annotations

from typing import Any

from components.provider_kit.reports import require_report
from components.remote import Result


def probe_report(result: Result, node: str) -> dict[str, Any]:
    """The probe's report on success (provider_kit.reports: Ray's nodes and GPUs, the model, the
    completion's tokens, and with the server's container known its `cold_start`: the start's
    milestones from vLLM's log, `node_programs/cold_start.py`); RemoteError when it printed none."""
    return require_report(
        result, node, default_hint="the probe passed but printed no report: run `pulumi up` again"
    )
