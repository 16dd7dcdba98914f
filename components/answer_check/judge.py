"""The answer check's judgement, by teacher forcing: pure, no I/O (docs/answers.md says the same).

A baseline gives, per prompt, a continuation (token ids) and its logprobs as the baseline computed
them, optionally with its top tokens at each position (`alternatives`). The served model scored that
same continuation (the prompt plus the continuation sent as the prompt, read back through
`prompt_logprobs`). At each position j, with e the baseline's token:
- **drift**: |served logprob of e − baseline logprob of e| > `logprob_tolerance` fails;
- **divergence**: where the served top token t differs from e, the served gap is
  (served logprob of t − served logprob of e) ≥ 0, and the baseline's gap is
  (baseline logprob of e − baseline logprob of t), with the baseline's logprob of t read from its
  alternatives, else bounded above by its least likely listed alternative, else by log(1 − p(e))
  (every other token shares what e leaves). It is a legitimate **near-tie** (passes, recorded) when
  both gaps are at most `tie_logprob`; otherwise it fails: the served model ranks e far lower than the
  baseline did, which is what a broken kernel does.
Three baselines: the reference (`answers.reference`), the last accepted receipt (the previous run's
own teacher-forced scores), and the run's own generation ("self": the decode path's tokens and
logprobs against the prefill path's, which catches a decode-only fault such as a CUDA graph or a
speculative step). Known answers are scored apart (`known_answer_correct`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

# The names of the baselines, in the order they are judged and reported.
REFERENCE, RECEIPT, SELF = "reference", "receipt", "self"
SAID = {
    REFERENCE: "the reference",
    RECEIPT: "the last accepted receipt",
    SELF: "its own generation (decode against prefill)",
}


@dataclass(frozen=True)
class Tolerances:
    """`answers.logprob_tolerance` and `answers.tie_logprob`, in nats."""

    logprob: float
    tie: float


@dataclass(frozen=True)
class Finding:
    """One position judged other than plainly right: a drift or divergence (fails) or a near-tie."""

    prompt: str
    against: str
    position: int
    kind: str  # "drift", "diverged" or "tie"
    expected: int
    served: int
    expected_logprob: float | None
    served_logprob: float
    gap: float  # the served top's logprob minus the served logprob of the expected token
    drift: float | None

    @property
    def fails(self) -> bool:
        return self.kind != "tie"

    def line(self, tolerances: Tolerances, texts: Sequence[str] | None = None) -> str:
        """What the operator reads: the prompt, the position, the tokens and the gap."""
        said = f" ({texts[self.position]!r})" if texts and self.position < len(texts) else ""
        where = f"prompt {self.prompt!r} token {self.position}"
        if self.kind == "drift":
            return (
                f"{where}: the served logprob of token {self.expected}{said} is {self.served_logprob:.3f}, "
                f"{SAID[self.against]} has {self.expected_logprob:.3f}: a drift of {self.drift:.3f} "
                f"(answers.logprob_tolerance {tolerances.logprob:g})"
            )
        return (
            f"{where}: expected token {self.expected}{said}, served token {self.served}; the expected "
            f"token's served logprob is {self.gap:.3f} below the served top's "
            f"({'within' if self.kind == 'tie' else 'beyond'} answers.tie_logprob {tolerances.tie:g}), "
            f"against {SAID[self.against]}"
        )


def runner_up_bound(
    expected: int, expected_lp: float, alternatives: Sequence | None, served_top: int
) -> float:
    """An upper bound on the baseline's logprob of `served_top`: its own figure where listed, else the
    least likely listed alternative's, else log(1 − p(expected))."""
    listed = {int(a[0]): float(a[1]) for a in alternatives or [] if int(a[0]) != expected}
    if served_top in listed:
        return listed[served_top]
    if listed:
        return min(listed.values())
    rest = 1.0 - math.exp(min(expected_lp, 0.0))
    return math.log(rest) if rest > 0 else -math.inf


def judge_position(
    prompt: str,
    against: str,
    position: int,
    expected: tuple[int, float | None, Sequence | None],
    served: tuple[float, int, float],
    tolerances: Tolerances,
) -> Finding | None:
    """One position: `expected` = (token, baseline logprob, baseline alternatives), `served` = (served
    logprob of that token, served top token, its logprob). None when plainly right."""
    token, expected_lp, alternatives = expected
    served_lp, top, top_lp = served
    drift = abs(served_lp - expected_lp) if expected_lp is not None else None
    gap = max(top_lp - served_lp, 0.0)
    kind = None
    if top != token:
        baseline_gap = (
            expected_lp - runner_up_bound(token, expected_lp, alternatives, top)
            if expected_lp is not None
            else 0.0
        )
        kind = "tie" if gap <= tolerances.tie and baseline_gap <= tolerances.tie else "diverged"
    if kind != "diverged" and drift is not None and drift > tolerances.logprob:
        kind = "drift"
    if kind is None:
        return None
    return Finding(
        prompt,
        against,
        position,
        kind,
        token,
        top,
        expected_lp,
        served_lp,
        round(gap, 5),
        None if drift is None else round(drift, 5),
    )


def judge_continuation(
    prompt: str, against: str, baseline: Mapping[str, Any], served: Mapping[str, Any], tolerances: Tolerances
) -> list[Finding]:
    """Every position of a baseline's continuation against the served model's scores of it."""
    tokens = list(baseline.get("tokens") or [])
    logprobs = list(baseline.get("logprobs") or [None] * len(tokens))
    alternatives = list(baseline.get("alternatives") or [None] * len(tokens))
    findings = []
    for at, token in enumerate(tokens):
        expected = (int(token), None if logprobs[at] is None else float(logprobs[at]), alternatives[at])
        scores = (
            float(served["logprobs"][at]),
            int(served["top_ids"][at]),
            float(served["top_logprobs"][at]),
        )
        finding = judge_position(prompt, against, at, expected, scores, tolerances)
        if finding is not None:
            findings.append(finding)
    return findings


def served_scores(receipt: Mapping[str, Any], tokens: Sequence[int]) -> Mapping[str, Any] | None:
    """The receipt's teacher-forced scores of exactly `tokens`, None when it has none."""
    wanted = [int(t) for t in tokens]
    return next((s for s in receipt.get("scored") or [] if [int(t) for t in s["tokens"]] == wanted), None)


def self_baseline(receipt: Mapping[str, Any]) -> dict[str, Any]:
    """The run's own generation as a baseline: the decode path's tokens and logprobs."""
    return {"tokens": receipt.get("generated") or [], "logprobs": receipt.get("generated_logprobs")}


def receipt_baseline(receipt: Mapping[str, Any]) -> dict[str, Any] | None:
    """An accepted receipt as a baseline: its generation with its own teacher-forced scores of it
    (prefill path against prefill path: what two runs compute alike)."""
    scores = served_scores(receipt, receipt.get("generated") or [])
    if scores is None:
        return None
    return {
        "tokens": scores["tokens"],
        "logprobs": scores["logprobs"],
        "alternatives": scores.get("alternatives"),
    }


_WORD = re.compile(r"[A-Za-z0-9]")


def known_answer_correct(text: str, answer: str) -> bool:
    """Whether `answer` is the generated text's answer: it appears, as a whole word and whatever the
    case, in the text's first line that is not blank."""
    first = next((line for line in text.splitlines() if line.strip()), "")
    pattern = rf"(?<![A-Za-z0-9]){re.escape(answer)}(?![A-Za-z0-9])"
    return re.search(pattern, first, re.IGNORECASE) is not None


def scored_answers(receipts: Mapping[str, Mapping[str, Any]], known: Mapping[str, str]) -> dict[str, bool]:
    """Each known answer's prompt: whether the generated text gives it."""
    return {
        pid: known_answer_correct(str((receipts.get(pid) or {}).get("text") or ""), a)
        for pid, a in known.items()
    }


def as_dicts(findings: Sequence[Finding]) -> list[dict[str, Any]]:
    """Findings as the stack output records them."""
    return [asdict(f) for f in findings]
