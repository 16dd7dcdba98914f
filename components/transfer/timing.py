"""Where one operation spends its time: wall-clock spans of its phases, printed when asked."""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

TIMING_ENV = "QWEN35_NODE_IMAGE_TIMING"


class PhaseTimes:
    """Wall-clock spans of one operation's phases (threads included); printed when TIMING_ENV is set.

    Figures for people tuning a copy, never asserted: the lab's timings vary with the machine.
    """

    def __init__(self, label: str = ""):
        self.label = label
        self.started = time.monotonic()
        self.spans: list[tuple[str, float, float]] = []

    @contextlib.contextmanager
    def span(self, name: str) -> Iterator[None]:
        begin = time.monotonic()
        try:
            yield
        finally:
            self.spans.append((name, begin - self.started, time.monotonic() - self.started))

    def timed(self, name: str, call: Callable[..., Any]) -> Callable[..., Any]:
        """`call`, recording its span (for work handed to a thread pool)."""

        def run(*args, **kwargs):
            with self.span(name):
                return call(*args, **kwargs)

        return run

    def mark(self, name: str, at: float) -> None:
        """An instant seen elsewhere (time.monotonic() value), e.g. a line from the remote pipeline."""
        self.spans.append((name, at - self.started, at - self.started))

    def table(self) -> str:
        total = time.monotonic() - self.started
        lines = [
            f"timing {self.label}: {total:.3f} s",
            f"  {'phase':<34} {'start':>7} {'end':>7} {'s':>7}",
        ]
        for name, begin, end in sorted(self.spans, key=lambda span: (span[1], span[2])):
            lines.append(f"  {name:<34} {begin:7.3f} {end:7.3f} {end - begin:7.3f}")
        return "\n".join(lines)

    def report(self) -> None:
        if os.environ.get(TIMING_ENV):
            print(self.table(), file=sys.stderr, flush=True)
