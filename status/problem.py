"""A Problem (one way the cluster differs from its declaration, and the next step), and the phrasings
every judge of `status` shares: a reason's first line, a short image ID, a time and a duration."""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Any

OK = "ok"


@dataclass(frozen=True)
class Problem:
    """One way the cluster differs from its declaration, and what to do about it."""

    node: str
    what: str
    next: str

    def line(self) -> str:
        return f"{self.node}: {self.what}\n  next: {self.next}"


def first_line(text: Any) -> str:
    lines = str(text or "").strip().splitlines()
    return lines[0] if lines else "no reason given"


def short_id(image_id: str) -> str:
    return image_id.removeprefix("sha256:")[:12]


def timestamp(at: Any, now: Any) -> str:
    """`2026-12-02 01:23 UTC (12m05s ago)`: a watchdog's timestamp for a person."""
    if not isinstance(at, int | float):
        return "at an unknown time"
    text = datetime.datetime.fromtimestamp(at, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return f"{text} ({duration(now - at)} ago)" if isinstance(now, int | float) and now >= at else text


def duration(seconds: Any) -> str:
    """`45s`, `12m05s`, `3h07m`, `2d04h`: an uptime at a glance."""
    if not isinstance(seconds, int | float):
        return "?"
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"
