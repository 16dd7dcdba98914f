"""The ServeBench dynamic provider: create/update measure (`execute.ensure`); read gives back the
recorded figures (`execute.observe`, no I/O); diff never touches a node (`plan.plan_change`)."""

from __future__ import annotations

from typing import Any

import pulumi.dynamic as dynamic

from components.errors import ExplainedErrors
from components.serve_bench.execute import ensure, observe, release
from components.serve_bench.plan import OUTPUT_KEYS, measures_again, plan_change, validate


class ServeBenchProvider(ExplainedErrors, dynamic.ResourceProvider):
    """create: measure; update: measure again when what it measures changed; read: the recorded
    figures; delete: nothing."""

    # Stacks pickle this class by reference to `components.serve_bench.ServeBenchProvider`: keep
    # that its path whatever file it lives in.
    __module__ = "components.serve_bench"

    def check(self, _olds: dict[str, Any], news: dict[str, Any]) -> dynamic.CheckResult:
        failures = [dynamic.CheckFailure(key, reason) for key, reason in validate(news)]
        return dynamic.CheckResult(news, failures)

    def create(self, props: dict[str, Any]) -> dynamic.CreateResult:
        return dynamic.CreateResult(id_=f"{props['node']['name']}-bench", outs=ensure(props))

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> dynamic.DiffResult:
        return dynamic.DiffResult(changes=plan_change(olds, news).changes, replaces=[])

    def update(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> dynamic.UpdateResult:
        if not measures_again(plan_change(olds, news)):
            # The new inputs over the recorded figures (the declared outputs come as nulls in news).
            inputs = {key: value for key, value in news.items() if key not in OUTPUT_KEYS}
            return dynamic.UpdateResult(outs={**olds, **inputs})
        # A failed bench (enforce) leaves the state as it was: the next `up` measures again.
        return dynamic.UpdateResult(outs=ensure(news))

    def read(self, id_: str, props: dict[str, Any]) -> dynamic.ReadResult:
        return dynamic.ReadResult(id_=id_, outs=observe(props))

    def delete(self, _id: str, _props: dict[str, Any]) -> None:
        release(_props)
