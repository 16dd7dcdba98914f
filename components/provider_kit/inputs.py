"""Checks of a node resource's inputs that every package shares, for its `plan.validate`: pure, no I/O
(`check` runs them in preview, where a value not known yet passes)."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

# pulumi.runtime.rpc.UNKNOWN: the string that stands for a value not known yet on the wire. Spelled
# here so that reading inputs imports no Pulumi (`status` checks the same inputs); a unit test holds
# it to the SDK's.
UNKNOWN = "04da6b54-80e4-46f7-96ec-b56ff0331ba9"


def known(value: Any) -> bool:
    """Whether `value` is known. The engine's preview sends a not-yet-known input to `check` as an
    `Unknown`; the provider host of the mock-runtime tests sends the UNKNOWN marker string instead."""
    if value is None or value == UNKNOWN:
        return False
    # Where pulumi.output was never imported, no value can be one of its Unknowns.
    output = sys.modules.get("pulumi.output")
    return output is None or not isinstance(value, output.Unknown)


def node_problems(props: Mapping[str, Any], key: str = "node") -> list[tuple[str, str]]:
    """(key, reason) when `props[key]`, a node dict (`NodeAccess.node_dict`), lacks what an SSH
    connection needs: its name, host and pinned host keys."""
    node = props.get(key)
    if not known(node):
        return []
    if not isinstance(node, Mapping) or not all(node.get(field) for field in ("name", "host", "known_hosts")):
        return [(key, "the node's access details (name, host, known_hosts) are required")]
    return []
