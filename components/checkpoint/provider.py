"""The Checkpoint dynamic provider: create/read/update/delete carry out `execute`; diff and check
never touch a node (`plan.plan_change` compares inputs with recorded state).

Keep `CheckpointProvider` importable as `components.checkpoint.CheckpointProvider` (where stacks now
pickle it by reference, as every provider is pickled: to its package) and as
`components.checkpoint.provider.CheckpointProvider` (where stacks made before pickled it), with no
import-time side effects. The second is a leftover (it pins this file's name): free it, with its entry
in `EARLIER_PICKLE_PATHS` (tests/unit/test_house.py), once every stack made before 2026-12-06
(7f524e3, the rule of pickling by package) has been destroyed or updated by `pulumi up` since.
"""

from __future__ import annotations

from typing import Any

import pulumi.dynamic as dynamic

from components.checkpoint.execute import ensure, observe, release
from components.checkpoint.plan import plan_change, validate
from components.errors import ExplainedErrors


class CheckpointProvider(ExplainedErrors, dynamic.ResourceProvider):
    """CRUD for Checkpoint; every method but diff/check talks to nodes over SSH."""

    # Stacks pickle this class by reference as `components.checkpoint.CheckpointProvider`: keep that
    # its path whatever file it lives in (and this file's name, which older stacks' pickles hold).
    __module__ = "components.checkpoint"

    def check(self, _olds: dict[str, Any], news: dict[str, Any]) -> dynamic.CheckResult:
        failures = [dynamic.CheckFailure(key, reason) for key, reason in validate(news)]
        return dynamic.CheckResult(news, failures)

    def create(self, props: dict[str, Any]) -> dynamic.CreateResult:
        outs = ensure(props)
        return dynamic.CreateResult(
            id_=f"{outs['node'].get('name')}:{outs['repo']}@{outs['revision']}", outs=outs
        )

    def read(self, id_: str, props: dict[str, Any]) -> dynamic.ReadResult:
        outs = observe(props)
        if outs is None:
            return dynamic.ReadResult("", {})
        return dynamic.ReadResult(id_, outs)

    def diff(self, id_: str, olds: dict[str, Any], news: dict[str, Any]) -> dynamic.DiffResult:
        change = plan_change(olds, news)
        return dynamic.DiffResult(
            changes=change.changes, replaces=list(change.replaces), delete_before_replace=False
        )

    def update(self, id_: str, olds: dict[str, Any], news: dict[str, Any]) -> dynamic.UpdateResult:
        # A node that held everything at the last refresh most likely still does: its source's
        # session is opened only once the inventory shows something missing. (Another manifest is a
        # replacement, never an update.)
        return dynamic.UpdateResult(outs=ensure(news, olds))

    def delete(self, id_: str, props: dict[str, Any]) -> None:
        release(props)
