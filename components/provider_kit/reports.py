"""A node program run on a node: its exit status and its one JSON report (the last line of its
stdout that is a JSON object), and, when it gave none, an error with the hint its exit status
names. The one reader of node programs' reports: every resource package reads them here."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from components.remote import RemoteError, Result, Transport

# When a program gave no report and its exit status names no hint of its own.
NO_REPORT_HINT = "the node needs python3 (every node program runs on it); its stderr is above"


def last_json_object(text: str) -> dict[str, Any] | None:
    """The last line of `text` that parses as a JSON object (lines before it, such as a program's
    own prints, are passed over); None when there is none."""
    for line in reversed(text.strip().splitlines()):
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return None


def read_report(result: Result) -> dict[str, Any] | None:
    """The report of a program's run (None when it printed none)."""
    return last_json_object(result.text)


def require_report(
    result: Result,
    node: str,
    hints: Mapping[int, str] | None = None,
    default_hint: str = NO_REPORT_HINT,
    accept: Iterable[int] = (0,),
) -> dict[str, Any]:
    """The report of a run that exited with a status in `accept`; otherwise, or when it printed no
    report, a RemoteError naming the node, the command, its stderr and the hint for its status."""
    report = read_report(result) if result.returncode in tuple(accept) else None
    if report is None:
        hint = (hints or {}).get(result.returncode, default_hint)
        raise RemoteError(node, list(result.argv), result.returncode, result.stderr, hint)
    return report


def run_program(
    transport: Transport,
    argv: Sequence[str],
    *,
    timeout: float,
    stdin: bytes | None = None,
    hints: Mapping[int, str] | None = None,
    default_hint: str = NO_REPORT_HINT,
    accept: Iterable[int] = (0,),
) -> tuple[int, dict[str, Any]]:
    """Run a node program: its exit status and report, or RemoteError (require_report)."""
    result = transport.run(list(argv), stdin=stdin, timeout=timeout)
    return result.returncode, require_report(result, transport.name, hints, default_hint, accept)
