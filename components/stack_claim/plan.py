"""StackClaim's pure decisions: the claim the program is given, what a refusal says, and
`plan_change`. No I/O: diff uses these, and the tests are tables. The ports a stack claims on a node
are its inputs, from config: `components/layout.py` (`claimed_ports`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from components.node_programs.wire import STACK_RECORDS
from components.provider_kit.change import Change
from components.provider_kit.inputs import node_problems

# Inputs whose change is an update: the claim taken again. Never a replacement: a new claim created
# before the old one's delete would be dropped by it.
CLAIM_KEYS = ("owner", "prefix", "ports", "node")


def refusal(node: str, owner: str, clashes: list[dict]) -> str:
    """The message for a claim another stack's claim collides with: who, what, and what to do."""
    lines = [f"{node}: stack {owner} cannot deploy here: this node already holds"]
    for clash in clashes:
        lines.append(f"  stack {clash['owner']}: {'; '.join(clash['clash'])}")
    records = ", ".join(f"{STACK_RECORDS}/{str(c['owner']).replace('/', '--')}.json" for c in clashes)
    lines.append(
        "  next: give this stack its own containers.name_prefix and its own host ports (the keys "
        "that set them: ray.port, ray.dashboard_port, serve.port, nodes[].ray_ports, "
        "fabric.probe_port, cluster.master_port, health.port, health.agent_port; host ports are "
        "per machine), "
        "or deploy it to other nodes. `pulumi destroy` of the other stack releases its claim; "
        f"if that stack no longer exists, remove {records} on {node}"
    )
    return "\n".join(lines)


def plan_change(olds: Mapping[str, Any], news: Mapping[str, Any]) -> Change:
    """From recorded state and new inputs, no I/O: an update (the claim taken again) for any changed
    input, never a replacement (a new claim created before the old one's delete would be dropped by
    it)."""
    return Change(replaces=(), updates=tuple(key for key in CLAIM_KEYS if olds.get(key) != news.get(key)))


def validate(props: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(field, reason) for each input `check` refuses: no I/O; a value not known yet passes."""
    return node_problems(props, "node")
