"""StackClaim: a dynamic resource per node saying "this stack's containers and host ports live here".

Created before the node's volume and containers, dropped after them. Its create refuses, naming the
other stack and what collides, when another stack of any project already claims the same container
name prefix or one of the same host ports on the node (`components/node_programs/stack_claim.py`
keeps the records on the node). Without it a second stack on the same nodes adopts the first one's
Ray volume and only then fails on a container name; its destroy then waits on that volume.

Pickled by reference to this module: keep it importable with no side effects, and do not rename
`StackClaimProvider` (stacks refer to it).
"""

from __future__ import annotations

import json
from typing import Any

import pulumi
import pulumi.dynamic as dynamic

from components.config import (
    RAY_CLIENT_SERVER_PORT,
    RAY_DASHBOARD_AGENT_LISTEN_PORT,
    Executor,
    FabricCheckMode,
    HealthMode,
    NodeConfig,
    StackConfig,
)
from components.errors import ExplainedErrors
from components.node_programs import program_argv
from components.node_programs.stack_claim import Exit as ClaimExit
from components.node_programs.wire import STACK_RECORDS
from components.nodes import checked_target
from components.remote import RemoteError, SshTransport, with_retries

SSH_TIMEOUT_S = 60.0


def probe_ports(config: StackConfig, node: NodeConfig) -> list[list[int]]:
    """The head's `fabric.probe_port`, where each worker's FabricCheck probe reaches a short-lived
    listener; none without the check or without a worker (no probe runs)."""
    if node is not config.head or not config.workers or config.fabric.check is FabricCheckMode.OFF:
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


def run_claim(props: dict[str, Any], mode: str) -> tuple[int, dict[str, Any]]:
    target = checked_target("StackClaim", props["node"])
    # Numbers come back from the engine as floats: the records hold ports as integers.
    ports = [[int(low), int(high)] for low, high in props.get("ports") or []]
    spec = {"owner": props["owner"], "prefix": props["prefix"], "ports": ports}
    argv = program_argv("stack_claim", [mode, json.dumps(spec, separators=(",", ":"))])
    transport = SshTransport(target)
    result = with_retries(lambda: transport.run(argv, timeout=SSH_TIMEOUT_S), deadline_s=20.0)
    if result.returncode not in (ClaimExit.OK, ClaimExit.CLAIMED):
        result.check(f"check that {target.label} is reachable over SSH (`make status`)")
    lines = result.text.strip().splitlines()
    return result.returncode, json.loads(lines[-1]) if lines else {}


class ClaimRefused(RemoteError):
    """Another stack holds this node's names or ports; the message names it and the way out."""

    def _message(self) -> str:
        return self.hint


class StackClaimProvider(ExplainedErrors, dynamic.ResourceProvider):
    """create/update: take the claim (refused on a collision); read: still held?; delete: drop it."""

    def _take(self, props: dict[str, Any]) -> None:
        code, report = run_claim(props, "take")
        if code == ClaimExit.CLAIMED:
            name = props["node"]["name"]
            raise ClaimRefused(name, [], code, "", refusal(name, props["owner"], report.get("clashes") or []))

    def create(self, props: dict[str, Any]) -> dynamic.CreateResult:
        self._take(props)
        return dynamic.CreateResult(id_=f"{props['node']['name']}/{props['owner']}", outs=props)

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> dynamic.DiffResult:
        # Never a replacement: a new claim created before the old one's delete would be dropped by it.
        keys = ("owner", "prefix", "ports", "node")
        return dynamic.DiffResult(changes=any(olds.get(k) != news.get(k) for k in keys), replaces=[])

    def update(self, _id: str, _olds: dict[str, Any], news: dict[str, Any]) -> dynamic.UpdateResult:
        self._take(news)
        return dynamic.UpdateResult(outs=news)

    def read(self, id_: str, props: dict[str, Any]) -> dynamic.ReadResult:
        _, report = run_claim(props, "held")
        record = report.get("record") or {}
        if not report.get("held") or record.get("prefix") != props.get("prefix"):
            return dynamic.ReadResult(id_="", outs={})
        return dynamic.ReadResult(id_=id_, outs=props)

    def delete(self, _id: str, props: dict[str, Any]) -> None:
        run_claim(props, "drop")


class StackClaim(dynamic.Resource, module="qwen35", name="StackClaim"):
    """This stack's container name prefix and host ports on one node, refused if another stack's."""

    def __init__(
        self,
        name: str,
        *,
        node: dict[str, Any],
        owner: str,
        prefix: str,
        ports: list[list[int]],
        opts: pulumi.ResourceOptions | None = None,
    ):
        props = {"node": node, "owner": owner, "prefix": prefix, "ports": ports}
        super().__init__(StackClaimProvider(), name, props, opts)
