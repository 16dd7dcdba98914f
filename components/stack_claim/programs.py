"""The claim program (`components/node_programs/stack_claim.py`) as a node runs it.

It travels in its command line (`program_argv`); building the argv touches no node.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from components.node_programs import program_argv

# What the program does: take the claim (refused on a collision), say whether it is held, drop it.
MODES = ("take", "held", "drop")


def claim_spec(props: Mapping[str, Any]) -> dict[str, Any]:
    """What the claim program is given: the owner, the prefix and the ports as integers (numbers come
    back from the engine as floats; the records hold ports as integers)."""
    ports = [[int(low), int(high)] for low, high in props.get("ports") or []]
    return {"owner": props["owner"], "prefix": props["prefix"], "ports": ports}


def claim_argv(props: Mapping[str, Any], mode: str) -> list[str]:
    """The command run on the node for `mode` (one of MODES) of this claim."""
    if mode not in MODES:
        raise ValueError(f"claim mode {mode!r}: give one of {', '.join(MODES)}")
    return program_argv("stack_claim", [mode, json.dumps(claim_spec(props), separators=(",", ":"))])
