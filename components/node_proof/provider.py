"""The NodeProof dynamic provider: create/update prove (`execute.ensure`); read gives back what was
proved (no I/O); check and diff never touch a node (`plan`)."""

from __future__ import annotations

from typing import Any

import pulumi.dynamic as dynamic

from components.errors import ExplainedErrors
from components.node_proof.execute import ensure, observe, release
from components.node_proof.plan import plan_change, validate


class NodeProofProvider(ExplainedErrors, dynamic.ResourceProvider):
    """create and update: prove on every node; read: the recorded proof; delete: nothing."""

    # Stacks pickle this class by reference to `components.node_proof.NodeProofProvider`: keep that
    # its path whatever file it lives in.
    __module__ = "components.node_proof"

    def check(self, _olds: dict[str, Any], news: dict[str, Any]) -> dynamic.CheckResult:
        failures = [dynamic.CheckFailure(key, reason) for key, reason in validate(news)]
        return dynamic.CheckResult(news, failures)

    def create(self, props: dict[str, Any]) -> dynamic.CreateResult:
        return dynamic.CreateResult(id_=f"{props['container_prefix']}-node-proof", outs=ensure(props))

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> dynamic.DiffResult:
        return dynamic.DiffResult(changes=plan_change(olds, news).changes, replaces=[])

    def update(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> dynamic.UpdateResult:
        return dynamic.UpdateResult(outs=ensure(news, olds))

    def read(self, id_: str, props: dict[str, Any]) -> dynamic.ReadResult:
        return dynamic.ReadResult(id_=id_, outs=observe(props))

    def delete(self, _id: str, _props: dict[str, Any]) -> None:
        release(_props)
