"""The `answers` section: the served answers checked after the readiness gate (components/answer_check)."""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator, model_validator

from components.config.fields import CheckMode, _CrossFieldErrors, _Model

# How many known answers the prompt set scores (components/answer_check/prompts.py, `known_answers`;
# a unit test holds the two equal): `min_correct` above it could never pass.
KNOWN_ANSWERS = 5


class AnswersConfig(_Model):
    """How AnswerCheck records and judges the served answers (docs/answers.md)."""

    # report by default, as the bench: a check costs a few seconds and a few dozen requests, only
    # when what it judges changed; whether a drift stops a deploy is the operator's choice. What
    # AnswerCheck does after the readiness gate: enforce: check, and fail `up` when an answer is
    # refused (or the check could not run); report: check and record the receipts and the verdict in
    # the stack output `answers`, a refusal is a warning; off: no check.
    mode: CheckMode = CheckMode.REPORT
    # A file of token ids and logprobs per prompt, computed by another implementation (docs/answers.md
    # gives its format), relative to the project's directory; none: judged against the last accepted
    # receipt and the server's own generation only.
    reference: str | None = Field(default=None, min_length=1)
    # The known answers (a real model's: capitals, sums) that must be right; none: scored, not held.
    min_correct: int | None = Field(default=None, ge=1)
    # A token's served logprob may differ from its baseline's by this much (nats).
    logprob_tolerance: float = Field(default=1.0, gt=0, le=20)
    # Where the served top token differs from the baseline's, a gap within this (nats) on both sides
    # is a legitimate near-tie; a wider one fails.
    tie_logprob: float = Field(default=0.5, ge=0, le=10)
    # Tokens generated per prompt.
    max_tokens: int = Field(default=16, ge=1, le=256)
    # Top tokens read at each teacher-forced position (vLLM's max_logprobs is 20 by default).
    top: int = Field(default=5, ge=2, le=20)
    # The long prompt's size, in about as many tokens.
    long_prompt_tokens: int = Field(default=4096, ge=64, le=131072)
    # The whole check's deadline on the head, and one request's.
    deadline_s: float = Field(default=300, ge=10, le=3600)
    request_timeout_s: float = Field(default=120, ge=5, le=3600)

    @field_validator("mode", mode="before")
    @classmethod
    def _mode_off(cls, v: Any) -> Any:
        # YAML 1.1 (Pulumi's stack files) reads an unquoted `off` as false.
        return "off" if v is False else v

    @model_validator(mode="after")
    def _keys(self) -> AnswersConfig:
        problems = []
        if self.mode is CheckMode.OFF:
            problems += [
                (f"answers.{key}", "is not read with answers.mode off (no check runs): remove it, or set "
                 "answers.mode to report or enforce")
                for key in sorted(self.model_fields_set - {"mode"})
            ]  # fmt: skip
        if self.min_correct is not None and self.min_correct > KNOWN_ANSWERS:
            problems.append(
                ("answers.min_correct", f"the prompt set scores {KNOWN_ANSWERS} known answers: give at most "
                 f"{KNOWN_ANSWERS}")
            )  # fmt: skip
        if self.request_timeout_s > self.deadline_s:
            problems.append(
                ("answers.request_timeout_s", f"{self.request_timeout_s:g} s is longer than "
                 f"answers.deadline_s {self.deadline_s:g} s: lower it")
            )  # fmt: skip
        if problems:
            raise _CrossFieldErrors(problems)
        return self

    def settings(self) -> dict[str, Any]:
        """What the check sends and how it judges (a change checks again)."""
        return {
            "max_tokens": self.max_tokens,
            "top": self.top,
            "long_prompt_tokens": self.long_prompt_tokens,
            "deadline_s": self.deadline_s,
            "request_timeout_s": self.request_timeout_s,
            "logprob_tolerance": self.logprob_tolerance,
            "tie_logprob": self.tie_logprob,
            "min_correct": self.min_correct,
        }
