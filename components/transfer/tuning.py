"""Copy tuning: the one definition is `components.config.CopyConfig` (stack config `qwen35-spark:copy`);
a resource's `tuning` input is that model's non-default fields, validated again here in the provider."""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from components.config import CopyConfig
from components.errors import Qwen35Error

Tuning = CopyConfig
GIB = 1 << 30


class TuningError(Qwen35Error, ValueError):
    """A `tuning` input that cannot be used; the message names every bad key."""


def tuning_from(raw: Mapping[str, Any] | None, what: str = "tuning") -> CopyConfig:
    """Validate a `tuning` input into a CopyConfig, naming bad keys (with a "did you mean") and values."""
    try:
        return CopyConfig.model_validate(dict(raw or {}))
    except ValidationError as exc:
        known = list(CopyConfig.model_fields)
        problems = []
        for err in exc.errors():
            key = ".".join(str(part) for part in err["loc"])
            if err["type"] == "extra_forbidden":
                close = difflib.get_close_matches(key, known, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else f" (known: {', '.join(known)})"
                problems.append(f"unknown key {key!r}{hint}")
            else:
                problems.append(f"{key}: {err['msg'].removeprefix('Value error, ')}")
        raise TuningError(f"{what}: " + "; ".join(problems)) from None
