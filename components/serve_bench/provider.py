"""The ServeBench dynamic provider: create/update measure (`execute.ensure`); read gives back the
recorded figures (the SDK's read, no I/O); diff never touches a node (`plan.plan_change`)."""

from __future__ import annotations

from typing import Any

import pulumi.dynamic as dynamic

from components.provider_kit.provider_base import NodeResourceProvider, Verbs
from components.serve_bench.execute import ensure
from components.serve_bench.plan import OUTPUT_KEYS, Action, plan_change, update_action, validate


class ServeBenchProvider(NodeResourceProvider):
    """create: measure; update: measure again when what it measures changed, judge the recorded
    figures again when only the floors or mode did; read: the recorded figures; delete: nothing."""

    # Stacks pickle this class by reference to `components.serve_bench.ServeBenchProvider`: keep
    # that its path whatever file it lives in.
    __module__ = "components.serve_bench"
    verbs = Verbs(
        validate,
        plan_change,
        ensure,
        resource_id=lambda props, _outs: f"{props['node']['name']}-bench",
    )

    # Not always `ensure`: a change to neither what it measures nor how it judges is recorded alone.
    def update(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> dynamic.UpdateResult:
        if update_action(olds, news) is Action.RECORD:
            # The new inputs over the recorded figures (the declared outputs come as nulls in news).
            inputs = {key: value for key, value in news.items() if key not in OUTPUT_KEYS}
            return dynamic.UpdateResult(outs={**olds, **inputs})
        # Measure again, or judge the recorded figures again (ensure decides from olds). A failed
        # bench (enforce) leaves the state as it was: the next `up` tries again.
        return dynamic.UpdateResult(outs=ensure(news, olds))
