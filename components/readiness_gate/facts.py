"""The probe's report as a value: pure, no I/O."""

from __future__ import annotations

import json
from typing import Any


def parse_report(stdout: str) -> dict[str, Any]:
    """The probe's report on success: the last line of its stdout (a JSON object: Ray's nodes and GPUs,
    the model, the completion's tokens, and with the server's container known its `cold_start`: the
    start's milestones from vLLM's log, `node_programs/cold_start.py`)."""
    return json.loads(stdout.strip().splitlines()[-1])
