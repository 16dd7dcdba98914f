"""Progress for the operator during `pulumi up`: lines on a dynamic provider's stderr.

The engine reads a Python dynamic provider's stderr line by line and shows each line at once as an
info diagnostic on the stack's row, with no resource attached (pulumi/pulumi
pkg/resource/plugin/plugin.go, `newPlugin`'s `runtrace`; docs/status.md "Progress during `pulumi up`").
So each line names what it is about and where; `status` shows the same operations from their progress files.
"""

from __future__ import annotations

import sys
from typing import TextIO

# Long operations say where they are at most this often (and the readiness wait on each new stage).
SAY_EVERY_S = 30.0


def tell_operator(line: str, stream: TextIO | None = None) -> None:
    """One line the operator sees live during `pulumi up`."""
    print(f"qwen35: {line}", file=stream or sys.stderr, flush=True)


def transfer_line(
    operation: str, source: str, destination: str, done: int, total: int, elapsed: float
) -> str:
    """`image-copy node-a -> node-b: 1200 of 20000 MB (6%), 640 MB/s, ETA 29 s` (the parts known)."""
    rate = done / elapsed if elapsed > 0 else 0.0
    amount = (
        f"{done / 1e6:.0f} of {total / 1e6:.0f} MB ({100 * done / total:.0f}%)"
        if total
        else f"{done / 1e6:.0f} MB"
    )
    parts = [amount, f"{rate / 1e6:.0f} MB/s"]
    if total and rate > 0 and done < total:
        parts.append(f"ETA {(total - done) / rate:.0f} s")
    return f"{operation} {source} -> {destination}: " + ", ".join(parts)
