"""The claim program's report as values: pure, no I/O."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from components.provider_kit.reports import read_report
from components.remote import Result


def claim_report(result: Result) -> dict[str, Any]:
    """The claim program's report (provider_kit.reports), empty when it printed none."""
    return read_report(result) or {}


def held_as_claimed(report: Mapping[str, Any], props: Mapping[str, Any]) -> bool:
    """Whether a `held` report shows this stack's claim still on the node, with its prefix."""
    record = report.get("record") or {}
    return bool(report.get("held")) and record.get("prefix") == props.get("prefix")
