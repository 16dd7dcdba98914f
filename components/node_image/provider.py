"""The dynamic provider: create/read/update/delete carry out `execute`; diff and check never touch a
node (`plan.plan_change` compares inputs with recorded state; refresh is where the world is observed)."""

from __future__ import annotations

from typing import Any

import pulumi.dynamic as dynamic

from components.node_image.execute import ensure, observe, release
from components.node_image.inputs import inputs
from components.node_image.plan import plan_change, validate
from components.provider_kit.provider_base import NodeResourceProvider, Verbs


class NodeImageProvider(NodeResourceProvider):
    """Ensures an image is on a node, copying only what is missing from a source node."""

    # Existing stacks pickled this class as `components.node_image.NodeImageProvider` (by reference):
    # keep that its path whatever file it lives in.
    __module__ = "components.node_image"
    verbs = Verbs(
        validate,
        plan_change,
        ensure,
        resource_id=lambda _props, outs: f"{outs['destination_label']}/{outs['image']}",
        observe=observe,
        release=release,
    )

    # Not `ensure`: what an update may change never needs the node.
    def update(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> dynamic.UpdateResult:
        # Only tuning, the source node or how the destination is reached changed (anything else
        # replaces): keep what is on the node, remember the new access details for refresh/destroy.
        return dynamic.UpdateResult(
            outs={**olds, **inputs(news), "source_image_id": olds.get("source_image_id")}
        )
