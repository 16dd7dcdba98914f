"""The serving stages: each node's compile cache, then under Ray the Ray cluster and the vLLM server
on the head, or under executor mp the headless ranks and rank 0 on the head; then the readiness gate.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pulumi
import pulumi_docker as docker

from components.containers import ContainerSpec, compile_cache_volume_name
from components.deployment.mp_world import with_world
from components.deployment.nodes import stack_secret
from components.deployment.served import deployed
from components.layout import gate_watched, readiness_gate_inputs, serving_log_containers
from components.mp_executor import mp_container_spec, ranked_nodes
from components.ray_cluster import ray_container_spec, ray_tmp_volume_name
from components.readiness_gate import ReadinessGate
from components.vllm_server import vllm_container_spec

if TYPE_CHECKING:
    from components.deployment.component import Qwen35Deployment

# By node: a container's spec and its environment (what `Qwen35Deployment.container` takes).
Specs = dict[str, tuple[ContainerSpec, pulumi.Input[list[str]]]]


def compile_caches(name: str, deployment: Qwen35Deployment) -> dict[str, docker.Volume]:
    """Per node, what vLLM and its compilers build at start, for the next start to reuse (none
    with `containers.compile_cache` off). Kept on `destroy` as the checkpoint is: a kept volume
    is only forgotten by the stack, and the next stack's create takes it over under its name."""
    cfg = deployment.config
    if not cfg.containers.compile_cache:
        return {}
    return {
        node.name: docker.Volume(
            f"{name}-compile-cache-{node.name}",
            name=compile_cache_volume_name(cfg),
            opts=pulumi.ResourceOptions.merge(
                deployment.on(node.name), pulumi.ResourceOptions(retain_on_delete=cfg.model.keep_on_destroy)
            ),
        )
        for node in cfg.nodes
    }


def ray_cluster(
    name: str, deployment: Qwen35Deployment, secrets: dict[str, Any]
) -> tuple[docker.Volume, dict[str, docker.Container]]:
    """The Ray head with its temp volume, then every worker (a worker joins the head's GCS)."""
    cfg, head = deployment.config, deployment.config.head
    # Shared by the Ray head and the vLLM server (the driver needs the raylet's socket).
    ray_tmp = docker.Volume(f"{name}-ray-tmp", name=ray_tmp_volume_name(cfg), opts=deployment.on(head.name))
    containers = {
        head.name: deployment.container(
            f"{name}-ray-head",
            deployment.specs(
                head, lambda f: ray_container_spec(cfg, head, deployment.image_id(head.name), f)
            ),
            head.name,
            secrets,
            depends_on=[ray_tmp],
        )
    }
    for worker in cfg.workers:
        containers[worker.name] = deployment.container(
            f"{name}-ray-worker-{worker.name}",
            deployment.specs(
                worker, lambda f, w=worker: ray_container_spec(cfg, w, deployment.image_id(w.name), f)
            ),
            worker.name,
            secrets,
            # A worker joins the head's GCS: never start one before the head.
            depends_on=[containers[head.name]],
        )
    return ray_tmp, containers


def vllm_server(name: str, deployment: Qwen35Deployment, secrets: dict[str, Any]) -> docker.Container:
    """The vLLM server on the head, serving the pinned revision of a Hub checkpoint."""
    cfg, head = deployment.config, deployment.config.head.name
    return deployment.container(
        f"{name}-vllm",
        deployment.specs(cfg.head, lambda f: vllm_container_spec(cfg, deployment.image_id(head), f)),
        head,
        secrets,
        # The server claims every GPU of the cluster: only once every Ray container runs.
        depends_on=[*deployment.ray_containers.values(), deployment.ray_tmp],
        revision=deployment.served_revision(),
    )


def mp_ranks(name: str, deployment: Qwen35Deployment, secrets: dict[str, Any]) -> Specs:
    """Executor mp: every rank's spec and environment, the environment carrying the world's digest
    (components/mp_executor.py, WORLD_ENV) so that a change to any rank replaces every rank."""
    cfg, revision = deployment.config, deployment.served_revision()
    specs = {
        n.name: deployment.specs(n, lambda f, n=n: mp_container_spec(cfg, n, deployment.image_id(n.name), f))
        for n in ranked_nodes(cfg)
    }
    # Keyed by a secret of the stack's own, drawn once (HealthSecret's kind: it never changes).
    key = stack_secret(f"{name}-mp-world-key", deployment)
    return with_world(specs, key.secret, revision, secrets)


def headless_ranks(
    name: str, deployment: Qwen35Deployment, specs: Specs, secrets: dict[str, Any]
) -> dict[str, docker.Container]:
    """Executor mp: a headless `vllm serve` rank on every worker, before the head's rank 0."""
    return {
        worker.name: deployment.container(
            f"{name}-vllm-headless-{worker.name}",
            specs[worker.name],
            worker.name,
            secrets,
            depends_on=[],
            # Every rank loads its own shard of the pinned revision from its node's cache.
            revision=deployment.served_revision(),
        )
        for worker in deployment.config.workers
    }


def mp_head(
    name: str, deployment: Qwen35Deployment, specs: Specs, secrets: dict[str, Any]
) -> docker.Container:
    """Executor mp: rank 0 on the head, which serves the API once every headless rank joined (it
    waits for them on its master port, within vLLM's own timeout)."""
    head = deployment.config.head
    return deployment.container(
        f"{name}-vllm",
        specs[head.name],
        head.name,
        secrets,
        depends_on=list(deployment.ranks.values()),
        revision=deployment.served_revision(),
    )


def readiness_gate(
    name: str, deployment: Qwen35Deployment, api_key: pulumi.Output[str] | None
) -> ReadinessGate:
    """Passes once the server answers a request: with every node and GPU in the Ray cluster, or
    under executor mp (no Ray to ask: `--no-ray-check`) once the head serves, which it does only
    after every rank joined."""
    cfg, head = deployment.config, deployment.config.head
    head_checkpoint = deployment.checkpoints.get(head.name)
    return ReadinessGate(
        f"{name}-ready",
        node=deployment.access[head.name].node_dict(),
        server_id=deployment.server.id,
        **readiness_gate_inputs(cfg),
        container_ids=gate_container_ids(deployment),
        api_key=api_key,
        deployed=deployed(cfg, deployment.image_ref, head_checkpoint.revision if head_checkpoint else None),
        serving_logs={
            node: {"node": deployment.access[node].node_dict(), "container": container}
            for node, container in serving_log_containers(cfg).items()
        },
        nccl_fabric=deployment.nccl_fabric(),
        opts=pulumi.ResourceOptions(
            parent=deployment,
            depends_on=[deployment.server, *deployment.ray_containers.values(), *deployment.ranks.values()],
        ),
    )


def gate_container_ids(deployment: Qwen35Deployment) -> dict[str, pulumi.Output[str]]:
    """`node/container` -> ID of what the gate watches (`layout.gate_watched`): a recreated
    container (a worker started again by `up`) makes the gate probe again."""
    servers = {deployment.config.head.name: deployment.server, **deployment.ranks}
    containers = {"ray": deployment.ray_containers, "server": servers}
    return {key: containers[kind][node].id for key, (node, kind) in gate_watched(deployment.config).items()}
