"""The NodeImage resource as the Pulumi program declares it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pulumi
import pulumi.dynamic as dynamic

from components.node_image.inputs import clean_node
from components.node_image.provider import NodeImageProvider

OUTPUT_KEYS = (
    "image_id",
    "layers",
    "bytes_sent",
    "layer_bytes_sent",
    "layers_sent",
    "layers_left_out",
    "blobs_listed",
    "skipped",
    "retagged",
    "placed_tag",
    "placed_image_id",
    "holds_tag",
    "claim",
    "verified_image_id",
    "store",
    "engine",
    "source_store",
    "layout",
    "seconds",
    "destination_label",
)
# Resources registered before this type existed were `pulumi-python:dynamic:Resource`.
GENERIC_TYPE = "pulumi-python:dynamic:Resource"


class NodeImage(dynamic.Resource, module="qwen35", name="NodeImage"):
    """`image` present and verified on `destination`, copied from `source` (node dicts).

    `source_image_id`: the image the source holds, as the source's NodeImage observed it (its
    `image_id` output); empty for the head, whose source is itself. `keep_previous`: how many
    replaced images the destination keeps tagged for a rollback (None: the default, 1)."""

    image_id: pulumi.Output[str]
    layers: pulumi.Output[list]
    bytes_sent: pulumi.Output[int]
    skipped: pulumi.Output[bool]
    store: pulumi.Output[str]

    def __init__(
        self,
        name: str,
        image: pulumi.Input[str],
        source: Mapping[str, Any],
        destination: Mapping[str, Any],
        tuning: Mapping[str, Any] | None = None,
        trigger: pulumi.Input[str] | None = None,
        opts: pulumi.ResourceOptions | None = None,
        source_image_id: pulumi.Input[str] | None = None,
        keep_previous: int | None = None,
    ):
        props = {
            "image": image,
            "source": clean_node(source),
            "destination": clean_node(destination),
            "tuning": dict(tuning or {}),
            "trigger": trigger or "",
            "source_image_id": source_image_id or "",
            "keep_previous": keep_previous,
            **{key: None for key in OUTPUT_KEYS},
        }
        # Registered as the generic dynamic type before it had its own (before 2026-11-30, fe8fcd9): not
        # a replacement. A leftover: remove once every stack made before then has run `pulumi up` since.
        aliased = pulumi.ResourceOptions(aliases=[pulumi.Alias(type_=GENERIC_TYPE)])
        super().__init__(NodeImageProvider(), name, props, pulumi.ResourceOptions.merge(opts, aliased))
