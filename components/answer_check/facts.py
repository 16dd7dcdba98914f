"""The answer check program's report as values: pure, no I/O."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from components.provider_kit.reports import last_json_object

# What every receipt carries (components/node_programs/answer_check.py, `receipt`).
RECEIPT_KEYS = (
    "id",
    "prompt_tokens",
    "prompt_digest",
    "prompt_nll",
    "generated",
    "generated_logprobs",
    "scored",
)


def parse_report(stdout: str) -> dict[str, Any]:
    """The program's report (its last JSON line): `version`, `receipts`, `elapsed_s`, `checked_at`;
    a ValueError when there is none or a receipt lacks what judging reads."""
    report = last_json_object(stdout)
    if report is None or not isinstance(report.get("receipts"), list):
        raise ValueError(f"the answer check printed no report: {stdout.strip()[-200:]!r}")
    for receipt in report["receipts"]:
        missing = [key for key in RECEIPT_KEYS if key not in (receipt or {})]
        if missing:
            raise ValueError(f"the answer check's receipt {receipt.get('id')!r} lacks {', '.join(missing)}")
    return report


def by_id(receipts: list[Mapping[str, Any]] | None) -> dict[str, Mapping[str, Any]]:
    """Receipts by prompt id."""
    return {str(r["id"]): r for r in receipts or [] if isinstance(r, Mapping) and "id" in r}


def summary_line(outputs: Mapping[str, Any] | None) -> str:
    """`pass: 9 prompts against the reference and its own generation; known answers 5 of 5 (min 4); 1
    near-tie`, from the resource's outputs."""
    if not outputs or outputs.get("verdict") in (None, "error"):
        error = (outputs or {}).get("error")
        return f"not checked ({str(error).splitlines()[0]})" if error else "not checked"
    receipts = outputs.get("receipts") or []
    against = " and ".join(outputs.get("judged_against") or []) or "nothing"
    line = f"{outputs['verdict']}: {len(receipts)} prompts against {against}"
    known = outputs.get("known_answers") or {}
    if known.get("of"):
        floor = known.get("min_correct")
        said = f" (answers.min_correct {int(floor)})" if floor is not None else ""
        line += f"; known answers {int(known.get('correct') or 0)} of {int(known['of'])}{said}"
    ties = [f for f in outputs.get("findings") or [] if f.get("kind") == "tie"]
    if ties:
        line += f"; {len(ties)} near-tie(s)"
    return line
