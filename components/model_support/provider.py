"""The ModelSupportCheck dynamic provider: create runs the check (`execute.ensure`), and update the
argument proof again when a command line changed (the same `ensure`, from the recorded outputs);
check, diff, read and delete never touch the head (`plan.py` decides from inputs and recorded outputs).

Keep `ModelSupportCheckProvider` importable as `components.model_support.ModelSupportCheckProvider`,
with no import-time side effects: stacks pickle it by reference to that path.
"""

from __future__ import annotations

from typing import Any

import pulumi.dynamic as dynamic

from components.errors import ExplainedErrors
from components.model_support.errors import ModelSupportError
from components.model_support.execute import ensure, observe, release
from components.model_support.plan import (
    check_id,
    plan_change,
    recorded_refusal,
    validate,
)


class ModelSupportCheckProvider(ExplainedErrors, dynamic.ResourceProvider):
    """create: run the check; diff: compare inputs only; read: the recorded proof; delete: nothing."""

    # Existing stacks pickled this class as `components.model_support.ModelSupportCheckProvider` (by
    # reference): keep that its path whatever file it lives in.
    __module__ = "components.model_support"

    def check(self, _olds: dict[str, Any], news: dict[str, Any]) -> dynamic.CheckResult:
        failures = [dynamic.CheckFailure(key, reason) for key, reason in validate(news)]
        return dynamic.CheckResult(news, failures)

    def create(self, props: dict[str, Any]) -> dynamic.CreateResult:
        return dynamic.CreateResult(id_=check_id(props), outs={**props, **ensure(props)})

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> dynamic.DiffResult:
        change = plan_change(olds, news)
        return dynamic.DiffResult(
            changes=change.changes,
            replaces=list(change.replaces),
            delete_before_replace=change.delete_before_replace,
        )

    def update(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> dynamic.UpdateResult:
        refusal = recorded_refusal(olds, news)
        if refusal:
            raise ModelSupportError(refusal)
        return dynamic.UpdateResult(outs={**news, **ensure(news, olds)})

    def read(self, id_: str, props: dict[str, Any]) -> dynamic.ReadResult:
        return dynamic.ReadResult(id_=id_, outs=observe(props))

    def delete(self, _id: str, _props: dict[str, Any]) -> None:
        release(_props)
