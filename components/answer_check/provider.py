"""The AnswerCheck dynamic provider: create/update check (`execute.ensure`); read gives back the
recorded answers (the SDK's read, no I/O); diff never touches a node (`plan.plan_change`)."""

from __future__ import annotations

from typing import Any

import pulumi.dynamic as dynamic

from components.answer_check.execute import ensure
from components.answer_check.plan import OUTPUT_KEYS, checks_again, plan_change, validate
from components.provider_kit.provider_base import NodeResourceProvider, Verbs


class AnswerCheckProvider(NodeResourceProvider):
    """create: check; update: check again when what it judges changed; read: the recorded answers;
    delete: nothing."""

    # Stacks pickle this class by reference to `components.answer_check.AnswerCheckProvider`: keep
    # that its path whatever file it lives in.
    __module__ = "components.answer_check"
    verbs = Verbs(
        validate,
        plan_change,
        ensure,
        resource_id=lambda props, _outs: f"{props['node']['name']}-answers",
    )

    # Not always `ensure`: only a change to what it judges checks again.
    def update(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> dynamic.UpdateResult:
        if not checks_again(plan_change(olds, news)):
            # The new inputs over the recorded answers (the declared outputs come as nulls in news).
            inputs = {key: value for key, value in news.items() if key not in OUTPUT_KEYS}
            return dynamic.UpdateResult(outs={**olds, **inputs})
        # A refused check (enforce) leaves the state as it was: the next `up` checks again, against
        # the same last accepted receipt.
        return dynamic.UpdateResult(outs=ensure(news, olds))
