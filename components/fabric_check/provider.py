"""The FabricCheck dynamic provider: create, update and read run the facts program on the node
(`execute.ensure`, `execute.observe`); check and diff never touch it (`plan` decides from inputs
and recorded outputs).

Keep `FabricCheckProvider` importable as `components.fabric_check.FabricCheckProvider`, with no
import-time side effects: stacks pickle it by reference to that path.
"""

from __future__ import annotations

from typing import Any

import pulumi.dynamic as dynamic

from components.errors import ExplainedErrors
from components.fabric_check.execute import ensure, observe, release
from components.fabric_check.plan import check_id, plan_change, validate


class FabricCheckProvider(ExplainedErrors, dynamic.ResourceProvider):
    """create/update: check the node's fabric; read: the facts again (drift); delete: nothing."""

    # Stacks pickle this class as `components.fabric_check.FabricCheckProvider` (by reference): keep
    # that its path whatever file it lives in.
    __module__ = "components.fabric_check"

    def check(self, _olds: dict[str, Any], news: dict[str, Any]) -> dynamic.CheckResult:
        failures = [dynamic.CheckFailure(key, reason) for key, reason in validate(news)]
        return dynamic.CheckResult(news, failures)

    def create(self, props: dict[str, Any]) -> dynamic.CreateResult:
        return dynamic.CreateResult(id_=check_id(props), outs=ensure(props))

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> dynamic.DiffResult:
        change = plan_change(olds, news)
        return dynamic.DiffResult(changes=change.changes, replaces=list(change.replaces))

    def update(self, _id: str, _olds: dict[str, Any], news: dict[str, Any]) -> dynamic.UpdateResult:
        return dynamic.UpdateResult(outs=ensure(news))

    def read(self, id_: str, props: dict[str, Any]) -> dynamic.ReadResult:
        # Refresh records what the node shows now (a port gone DOWN, a new MTU, a GID index that
        # moved) as changed outputs; it never refuses: the next `up` does (plan_change).
        return dynamic.ReadResult(id_=id_, outs=observe(props))

    def delete(self, _id: str, _props: dict[str, Any]) -> None:
        release(_props)
