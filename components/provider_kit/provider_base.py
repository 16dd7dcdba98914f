"""The one dynamic provider of the node resource packages: each of the engine's calls made of the
package's verbs (`Verbs`), so a package's provider is a subclass of a few lines.

A subclass pins `__module__` to its package (stacks pickle it by reference there) and gives its
`verbs`; it overrides a method only where its package differs, saying why. A pickle names the
subclass alone; loading it imports this module for the base, so keep `NodeResourceProvider` here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import pulumi.dynamic as dynamic

from components.errors import ExplainedErrors
from components.provider_kit.change import Change


@dataclass(frozen=True)
class Verbs:
    """A package's verbs (plan.py's and execute.py's), and how a created resource's ID is made from
    its inputs and outputs. Without `observe` a refresh keeps the recorded state, and without
    `release` a delete does nothing: the SDK's own read and delete."""

    validate: Callable[[Mapping[str, Any]], list[tuple[str, str]]]
    plan_change: Callable[[Mapping[str, Any], Mapping[str, Any]], Change]
    ensure: Callable[..., dict[str, Any]]
    resource_id: Callable[[Mapping[str, Any], Mapping[str, Any]], str]
    observe: Callable[[Mapping[str, Any]], dict[str, Any] | None] | None = None
    release: Callable[[Mapping[str, Any]], None] | None = None


class NodeResourceProvider(ExplainedErrors, dynamic.ResourceProvider):
    """check → validate; diff → plan_change (no I/O); create and update → ensure; read → observe
    (None: gone); delete → release."""

    verbs: ClassVar[Verbs]

    def check(self, _olds: dict[str, Any], news: dict[str, Any]) -> dynamic.CheckResult:
        failures = [dynamic.CheckFailure(key, reason) for key, reason in self.verbs.validate(news)]
        return dynamic.CheckResult(news, failures)

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> dynamic.DiffResult:
        change = self.verbs.plan_change(olds, news)
        return dynamic.DiffResult(
            changes=change.changes,
            replaces=list(change.replaces),
            delete_before_replace=change.delete_before_replace,
        )

    def create(self, props: dict[str, Any]) -> dynamic.CreateResult:
        outs = self.verbs.ensure(props)
        return dynamic.CreateResult(id_=self.verbs.resource_id(props, outs), outs=outs)

    def update(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> dynamic.UpdateResult:
        return dynamic.UpdateResult(outs=self.verbs.ensure(news, olds))

    def read(self, id_: str, props: dict[str, Any]) -> dynamic.ReadResult:
        if self.verbs.observe is None:
            return super().read(id_, props)
        outs = self.verbs.observe(props)
        if outs is None:
            # Gone: refresh drops it from the state, and the next `up` creates it again.
            return dynamic.ReadResult(id_="", outs={})
        return dynamic.ReadResult(id_=id_, outs=outs)

    def delete(self, id_: str, props: dict[str, Any]) -> None:
        if self.verbs.release is None:
            return super().delete(id_, props)
        return self.verbs.release(props)
