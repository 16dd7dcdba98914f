"""The AnswerCheck dynamic provider: create/update check (`execute.ensure`); read gives back the
recorded answers (`execute.observe`, no I/O); diff never touches a node (`plan.plan_change`)."""

from __future__ import annotations

from typing import Any

import pulumi.dynamic as dynamic

from components.answer_check.execute import ensure, observe, release
from components.answer_check.plan import OUTPUT_KEYS, checks_again, plan_change, validate
from components.errors import ExplainedErrors


class AnswerCheckProvider(ExplainedErrors, dynamic.ResourceProvider):
    """create: check; update: check again when what it judges changed; read: the recorded answers;
    delete: nothing."""

    # Stacks pickle this class by reference to `components.answer_check.AnswerCheckProvider`: keep
    # that its path whatever file it lives in.
    __module__ = "components.answer_check"

    def check(self, _olds: dict[str, Any], news: dict[str, Any]) -> dynamic.CheckResult:
        failures = [dynamic.CheckFailure(key, reason) for key, reason in validate(news)]
        return dynamic.CheckResult(news, failures)

    def create(self, props: dict[str, Any]) -> dynamic.CreateResult:
        return dynamic.CreateResult(id_=f"{props['node']['name']}-answers", outs=ensure(props))

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> dynamic.DiffResult:
        return dynamic.DiffResult(changes=plan_change(olds, news).changes, replaces=[])

    def update(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> dynamic.UpdateResult:
        if not checks_again(plan_change(olds, news)):
            # The new inputs over the recorded answers (the declared outputs come as nulls in news).
            inputs = {key: value for key, value in news.items() if key not in OUTPUT_KEYS}
            return dynamic.UpdateResult(outs={**olds, **inputs})
        # A refused check (enforce) leaves the state as it was: the next `up` checks again, against
        # the same last accepted receipt.
        return dynamic.UpdateResult(outs=ensure(news, olds))

    def read(self, id_: str, props: dict[str, Any]) -> dynamic.ReadResult:
        return dynamic.ReadResult(id_=id_, outs=observe(props))

    def delete(self, _id: str, _props: dict[str, Any]) -> None:
        release(_props)
