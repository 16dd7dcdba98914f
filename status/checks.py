"""The rows of what the last `pulumi up` measured and judged after the gate: the serve bench's figures
and the answer check's verdict (`status` sends neither), each with a warning per problem."""

from __future__ import annotations

from typing import Any

from components.answer_check import summary_line as answers_summary
from components.config import StackConfig
from components.serve_bench import figures_line, shortfalls
from status.problem import Problem, first_line, timestamp

BENCH_NEXT = (
    "see docs/bench.md (the likely causes are in the stack output `serve_bench`); `pulumi up` measures "
    "again once the image, the serving flags or a bench key change"
)


def bench_line(config: StackConfig, recorded: dict[str, Any]) -> tuple[str, list[Problem]]:
    """The `bench` row: the figures the last `pulumi up` measured (the stack output `serve_bench`;
    `status` sends no bench of its own), and a warning per figure below a floor set now."""
    output = recorded.get("output")
    if recorded.get("error") or not isinstance(output, dict):
        return f"last figures unknown ({first_line(recorded.get('error') or 'not asked')})", []
    if output.get("mode") == "off" or "figures" not in output:
        return "no figures recorded (the last `pulumi up` ran with bench.mode off)", []
    figures = output.get("figures")
    when = timestamp(output.get("measured_at"), None)
    if not isinstance(figures, dict):
        why = first_line(output.get("error")) if output.get("error") else "nothing measured yet"
        return f"not measured by the last `pulumi up`: {why}", []
    line = f"{figures_line(figures)} (measured by `pulumi up` {when}, not now)"
    if output.get("settings") not in (None, config.bench.settings()):
        line += "; bench settings changed since: the next `up` measures again"
    missed = shortfalls(figures, config.bench.floors())
    return line, [Problem("cluster", f"serve bench: {m}", BENCH_NEXT) for m in missed]


ANSWERS_NEXT = (
    "see docs/answers.md (every finding is in the stack output `answers`); `pulumi up` checks again "
    "once the image, the serving flags, the nodes, the fabric or an answers key change"
)


def answers_line(config: StackConfig, recorded: dict[str, Any]) -> tuple[str, list[Problem]]:
    """The `answers` row: the verdict the last `pulumi up` recorded (the stack output `answers`;
    `status` sends no prompt of its own), and a warning per problem it recorded."""
    output = recorded.get("output")
    if recorded.get("error") or not isinstance(output, dict):
        return f"last verdict unknown ({first_line(recorded.get('error') or 'not asked')})", []
    if output.get("mode") == "off" or "verdict" not in output:
        return "no answers recorded (the last `pulumi up` ran with answers.mode off)", []
    checked = timestamp(output.get("checked_at"), None)
    line = f"{answers_summary(output)} (checked by `pulumi up` {checked}, not now)"
    if output.get("settings") not in (None, config.answers.settings()):
        line += "; answers settings changed since: the next `up` checks again"
    problems = [p for p in output.get("problems") or [] if output.get("verdict") == "fail"]
    return line, [Problem("cluster", f"answer check: {p}", ANSWERS_NEXT) for p in problems]
