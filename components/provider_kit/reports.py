"""A node program's report: the last line of its stdout that is a JSON object."""

from __future__ import annotations

import json
from typing import Any


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
