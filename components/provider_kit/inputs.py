"""Checks of a node resource's inputs that every package shares, for its `plan.validate`: pure, no I/O
(`check` runs them in preview, where a value not known yet passes)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pulumi.output import Unknown
from pulumi.runtime.rpc import UNKNOWN


def known(value: Any) -> bool:
    """Whether `value` is known. The engine's preview sends a not-yet-known input to `check` as an
    `Unknown`; the provider host of the mock-runtime tests sends the UNKNOWN marker string instead."""
    return value is not None and value != UNKNOWN and not isinstance(value, Unknown)


def node_problems(props: Mapping[str, Any], key: str = "node") -> list[tuple[str, str]]:
    """(key, reason) when `props[key]`, a node dict (`NodeAccess.node_dict`), lacks what an SSH
    connection needs: its name, host and pinned host keys."""
    node = props.get(key)
    if not known(node):
        return []
    if not isinstance(node, Mapping) or not all(node.get(field) for field in ("name", "host", "known_hosts")):
        return [(key, "the node's access details (name, host, known_hosts) are required")]
    return []
