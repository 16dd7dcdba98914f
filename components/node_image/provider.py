"""The dynamic provider: create/read/update/delete carry out `execute`; diff and check never touch a
node (`plan.plan_change` compares inputs with recorded state; refresh is where the world is observed)."""

from __future__ import annotations

from typing import Any

import pulumi.dynamic as dynamic

from components.errors import ExplainedErrors
from components.node_image.execute import ensure, observe, release
from components.node_image.inputs import inputs
from components.node_image.plan import plan_change, validate


class NodeImageProvider(ExplainedErrors, dynamic.ResourceProvider):
    """Ensures an image is on a node, copying only what is missing from a source node."""

    # Existing stacks pickled this class as `components.node_image.NodeImageProvider` (by reference):
    # keep that its path whatever file it lives in.
    __module__ = "components.node_image"

    def check(self, _olds: dict[str, Any], news: dict[str, Any]) -> dynamic.CheckResult:
        failures = [dynamic.CheckFailure(key, reason) for key, reason in validate(news)]
        return dynamic.CheckResult(news, failures)

    def create(self, props: dict[str, Any]) -> dynamic.CreateResult:
        outs = ensure(props)
        return dynamic.CreateResult(id_=f"{outs['destination_label']}/{outs['image']}", outs=outs)

    def read(self, id_: str, props: dict[str, Any]) -> dynamic.ReadResult:
        current = observe(props)
        if current is None:
            return dynamic.ReadResult(id_="", outs={})
        return dynamic.ReadResult(id_=id_, outs={**props, **current})

    def diff(self, id_: str, olds: dict[str, Any], news: dict[str, Any]) -> dynamic.DiffResult:
        change = plan_change(olds, news)
        return dynamic.DiffResult(
            changes=change.changes, replaces=list(change.replaces), delete_before_replace=False
        )

    def update(self, id_: str, olds: dict[str, Any], news: dict[str, Any]) -> dynamic.UpdateResult:
        # Only tuning, the source node or how the destination is reached changed (anything else
        # replaces): keep what is on the node, remember the new access details for refresh/destroy.
        return dynamic.UpdateResult(
            outs={**olds, **inputs(news), "source_image_id": olds.get("source_image_id")}
        )

    def delete(self, id_: str, props: dict[str, Any]) -> None:
        release(props)
