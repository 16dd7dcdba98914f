"""One vocabulary for what a check does: every config key whose values are some of enforce, report
and off is a `CheckMode`, found from the models (a new section's own enum fails here)."""

from __future__ import annotations

import typing
from enum import Enum

from pydantic import BaseModel

from components.config import CheckMode, ModelCheckMode, StackConfig

MODES = {"enforce", "report", "off"}
# Keys of that vocabulary that are not CheckMode, each with why.
NOT_CHECK_MODE = {
    # No `off`: every image is proven to load the model; a second enum keeps `off` refused.
    "image.model_check": ModelCheckMode,
}


def enums(annotation: object) -> list[type[Enum]]:
    """The Enum classes an annotation names (`X`, `X | None`)."""
    found = [a for a in typing.get_args(annotation) if isinstance(a, type) and issubclass(a, Enum)]
    return [annotation] if isinstance(annotation, type) and issubclass(annotation, Enum) else found


def mode_keys() -> dict[str, type[Enum]]:
    """`section.key` -> its enum, for every key whose enum's values are some of MODES."""
    keys = {}
    for section, field in StackConfig.model_fields.items():
        model = field.annotation
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            continue
        for key, inner in model.model_fields.items():
            for enum in enums(inner.annotation):
                if {m.value for m in enum} <= MODES:
                    keys[f"{field.alias or section}.{key}"] = enum
    return keys


def test_every_off_report_enforce_key_is_a_check_mode():
    keys = mode_keys()
    assert {k for k, e in keys.items() if e is CheckMode} >= {
        "answers.mode",
        "bench.mode",
        "health.mode",
        "fabric.check",
        "fabric.node_proof",
    }
    assert {k: e for k, e in keys.items() if e is not CheckMode} == NOT_CHECK_MODE


def test_check_mode_lists_its_values_in_the_order_refusals_name_them():
    assert [m.value for m in CheckMode] == ["enforce", "report", "off"]
