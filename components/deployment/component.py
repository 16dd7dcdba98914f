"""Qwen35Deployment: every stage of the graph registered in dependency order (the package's modules
build each), and what the stages share: a node's fabric as NCCL gets it, a container on a node."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_docker as docker

from components.answer_check import AnswerCheck
from components.checkpoint import Checkpoint
from components.config import CheckMode, Executor, NodeConfig, StackConfig
from components.containers import ContainerSpec, NodeFabric, configured_fabric, fabric_env
from components.deployment import checkpoint, checks, health, image, nodes, outputs, proofs, serving
from components.deployment.docker_args import container_args
from components.fabric_check import FabricCheck
from components.image_build.component import image_ref
from components.layout import nccl_transport
from components.node_image import NodeImage
from components.node_proof import NodeProof
from components.nodes import NodeAccess, node_access
from components.serve_bench import ServeBench


@dataclass(frozen=True)
class DeploymentArgs:
    """The validated stack config plus the secrets (secret Outputs, or None)."""

    config: StackConfig
    hf_token: pulumi.Output[str] | None = None
    api_key: pulumi.Output[str] | None = None


class Qwen35Deployment(pulumi.ComponentResource):
    """Everything one stack deploys, in dependency order: each step below registers one stage."""

    def __init__(self, name: str, args: DeploymentArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("qwen35:index:Deployment", name, None, opts)
        self.config = args.config
        self.access: dict[str, NodeAccess] = node_access(self.config)
        self.providers = nodes.docker_providers(name, self)
        self.claims = nodes.stack_claims(name, self)
        self.health_secret = health.health_secret(name, self)
        secrets = {
            "hf_token": args.hf_token,
            "api_key": args.api_key,
            # Secret already (additional_secret_outputs); said again so no path can carry it plain.
            "health_secret": pulumi.Output.secret(self.health_secret.secret) if self.health_secret else None,
        }
        self.fabric_checks: dict[str, FabricCheck] = nodes.fabric_checks(name, self)
        self.image = image.image_build(name, self)
        self.image_ref = image_ref(self.config.image)
        self.node_images: dict[str, NodeImage] = image.place_images(name, self, self.image_ref, self.image)
        self.checkpoints: dict[str, Checkpoint] = checkpoint.place_checkpoints(name, self, args.hf_token)
        self.model_support = proofs.model_support_check(name, self)
        self.node_proof: NodeProof | None = proofs.node_proof(name, self)
        self.compile_caches: dict[str, docker.Volume] = serving.compile_caches(name, self)
        self.ray_tmp: docker.Volume | None = None
        self.ray_containers: dict[str, docker.Container] = {}
        # Executor mp: every worker's headless vLLM rank, by node (the head's rank is `server`).
        self.ranks: dict[str, docker.Container] = {}
        if self.config.cluster.executor is Executor.MP:
            specs = serving.mp_ranks(name, self, secrets)
            self.ranks = serving.headless_ranks(name, self, specs, secrets)
            self.server = serving.mp_head(name, self, specs, secrets)
        else:
            self.ray_tmp, self.ray_containers = serving.ray_cluster(name, self, secrets)
            self.server = serving.vllm_server(name, self, secrets)
        self.ready = serving.readiness_gate(name, self, args.api_key)
        self.answers: AnswerCheck | None = checks.answer_check(name, self, args.api_key)
        self.bench: ServeBench | None = checks.serve_bench(name, self, args.api_key)
        self.health_volume: docker.Volume | None = None
        self.health_agents: dict[str, docker.Container] = {}
        self.watchdog: docker.Container | None = None
        if self.config.health.mode is not CheckMode.OFF:
            self.health_volume, self.health_agents, self.watchdog = health.health(name, self, secrets)
        self.outputs = outputs.stack_outputs(self)
        self.register_outputs(self.outputs)

    # ---- shared by the stages -------------------------------------------------------------------------

    def node_fabric(self, node: NodeConfig) -> pulumi.Output[NodeFabric] | None:
        """The node's FabricCheck outputs as NodeFabric; None where config alone decides them (the
        check off, or HCAs pinned and no `gid_index: resolve`: the check then gives back the pin and
        the configured index), so an existing stack's containers keep a known environment in preview."""
        check = self.fabric_checks.get(node.name)
        if check is None or (self.config.hca_pin(node) is not None and self.config.fabric.gid != "resolve"):
            return None
        return pulumi.Output.all(check.ib_hca, check.gid_index).apply(
            # (a dynamic resource's numbers come back as floats: 3.0 must read "3")
            lambda v: NodeFabric(tuple(v[0] or ()), None if v[1] is None else int(v[1]))
        )

    def fabric_env(self, node: NodeConfig) -> pulumi.Input[dict[str, str]]:
        """The fabric environment of `node`'s serving containers (its FabricCheck's HCAs and GID index)."""
        fabric = self.node_fabric(node)
        if fabric is None:
            return fabric_env(self.config, node)
        return fabric.apply(lambda f: fabric_env(self.config, node, f))

    def nccl_env(self, node: NodeConfig) -> pulumi.Input[dict[str, str]]:
        """What picks NCCL's transport in `node`'s serving containers (the bench measures again when
        it changes)."""
        env = self.fabric_env(node)
        return env.apply(nccl_transport) if isinstance(env, pulumi.Output) else nccl_transport(env)

    def nccl_fabric(self) -> dict[str, Any]:
        """Per node, the HCAs and GID index NCCL is given (FabricCheck's, else config's): a change is
        a change to how the ranks compute together. Not the probes' figures, which move every run."""
        fabric = {}
        for node in self.config.nodes:
            check = self.fabric_checks.get(node.name)
            if check is None:
                configured = configured_fabric(self.config, node)
                fabric[node.name] = {"ib_hca": list(configured.ib_hca), "gid_index": configured.gid_index}
            else:
                fabric[node.name] = {"ib_hca": check.ib_hca, "gid_index": check.gid_index}
        return fabric

    def specs(
        self, node: NodeConfig, build: Callable[[NodeFabric | None], ContainerSpec]
    ) -> tuple[ContainerSpec, pulumi.Input[list[str]] | None]:
        """A container's spec, and its environment from the node's FabricCheck outputs (None: the
        spec's own, under `fabric.check: off`). Only the environment depends on those outputs."""
        fabric = self.node_fabric(node)
        return build(None), (fabric.apply(lambda f: build(f).env_list()) if fabric is not None else None)

    def image_id(self, node: str) -> pulumi.Output[str]:
        """The image ID of `node`'s own copy (IDs differ across image stores): what its containers run."""
        return self.node_images[node].image_id

    def served_revision(self) -> pulumi.Output[str] | None:
        """The commit the server serves: the head checkpoint's, when `serve.model` is the Hub repo."""
        head_checkpoint = self.checkpoints.get(self.config.head.name)
        if head_checkpoint is None or self.config.serve.model != self.config.hub_repo:
            return None
        return head_checkpoint.revision

    def on(self, node: str, depends_on: list[pulumi.Resource] | None = None) -> pulumi.ResourceOptions:
        """Options of a resource on `node`'s docker provider, after the stack's claim there."""
        return pulumi.ResourceOptions(
            parent=self, provider=self.providers[node], depends_on=[self.claims[node], *(depends_on or [])]
        )

    def container(
        self,
        resource_name: str,
        specs: tuple[ContainerSpec, pulumi.Input[list[str]] | None],
        node: str,
        secrets: dict[str, Any],
        depends_on: list[pulumi.Resource],
        revision: pulumi.Output[str] | None = None,
    ) -> docker.Container:
        """A container on `node`, created after that node's NodeImage (whose ID the spec carries), the
        node's checkpoint, the model-support check and every node's FabricCheck; `revision`: the commit
        `vllm serve` must serve."""
        spec, env_list = specs
        kwargs = container_args(spec, secrets, env_list)
        if revision is not None:
            kwargs["command"] = revision.apply(lambda sha: [*spec.command[1:], "--revision", sha])
        weights = [self.checkpoints[node]] if node in self.checkpoints else []
        cache = [self.compile_caches[node]] if node in self.compile_caches else []
        return docker.Container(
            resource_name,
            **kwargs,
            opts=pulumi.ResourceOptions(
                parent=self,
                provider=self.providers[node],
                depends_on=[
                    self.claims[node],
                    self.node_images[node],
                    *weights,
                    *cache,
                    self.model_support,
                    # Every node's fabric before any container on any node (NCCL spans them all).
                    *self.fabric_checks.values(),
                    *([self.node_proof] if self.node_proof else []),
                    *depends_on,
                ],
                additional_secret_outputs=["envs", *(["uploads"] if spec.secret_files else [])],
                # The old container must release the GPUs and host ports before its successor starts.
                delete_before_replace=True,
            ),
        )
