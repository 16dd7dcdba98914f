"""`status` output: aligned text tables for people, one JSON document for scripts.

The tables are plain aligned columns written here (a dozen lines) rather than a table library: the
output must stay byte-stable for tests and pipes, and the program needs no dependency for it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from status.verdict import Verdict

NODE_COLUMNS = ("role", "ssh", "docker", "image", "checkpoint", "gpus", "containers")
CLUSTER_ROWS = ("ray", "health", "models", "completion", "concurrency", "watchdog")


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Columns padded to their widest cell, a rule under the header; no trailing spaces."""
    cells = [list(map(str, header))] + [list(map(str, row)) for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)) for row in cells]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(line.rstrip() for line in lines)


def _operation(op: dict[str, Any]) -> list[str]:
    done, total = op.get("bytes_done"), op.get("bytes_total")
    amount = f"{_mb(done)}/{_mb(total)} MB" if isinstance(done, int | float) and total else ""
    rate = f"{_mb(op.get('rate_bps'))} MB/s" if isinstance(op.get("rate_bps"), int | float) else ""
    eta = f"eta {op['eta_s']:.0f} s" if isinstance(op.get("eta_s"), int | float) else ""
    if op.get("alive") and not op.get("stale"):
        state = "running"
    elif op.get("alive"):
        state = f"no update for {op.get('age_s')} s"
    else:
        state = "ended (writer gone)"
    where = op.get("on", "?") + (f" -> {op['peer']}" if op.get("peer") else "")
    progress = " ".join(part for part in (amount, rate, eta) if part)
    return [str(op.get("operation", "?")), where, str(op.get("stage", "")), progress, state]


def _mb(value: Any) -> str:
    return f"{value / 1e6:.1f}" if isinstance(value, int | float) else "?"


def text(verdict: Verdict, stack: str) -> str:
    """The report for people: nodes, cluster, operations in flight, then each problem and its next step."""
    parts = [f"stack {stack}"]
    # The rank column only under executor mp; the fabric column only where FabricCheck is on.
    optional = [c for c in ("rank", "fabric") if any(c in cells for cells in verdict.nodes.values())]
    columns = (*NODE_COLUMNS, *optional)
    parts.append(
        table(
            ("node", *columns),
            [(name, *(cells.get(c, "-") for c in columns)) for name, cells in verdict.nodes.items()],
        )
    )
    # The answers and bench rows only where each is on (the last `up`'s, from the stack outputs); the
    # cold start's where the stack's outputs were read.
    optional_rows = ("node proof", "serving transport", "answers", "bench", "cold start")
    rows = [*CLUSTER_ROWS, *(k for k in optional_rows if k in verdict.cluster)]
    parts.append(table(("cluster", "state"), [(k, verdict.cluster.get(k, "-")) for k in rows]))
    if verdict.retention:
        kept = verdict.retention.get("previous") or {}
        parts.append(
            f"previous images kept (image.keep_previous {verdict.retention.get('keep_previous')}): "
            + "; ".join(f"{node} {', '.join(refs) or '-'}" for node, refs in kept.items())
        )
    if verdict.fabric:
        parts.append(
            "fabric (ports, GID and MTU read now; the last `pulumi up`'s TCP probe: reachability and a "
            "floor on socket throughput, not RDMA):\n"
            + "\n".join(f"  {line}" for line in verdict.fabric.values())
        )
    if verdict.operations:
        header = ("operation", "node", "stage", "progress", "state")
        parts.append(table(header, [_operation(op) for op in verdict.operations]))
    if verdict.warnings:
        parts.append(f"{len(verdict.warnings)} warning(s):\n" + "\n".join(w.line() for w in verdict.warnings))
    if verdict.ok:
        parts.append("everything is as declared")
    else:
        parts.append(f"{len(verdict.problems)} problem(s):\n" + "\n".join(p.line() for p in verdict.problems))
    return "\n\n".join(parts) + "\n"


def as_json(verdict: Verdict, stack: str, facts: dict[str, Any]) -> str:
    """One JSON document: the verdict (cells, problems) and the facts it was drawn from."""
    return json.dumps({"stack": stack, **verdict.as_dict(), "facts": facts}, indent=2, sort_keys=True)
