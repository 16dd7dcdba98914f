"""The bench program's report as values: pure, no I/O."""

from __future__ import annotations

from typing import Any

from components.provider_kit.reports import last_json_object

# The figures a report carries, and their units (for lines people read).
FIGURE_KEYS = ("decode_tps", "ttft_s", "prefill_tps", "aggregate_tps")


def parse_report(stdout: str) -> dict[str, Any]:
    """The bench's report (its last JSON line): `figures`, `nccl_network`, `elapsed_s`, `measured_at`;
    a ValueError when there is none or it has no figures."""
    report = last_json_object(stdout)
    if report is None or not isinstance(report.get("figures"), dict):
        raise ValueError(f"the serve bench printed no report: {stdout.strip()[-200:]!r}")
    return report


# Said beside a figure whose tokens were counted from chunks (the server sent no usage): under MTP a
# chunk carries several tokens, so decode and aggregate are low by that factor.
CHUNKS_COUNTED = "tokens counted from chunks, not the server's usage (low under MTP)"


def figures_line(figures: dict[str, Any] | None) -> str:
    """`decode 19.8 tok/s (TTFT 0.41 s), prefill 862 tok/s (2048 tokens), 4 streams 61.2 tok/s`."""
    if not figures:
        return "not measured"

    def number(key: str, unit: str, digits: int = 1) -> str:
        value = figures.get(key)
        return f"{value:.{digits}f} {unit}" if isinstance(value, int | float) else f"? {unit}"

    def count(key: str) -> str:
        # (a dynamic resource's numbers come back from the state as floats: 4.0 must read "4")
        value = figures.get(key)
        return str(int(value)) if isinstance(value, int | float) else "?"

    line = (
        f"decode {number('decode_tps', 'tok/s')} (TTFT {number('ttft_s', 's', 2)}), "
        f"prefill {number('prefill_tps', 'tok/s', 0)} ({count('prompt_tokens')} tokens), "
        f"{count('concurrency')} streams {number('aggregate_tps', 'tok/s')}"
    )
    return line + (f"; {CHUNKS_COUNTED}" if figures.get("counted") == "chunks" else "")
