"""The claim program's report as values: pure, no I/O."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any


def parse_report(stdout: str) -> dict[str, Any]:
    """The program's report: the last line of its stdout (a JSON object), empty when it printed none."""
    lines = stdout.strip().splitlines()
    return json.loads(lines[-1]) if lines else {}


def held_as_claimed(report: Mapping[str, Any], props: Mapping[str, Any]) -> bool:
    """Whether a `held` report shows this stack's claim still on the node, with its prefix."""
    record = report.get("record") or {}
    return bool(report.get("held")) and record.get("prefix") == props.get("prefix")
