"""AnswerCheck's pure decisions: what a change is (`plan_change`), whether it checks again and
against what, the continuations the program scores, and the verdict on its report (by
`judge.py`). No I/O: diff() uses these, and the tests are tables.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from components.answer_check.facts import by_id
from components.answer_check.judge import (
    RECEIPT,
    REFERENCE,
    SELF,
    Finding,
    Tolerances,
    as_dicts,
    judge_continuation,
    receipt_baseline,
    scored_answers,
    self_baseline,
    served_scores,
)
from components.answer_check.prompts import known_answers
from components.provider_kit.change import Change
from components.provider_kit.inputs import node_problems

ENFORCE, REPORT = "enforce", "report"
# What the server computes with: a change to any judges the new answers against the last accepted
# receipt too, so an upgrade that changes what the model computes is seen.
SERVER_KEYS = ("image_ids", "server_argv", "nodes", "fabric")
# Inputs whose change means "check again": the server (above), where it listens and what it serves,
# the prompt set, the reference and how the answers are judged.
CHECK_KEYS = ("url", "model", "mode", "settings", "prompt_set", "reference", *SERVER_KEYS)
# Recorded in place without checking: how the head is reached. `api_key` is not compared (a rotated
# key serves the same answers; the next run reads the new one from its inputs).
RECORD_KEYS = ("node",)
UPDATE_KEYS = (*CHECK_KEYS, *RECORD_KEYS)
# The outputs a run records (read back unchanged by refresh).
OUTPUT_KEYS = (
    "receipts",
    "verdict",
    "problems",
    "findings",
    "judged_against",
    "known_answers",
    "accepted",
    "notes",
    "version",
    "checked_at",
    "elapsed_s",
    "error",
)
# Findings kept in the outputs (the first of each prompt and baseline are in `problems` whatever this).
FINDINGS_KEPT = 64


def plan_change(olds: Mapping[str, Any], news: Mapping[str, Any]) -> Change:
    """From recorded state and new inputs, no I/O: an update for each changed input, never a
    replacement (nothing of the check stays on a node)."""
    return Change(replaces=(), updates=tuple(key for key in UPDATE_KEYS if olds.get(key) != news.get(key)))


def checks_again(change: Change) -> bool:
    """Whether an update runs the check again (what it judges changed), or only records the inputs."""
    return change.updates_any(CHECK_KEYS)


def last_accepted(olds: Mapping[str, Any] | None) -> list[dict] | None:
    """The receipts of the last run that passed (a run's own when it passed, else what it carried)."""
    if not olds:
        return None
    if olds.get("verdict") == "pass" and olds.get("receipts"):
        return list(olds["receipts"])
    return list(olds["accepted"]) if olds.get("accepted") else None


def against_receipt(olds: Mapping[str, Any] | None, news: Mapping[str, Any]) -> list[dict] | None:
    """The accepted receipts to judge against: only when the server changed (its image, flags, nodes
    or fabric) and an accepted run is recorded."""
    if not olds or not any(olds.get(key) != news.get(key) for key in SERVER_KEYS):
        return None
    return last_accepted(olds)


def forced(props: Mapping[str, Any], accepted: list[dict] | None) -> dict[str, list[list[int]]]:
    """The continuations the program scores per prompt, besides its own generation: the reference's
    tokens and the accepted receipt's generation."""
    found: dict[str, list[list[int]]] = {}
    for pid, given in ((props.get("reference") or {}).get("prompts") or {}).items():
        found.setdefault(pid, []).append([int(t) for t in given.get("tokens") or []])
    for pid, receipt in by_id(accepted).items():
        found.setdefault(pid, []).append([int(t) for t in receipt.get("generated") or []])
    return {pid: [c for c in conts if c] for pid, conts in found.items()}


def tolerances(settings: Mapping[str, Any]) -> Tolerances:
    """The settings' tolerances."""
    return Tolerances(float(settings["logprob_tolerance"]), float(settings["tie_logprob"]))


def judge_prompt(
    receipt: Mapping[str, Any],
    baselines: Mapping[str, Mapping[str, Any] | None],
    tol: Tolerances,
    notes: list[str],
) -> list[Finding]:
    """One prompt's receipt against each baseline it has (None: that baseline has no entry here)."""
    pid = str(receipt["id"])
    findings: list[Finding] = []
    for against, baseline in baselines.items():
        if baseline is None or not baseline.get("tokens"):
            continue
        served = served_scores(receipt, baseline["tokens"])
        if served is None:
            notes.append(f"prompt {pid!r}: no served scores of {against}'s continuation")
            continue
        findings += judge_continuation(pid, against, baseline, served, tol)
    return findings


def baselines_of(
    receipt: Mapping[str, Any], reference: Mapping[str, Any], accepted: Mapping[str, Any], notes: list[str]
) -> dict[str, Mapping[str, Any] | None]:
    """A prompt's baselines: the reference's entry, the accepted receipt's (where the same prompt was
    sent: its token ids' digest matches), and its own generation."""
    pid = str(receipt["id"])
    before = accepted.get(pid)
    if before is not None and before.get("prompt_digest") != receipt.get("prompt_digest"):
        notes.append(
            f"prompt {pid!r} is tokenized otherwise than in the last accepted receipt: not judged against it"
        )
        before = None
    if reference.get(pid) and receipt.get("tokenizer_agrees") is False:
        notes.append(
            f"prompt {pid!r}: the server tokenizes its text otherwise than the reference's token ids"
        )
    return {
        REFERENCE: reference.get(pid),
        RECEIPT: receipt_baseline(before) if before is not None else None,
        SELF: self_baseline(receipt),
    }


def problem_lines(findings: list[Finding], tol: Tolerances, reference: Mapping[str, Any]) -> list[str]:
    """The first failing position of each prompt and baseline (the first divergent token), and how
    many more failed there."""
    lines = []
    seen: dict[tuple[str, str], int] = {}
    for finding in (f for f in findings if f.fails):
        seen[(finding.prompt, finding.against)] = seen.get((finding.prompt, finding.against), 0) + 1
    for (pid, against), count in seen.items():
        first = next(f for f in findings if f.fails and (f.prompt, f.against) == (pid, against))
        texts = (reference.get(pid) or {}).get("texts") if against == REFERENCE else None
        more = f" (and {count - 1} more position(s) there)" if count > 1 else ""
        lines.append(first.line(tol, texts) + more)
    return lines


def known_answer_outputs(receipts: Mapping[str, Any], settings: Mapping[str, Any]) -> tuple[dict, list[str]]:
    """The known answers scored (`known_answers`), and the problem when fewer than
    `answers.min_correct` are right."""
    known = known_answers()
    answered = scored_answers(receipts, known)
    floor = settings.get("min_correct")
    correct = sum(answered.values())
    output = {"correct": correct, "of": len(known), "min_correct": floor, "answers": answered}
    if floor is None or correct >= int(floor):
        return output, []
    said = {pid: str((receipts.get(pid) or {}).get("text") or "").strip()[:40] for pid in answered}
    wrong = [
        f"{pid} answered {said[pid]!r}, expected {known[pid]!r}"
        for pid, right in answered.items()
        if not right
    ]
    line = (
        f"known answers: {correct} of {len(known)} right, below answers.min_correct {int(floor)}: "
        + "; ".join(wrong)
    )
    return output, [line]


def judged(
    props: Mapping[str, Any],
    report: Mapping[str, Any] | None,
    accepted: list[dict] | None = None,
    error: str | None = None,
) -> dict[str, Any]:
    """The outputs of one run: its receipts judged against each baseline it has (the reference, the
    accepted receipts `accepted`, its own generation) and the known answers. A run that could not
    check (`error`) keeps the last accepted receipts."""
    carried = {"accepted": accepted, "version": (props.get("prompt_set") or {}).get("version")}
    if report is None:
        empty = {"receipts": None, "findings": [], "judged_against": [], "known_answers": None, "notes": []}
        return {**empty, **carried, "verdict": "error", "problems": [error or "not checked"], "error": error,
                "checked_at": None, "elapsed_s": None}  # fmt: skip
    tol = tolerances(props["settings"])
    reference = (props.get("reference") or {}).get("prompts") or {}
    receipts = by_id(report["receipts"])
    before = by_id(accepted)
    notes: list[str] = []
    findings: list[Finding] = []
    against: set[str] = set()
    for receipt in receipts.values():
        baselines = baselines_of(receipt, reference, before, notes)
        against |= {name for name, baseline in baselines.items() if baseline and baseline.get("tokens")}
        findings += judge_prompt(receipt, baselines, tol, notes)
    known, short = known_answer_outputs(receipts, props["settings"])
    problems = problem_lines(findings, tol, reference) + short
    verdict = "fail" if problems else "pass"
    return {
        "receipts": list(report["receipts"]),
        "verdict": verdict,
        "problems": problems,
        "findings": as_dicts(findings[:FINDINGS_KEPT]),
        "judged_against": [name for name in (REFERENCE, RECEIPT, SELF) if name in against],
        "known_answers": known,
        **carried,
        # The run that passed is the next one's baseline; one that failed keeps the last that passed.
        "accepted": None if verdict == "pass" else accepted,
        "notes": notes,
        "checked_at": report.get("checked_at"),
        "elapsed_s": report.get("elapsed_s"),
        "error": None,
    }


def validate(props: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(field, reason) for each input `check` refuses: no I/O; a value not known yet passes."""
    return node_problems(props, "node")
