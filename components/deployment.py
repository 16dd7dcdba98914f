"""Qwen35Deployment: the whole cluster as one component (providers, images, Ray, vLLM, readiness)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_docker as docker

from components.config import StackConfig
from components.nodes import NodeAccess, node_access


@dataclass(frozen=True)
class DeploymentArgs:
    """The validated stack config plus the secrets (secret Outputs, or None)."""

    config: StackConfig
    hf_token: pulumi.Output[str] | None = None
    api_key: pulumi.Output[str] | None = None


class Qwen35Deployment(pulumi.ComponentResource):
    """Everything one stack deploys, in dependency order."""

    def __init__(self, name: str, args: DeploymentArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("qwen35:index:Deployment", name, None, opts)
        self.config = args.config
        self.access: dict[str, NodeAccess] = node_access(args.config)
        self.providers: dict[str, docker.Provider] = {
            node_name: docker.Provider(
                f"{name}-docker-{node_name}",
                host=acc.docker_host,
                ssh_opts=acc.docker_ssh_opts(),
                opts=pulumi.ResourceOptions(parent=self),
            )
            for node_name, acc in self.access.items()
        }
        self.outputs: dict[str, Any] = {
            "head": args.config.head.name,
            "nodes": [n.name for n in args.config.nodes],
        }
        self.register_outputs(self.outputs)
