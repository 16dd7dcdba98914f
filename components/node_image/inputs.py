"""A NodeImage's inputs: the image reference, its two nodes (node dicts), tuning."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from components.config import IMAGE_STORES
from components.image_ref import ImageRefError, parse_image_ref
from components.node_image.errors import NodeImageError
from components.nodes import NODE_KEYS
from components.transfer import Endpoint, EndpointError, Tuning, TuningError, tuning_from

STORES = IMAGE_STORES
# image.keep_previous's default (components/config/image.py).
DEFAULT_KEEP_PREVIOUS = 1


@dataclass(frozen=True)
class Node(Endpoint):
    """One node of a NodeImage: a transfer endpoint plus the image store the stack declares for it
    (None: not declared; checked against the daemon)."""

    image_store: str | None = None

    @classmethod
    def from_dict(cls, role: str, raw: Mapping[str, Any], connect_timeout: int = 10) -> Node:
        try:
            fields = Endpoint.fields_from(role, raw, connect_timeout)
        except EndpointError as exc:
            raise NodeImageError(f"NodeImage {exc}") from None
        store = raw.get("image_store") or None
        if store is not None and store not in STORES:
            raise NodeImageError(
                f"NodeImage {role} {fields['label']}: image_store {store!r}: use one of {', '.join(STORES)}"
            )
        return cls(**fields, image_store=store)


def clean_node(raw: Mapping[str, Any] | None) -> dict:
    """The node dict as stored in outputs: NodeDict's keys only, plain values."""
    raw = raw or {}
    return {key: raw.get(key) for key in NODE_KEYS if raw.get(key) is not None}


def inputs(props: Mapping[str, Any]) -> dict[str, Any]:
    """The inputs as state keeps them."""
    return {
        "image": props["image"],
        "source": clean_node(props.get("source")),
        "destination": clean_node(props.get("destination")),
        "tuning": dict(props.get("tuning") or {}),
        "trigger": props.get("trigger") or "",
        "source_image_id": props.get("source_image_id") or "",
        "keep_previous": keep_previous(props),
    }


def keep_previous(props: Mapping[str, Any]) -> int:
    """How many previous images the destination keeps tagged once this one is replaced (state from
    before the setting: the default, 1)."""
    value = props.get("keep_previous")
    return DEFAULT_KEEP_PREVIOUS if value is None else int(value)


def parse(props: Mapping[str, Any]) -> tuple[str, Node, Node, Tuning]:
    """Image reference, source, destination and tuning from the props; bad values fail here, before
    any node is touched, with the field named."""
    image = props.get("image")
    try:
        ref = parse_image_ref(image)
    except ImageRefError as exc:
        raise NodeImageError(f"NodeImage: image {image!r} is not of the form name:tag: {exc}") from None
    # NodeImage places a tag on every node: name:tag exactly (components/image_ref.py).
    if ref.tag is None or ref.digest is not None:
        raise NodeImageError(f"NodeImage: image {image!r} is not of the form name:tag (an explicit tag)")
    try:
        tuning = tuning_from(props.get("tuning"), "NodeImage tuning")
    except TuningError as exc:
        raise NodeImageError(str(exc)) from None
    source = Node.from_dict("source", props.get("source"), tuning.connect_timeout_s)
    destination = Node.from_dict("destination", props.get("destination"), tuning.connect_timeout_s)
    return image, source, destination, tuning
