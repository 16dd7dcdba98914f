"""The dynamic provider: create/read/update/delete carry out `execute`; diff and check never touch a
node (they compare inputs with recorded state; refresh is where the world is observed)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pulumi.dynamic as dynamic

from components.errors import ExplainedErrors
from components.node_image.execute import ensure_image, observe, release_tag
from components.node_image.inputs import clean_node, inputs, keep_previous
from components.nodes import same_address, same_node


def replace_reasons(olds: Mapping[str, Any], news: Mapping[str, Any]) -> list[str]:
    """Inputs whose change needs a new copy: the image, the destination node, the trigger, the source's
    image (the source NodeImage's observed ID), or drift that refresh recorded. Pure: no node I/O."""
    reasons = []
    if olds.get("image") != news.get("image"):
        reasons.append("image")
    old_dst, new_dst = clean_node(olds.get("destination")), clean_node(news.get("destination"))
    # Another node, or the same one's daemon at another address: the image lives in a daemon, and one
    # reached elsewhere holds nothing this copy verified.
    if not same_node(old_dst, new_dst) or not same_address(old_dst, new_dst):
        reasons.append("destination")
    if (olds.get("trigger") or "") != (news.get("trigger") or "") and not legacy_trigger(olds, news):
        reasons.append("trigger")
    if "image" not in reasons and (source_changed(olds, news) or drifted(olds)):
        reasons.append("image")
    return reasons


def legacy_trigger(olds: Mapping[str, Any], news: Mapping[str, Any]) -> bool:
    """The trigger recorded from pulumi_docker.Image, whose ID was the image reference itself (so it
    said nothing `image` does not), now the ImageBuild's image ID of the very image this copy holds:
    recorded in place, not a new copy (docs/image-build.md)."""
    new = news.get("trigger") or ""
    held = {olds.get("image_id"), olds.get("verified_image_id"), olds.get("source_image_id")} - {None, ""}
    return bool(olds.get("trigger")) and olds.get("trigger") == olds.get("image") and new in held


def source_changed(olds: Mapping[str, Any], news: Mapping[str, Any]) -> bool:
    """The source NodeImage now reports another image than the one this copy was made from (an
    unknown value during preview counts as changed: the source is being replaced)."""
    wanted = news.get("source_image_id")
    return bool(wanted) and wanted != olds.get("source_image_id")


def drifted(olds: Mapping[str, Any]) -> bool:
    """A refresh found the destination's tag pointing at another image than the one verified there."""
    verified = olds.get("verified_image_id")
    if not verified and olds.get("store") == olds.get("source_store"):
        verified = olds.get("source_image_id")  # state from before `verified_image_id`
    return bool(verified) and bool(olds.get("image_id")) and olds.get("image_id") != verified


class NodeImageProvider(ExplainedErrors, dynamic.ResourceProvider):
    """Ensures an image is on a node, copying only what is missing from a source node."""

    # Existing stacks pickled this class as `components.node_image.NodeImageProvider` (by reference):
    # keep that its path whatever file it lives in.
    __module__ = "components.node_image"

    def create(self, props: dict[str, Any]) -> dynamic.CreateResult:
        outs = ensure_image(props)
        return dynamic.CreateResult(id_=f"{outs['destination_label']}/{outs['image']}", outs=outs)

    def read(self, id_: str, props: dict[str, Any]) -> dynamic.ReadResult:
        current = observe(props)
        if current is None:
            return dynamic.ReadResult(id_="", outs={})
        return dynamic.ReadResult(id_=id_, outs={**props, **current})

    def diff(self, id_: str, olds: dict[str, Any], news: dict[str, Any]) -> dynamic.DiffResult:
        replaces = replace_reasons(olds, news)
        keys = ("tuning", "source", "destination", "trigger")
        changed = bool(replaces) or any(olds.get(key) != news.get(key) for key in keys)
        # Retention only matters at delete: a new value is recorded in place.
        changed = changed or keep_previous(olds) != keep_previous(news)
        return dynamic.DiffResult(changes=changed, replaces=replaces, delete_before_replace=False)

    def update(self, id_: str, olds: dict[str, Any], news: dict[str, Any]) -> dynamic.UpdateResult:
        # Only tuning, the source node or how the destination is reached changed (anything else
        # replaces): keep what is on the node, remember the new access details for refresh/destroy.
        return dynamic.UpdateResult(
            outs={**olds, **inputs(news), "source_image_id": olds.get("source_image_id")}
        )

    def delete(self, id_: str, props: dict[str, Any]) -> None:
        release_tag(props)
