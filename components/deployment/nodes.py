"""The first stages, per node before anything runs there: its docker provider, the stack's claim on
its names and ports, the stack's own secrets (after every claim), and its FabricCheck.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pulumi
import pulumi_docker as docker

from components.config import CheckMode
from components.fabric_check import FabricCheck, probe_after
from components.health_secret import HealthSecret
from components.layout import fabric_check_inputs, probe_input, stack_claim_inputs
from components.stack_claim import StackClaim

if TYPE_CHECKING:
    from components.deployment.component import Qwen35Deployment


def docker_providers(name: str, deployment: Qwen35Deployment) -> dict[str, docker.Provider]:
    """One docker provider per node, over SSH."""
    return {
        node_name: docker.Provider(
            f"{name}-docker-{node_name}",
            host=acc.docker_host,
            ssh_opts=acc.docker_ssh_opts(),
            opts=pulumi.ResourceOptions(parent=deployment),
        )
        for node_name, acc in deployment.access.items()
    }


def stack_claims(name: str, deployment: Qwen35Deployment) -> dict[str, StackClaim]:
    """Before any container or volume on a node: no other stack holds its names or host ports there."""
    cfg = deployment.config
    owner = f"{pulumi.get_project()}/{pulumi.get_stack()}"
    return {
        node.name: StackClaim(
            f"{name}-claim-{node.name}",
            node=deployment.access[node.name].node_dict(),
            owner=owner,
            **stack_claim_inputs(cfg, node),
            opts=pulumi.ResourceOptions(parent=deployment),
        )
        for node in cfg.nodes
    }


def stack_secret(resource_name: str, deployment: Qwen35Deployment) -> HealthSecret:
    """A random secret of this stack's, drawn once and kept encrypted in the state; after every
    node's claim, so a stack refused on any node draws nothing."""
    return HealthSecret(
        resource_name,
        owner=f"{pulumi.get_project()}/{pulumi.get_stack()}",
        prefix=deployment.config.containers.name_prefix,
        opts=pulumi.ResourceOptions(parent=deployment, depends_on=list(deployment.claims.values())),
    )


def fabric_checks(name: str, deployment: Qwen35Deployment) -> dict[str, FabricCheck]:
    """Per node, before any container: its RoCE fabric is fit for NCCL; what NCCL there is given.
    The head's first: a worker's MTU must equal the head's recorded one. None under `off`."""
    cfg = deployment.config
    if cfg.fabric.check is CheckMode.OFF:
        return {}
    checks: dict[str, FabricCheck] = {}
    after = probe_after([w.name for w in cfg.workers])
    for node in [cfg.head, *cfg.workers]:
        head = checks.get(cfg.head.name)
        reference = (
            pulumi.Output.all(head.mtu, head.paths).apply(
                lambda v, head_name=cfg.head.name: {"node": head_name, "mtu": v[0], "paths": v[1]}
            )
            if head
            else None
        )
        checks[node.name] = FabricCheck(
            f"{name}-fabric-{node.name}",
            **fabric_check_inputs(cfg, node, dict(deployment.access[node.name].node_dict())),
            reference=reference,
            probe=probe_input(cfg, deployment.access[cfg.head.name].node_dict()) if head else None,
            # After the claims: a worker's probe listens on the head's claimed fabric.probe_port;
            # after the previous worker's check: one probe at a time holds that port.
            opts=pulumi.ResourceOptions(
                parent=deployment,
                depends_on=[
                    deployment.claims[node.name],
                    deployment.claims[cfg.head.name],
                    *([checks[after[node.name]]] if after.get(node.name) else []),
                ],
            ),
        )
    return checks
