"""The StackClaim dynamic provider: create, update, read and delete run the claim program on the node
(`execute`); diff never touches it (`plan` compares inputs with recorded state)."""

from __future__ import annotations

from typing import Any

import pulumi.dynamic as dynamic

from components.errors import ExplainedErrors
from components.stack_claim.execute import ensure, observe, release
from components.stack_claim.plan import plan_change, validate


class StackClaimProvider(ExplainedErrors, dynamic.ResourceProvider):
    """create/update: take the claim (refused on a collision); read: still held?; delete: drop it."""

    # Stacks pickle this class as `components.stack_claim.StackClaimProvider` (by reference): keep that
    # its path whatever file it lives in.
    __module__ = "components.stack_claim"

    def check(self, _olds: dict[str, Any], news: dict[str, Any]) -> dynamic.CheckResult:
        failures = [dynamic.CheckFailure(key, reason) for key, reason in validate(news)]
        return dynamic.CheckResult(news, failures)

    def create(self, props: dict[str, Any]) -> dynamic.CreateResult:
        ensure(props)
        return dynamic.CreateResult(id_=f"{props['node']['name']}/{props['owner']}", outs=props)

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> dynamic.DiffResult:
        # Never a replacement: a new claim created before the old one's delete would be dropped by it.
        return dynamic.DiffResult(changes=plan_change(olds, news).changes, replaces=[])

    def update(self, _id: str, _olds: dict[str, Any], news: dict[str, Any]) -> dynamic.UpdateResult:
        ensure(news)
        return dynamic.UpdateResult(outs=news)

    def read(self, id_: str, props: dict[str, Any]) -> dynamic.ReadResult:
        if observe(props) is None:
            return dynamic.ReadResult(id_="", outs={})
        return dynamic.ReadResult(id_=id_, outs=props)

    def delete(self, _id: str, props: dict[str, Any]) -> None:
        release(props)
