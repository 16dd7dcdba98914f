"""The `bench` section: the served speed measured after the readiness gate (components/serve_bench)."""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator, model_validator

from components.config.fields import CheckMode, _CrossFieldErrors, _Model

# The floors, each a figure of the bench's report: `min_*` are tokens/s, `max_ttft_s` seconds.
FLOOR_KEYS = ("min_decode_tps", "min_prefill_tps", "min_aggregate_tps", "max_ttft_s")


class BenchConfig(_Model):
    """How ServeBench measures the served speed, and the floors it holds it to (docs/bench.md)."""

    # report by default: a bench costs about a minute on two Sparks, and only when what it measures
    # changed (image, serving flags, nodes, these settings); floors depend on the hardware, so
    # enforce is the operator's choice. What ServeBench does after the readiness gate: enforce:
    # measure, and fail `up` when a figure is below its floor (or nothing could be measured); report:
    # measure and record the figures in the stack output `serve_bench`, a floor missed is a warning;
    # off: no bench.
    mode: CheckMode = CheckMode.REPORT
    # The decode stream: this many tokens generated (ignore_eos) after a short prompt.
    output_tokens: int = Field(default=256, ge=16, le=8192)
    # The prefill request: a prompt of about this many tokens, one token generated.
    prompt_tokens: int = Field(default=2048, ge=16, le=131072)
    # Parallel streams of output_tokens each (aggregate tokens/s).
    concurrency: int = Field(default=4, ge=1, le=64)
    # The whole bench's deadline on the head; each request ends by it.
    deadline_s: float = Field(default=600, ge=10, le=3600)
    min_decode_tps: float | None = Field(default=None, gt=0)
    min_prefill_tps: float | None = Field(default=None, gt=0)
    min_aggregate_tps: float | None = Field(default=None, gt=0)
    max_ttft_s: float | None = Field(default=None, gt=0)

    @field_validator("mode", mode="before")
    @classmethod
    def _mode_off(cls, v: Any) -> Any:
        # YAML 1.1 (Pulumi's stack files) reads an unquoted `off` as false.
        return "off" if v is False else v

    @model_validator(mode="after")
    def _keys(self) -> BenchConfig:
        problems = []
        if self.mode is CheckMode.OFF:
            problems += [
                (f"bench.{key}", "is not read with bench.mode off (no bench runs): remove it, or set "
                 "bench.mode to report or enforce")
                for key in sorted(self.model_fields_set - {"mode"})
            ]  # fmt: skip
        elif self.mode is CheckMode.ENFORCE and not self.floors():
            problems.append(
                ("bench.mode", "enforce holds the figures to floors and none is set: set at least one of "
                 f"bench.{', bench.'.join(FLOOR_KEYS)}, or use report")
            )  # fmt: skip
        if problems:
            raise _CrossFieldErrors(problems)
        return self

    def floors(self) -> dict[str, float]:
        """The floors set, by key."""
        return {key: getattr(self, key) for key in FLOOR_KEYS if getattr(self, key) is not None}

    def settings(self) -> dict[str, Any]:
        """What the bench sends (a change runs it again)."""
        return {
            "output_tokens": self.output_tokens,
            "prompt_tokens": self.prompt_tokens,
            "concurrency": self.concurrency,
            "deadline_s": self.deadline_s,
        }
