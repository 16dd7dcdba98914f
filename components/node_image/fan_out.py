"""One NodeImage per node, copied along `fan_out_tree`'s tree from the head."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import Any

import pulumi

from components.node_image import resource
from components.node_image.errors import NodeImageError
from components.provider_kit.fan_out_tree import fan_out_tree


def copy_tree(
    name: str,
    image: pulumi.Input[str],
    accesses: Mapping[str, Any],
    head: str,
    opts: pulumi.ResourceOptions | None = None,
    can_reexport: Callable[[str], bool] | Collection[str] | None = None,
    tuning: Mapping[str, Any] | None = None,
    trigger: pulumi.Input[str] | None = None,
    keep_previous: int | None = None,
) -> dict[str, resource.NodeImage]:
    """One NodeImage per node, sources arranged as a tree (`fan_out_tree`); node name -> NodeImage.

    `accesses`: node name -> NodeAccess (or its `node_dict()`); `head` holds the image already.
    Each copy depends on the NodeImage of its source and takes the image that one observed as an
    input, so a node serves only once it has the image, and a source whose image changed (seen by a
    refresh) replaces the copies made from it.
    """
    nodes = {
        key: (value.node_dict() if hasattr(value, "node_dict") else dict(value))
        for key, value in accesses.items()
    }
    if head not in nodes:
        raise NodeImageError(f"copy_tree: head {head!r} is not among the nodes {sorted(nodes)}")
    opts = opts or pulumi.ResourceOptions()
    made: dict[str, resource.NodeImage] = {
        head: resource.NodeImage(
            f"{name}-{head}",
            image,
            nodes[head],
            nodes[head],
            tuning,
            trigger,
            opts,
            keep_previous=keep_previous,
        )
    }
    workers = [node for node in nodes if node != head]
    for round_ in fan_out_tree(head, workers, can_reexport):
        for src, dst in round_:
            child = pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(depends_on=[made[src]]))
            made[dst] = resource.NodeImage(
                f"{name}-{dst}",
                image,
                nodes[src],
                nodes[dst],
                tuning,
                trigger,
                child,
                source_image_id=made[src].image_id,
                keep_previous=keep_previous,
            )
    return made
