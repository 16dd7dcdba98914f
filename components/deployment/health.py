"""The health stages (none under `health.mode: off`): the secret the watchdog signs its requests with,
drawn early; after the gate, the watchdog's state volume on the head, an agent on every worker, then
the watchdog.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pulumi
import pulumi_docker as docker

from components.config import CheckMode, NodeConfig
from components.containers import ContainerSpec
from components.deployment.nodes import stack_secret
from components.health.containers import (
    agent_container_spec,
    health_config,
    health_volume_name,
    node_need_bytes,
    watchdog_container_spec,
)
from components.health_secret import HealthSecret

if TYPE_CHECKING:
    from components.deployment.component import Qwen35Deployment


def health_secret(name: str, deployment: Qwen35Deployment) -> HealthSecret | None:
    """The secret the watchdog signs its requests to the agents with (none under health.mode off)."""
    if deployment.config.health.mode is CheckMode.OFF:
        return None
    return stack_secret(f"{name}-health-secret", deployment)


def health(
    name: str, deployment: Qwen35Deployment, secrets: dict[str, Any]
) -> tuple[docker.Volume, dict[str, docker.Container], docker.Container]:
    """After the gate (the watchdog never judges a cluster `up` has not seen ready): the watchdog's
    state volume on the head, an agent on every worker, then the watchdog (it asks the agents)."""
    cfg, head = deployment.config, deployment.config.head
    volume = docker.Volume(
        f"{name}-health",
        name=health_volume_name(cfg),
        opts=deployment.on(head.name, depends_on=[deployment.ready]),
    )
    agents = {
        worker.name: deployment.container(
            f"{name}-health-agent-{worker.name}",
            health_specs(
                deployment,
                worker,
                lambda j, w=worker: agent_container_spec(cfg, w, deployment.image_id(w.name), j),
            ),
            worker.name,
            secrets,
            depends_on=[deployment.ready],
        )
        for worker in cfg.workers
    }
    watchdog = deployment.container(
        f"{name}-watchdog",
        health_specs(
            deployment, head, lambda j: watchdog_container_spec(cfg, deployment.image_id(head.name), j)
        ),
        head.name,
        secrets,
        depends_on=[deployment.ready, volume, *agents.values()],
    )
    return volume, agents, watchdog


def health_specs(
    deployment: Qwen35Deployment, node: NodeConfig, build: Callable[[str], ContainerSpec]
) -> tuple[ContainerSpec, pulumi.Output[list[str]]]:
    """A health container's spec and its environment: the config JSON carries each node's memory
    need, known once the model-support check recorded its memory fit."""
    cfg = deployment.config

    def env(fit: Any) -> list[str]:
        needs = {n.name: node_need_bytes(fit, n.name, n.gpus) for n in cfg.nodes}
        return build(health_config(cfg, node, needs)).env_list()

    return build(health_config(cfg, node)), deployment.model_support.memory_fit.apply(env)
