"""StackClaim's pure decisions: the host ports a stack claims on a node, the claim the program is
given, what a refusal says, and `plan_change`. No I/O: diff uses these, and the tests are tables."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from components.config import (
    RAY_CLIENT_SERVER_PORT,
    RAY_DASHBOARD_AGENT_LISTEN_PORT,
    Executor,
    FabricCheckMode,
    HealthMode,
    NodeConfig,
    StackConfig,
)
from components.node_programs.wire import STACK_RECORDS
from components.provider_kit.change import Change
from components.provider_kit.inputs import node_problems

# Inputs whose change is an update: the claim taken again. Never a replacement: a new claim created
# before the old one's delete would be dropped by it.
CLAIM_KEYS = ("owner", "prefix", "ports", "node")


def probe_ports(config: StackConfig, node: NodeConfig) -> list[list[int]]:
    """The head's `fabric.probe_port`, where each worker's FabricCheck probe reaches a short-lived
    listener, and then the node proof's group meets; none without a worker, or with neither the check
    nor the proof (nothing listens there)."""
    fabric = config.fabric
    if node is not config.head or not config.workers:
        return []
    if fabric.check is FabricCheckMode.OFF and fabric.proof is FabricCheckMode.OFF:
        return []
    return [[config.fabric.probe_port] * 2]


def claimed_ports(config: StackConfig, node: NodeConfig) -> list[list[int]]:
    """The host ports the stack binds on `node` (its containers', and the fabric probe's listener on
    the head), as sorted [low, high] ranges."""
    extra = health_ports(config, node) + probe_ports(config, node)
    if config.cluster.executor is Executor.MP:
        # No Ray: the head's API port and the master port its rank 0 listens on for the other ranks.
        served = [[config.serve.port] * 2, [config.cluster.master_port] * 2] if node is config.head else []
        return sorted(served + extra)
    rp = node.ray_ports
    single = [
        rp.node_manager_port,
        rp.object_manager_port,
        rp.metrics_export_port,
        rp.dashboard_agent_listen_port or RAY_DASHBOARD_AGENT_LISTEN_PORT,
        rp.dashboard_agent_grpc_port,
        rp.runtime_env_agent_port,
    ]
    if node is config.head:
        single += [config.ray.port, config.ray.dashboard_port, config.serve.port, RAY_CLIENT_SERVER_PORT]
    ranges = [[p, p] for p in single if p] + extra
    if rp.min_worker_port and rp.max_worker_port:
        ranges.append([rp.min_worker_port, rp.max_worker_port])
    return sorted(ranges)


def health_ports(config: StackConfig, node: NodeConfig) -> list[list[int]]:
    """The watchdog's port on the head, an agent's on every other node (none under health off)."""
    if config.health.mode is HealthMode.OFF:
        return []
    port = config.health.port if node is config.head else config.health.agent_port
    return [[port, port]]


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
    input, never a replacement."""
    return Change(replaces=(), updates=tuple(key for key in CLAIM_KEYS if olds.get(key) != news.get(key)))


def validate(props: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(field, reason) for each input `check` refuses: no I/O; a value not known yet passes."""
    return node_problems(props, "node")
