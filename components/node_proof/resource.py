"""The NodeProof resource as the Pulumi program declares it (type `qwen35:NodeProof`)."""

from __future__ import annotations

from typing import Any

import pulumi
import pulumi.dynamic as dynamic

from components.node_proof.plan import OUTPUT_KEYS
from components.node_proof.provider import NodeProofProvider


class NodeProof(dynamic.Resource, module="qwen35", name="NodeProof"):
    """Before any serving container: on every node, the deployment image's GPU step, and one
    torch.distributed group over the fabric whose transport NCCL's own lines name."""

    verdict: pulumi.Output[str]
    problems: pulumi.Output[list]
    warnings: pulumi.Output[list]
    results: pulumi.Output[dict]
    busbw_gbs: pulumi.Output[float | None]
    backend: pulumi.Output[str]
    # Node -> {driver, cuda, kernel, firmware, torch, nccl, vllm}: what the proof ran under. Take it
    # as an input to rerun on a node's software change (the proof reruns first, on refreshed drift).
    node_software: pulumi.Output[dict]
    # Node -> the host's facts as the last refresh read them (the same as above until they drift).
    observed_software: pulumi.Output[dict]

    def __init__(
        self,
        name: str,
        *,
        nodes: list[dict[str, Any]],
        master_addr: str,
        port: int,
        mode: str,
        gpu: bool,
        run: dict[str, Any],
        container_prefix: str,
        bytes_: int,
        iterations: int,
        deadline_s: float,
        min_busbw_gbs: float | None = None,
        min_available_bytes: int | None = None,
        opts: pulumi.ResourceOptions | None = None,
    ):
        props = {
            # The head first (rank 0): name, node access, rank, image_id, env (its NCCL settings),
            # ib_hca (what NCCL was given there); host_root (lab only: a tree standing in for `/`
            # where the host's software facts are read).
            "nodes": nodes,
            "master_addr": master_addr,
            "port": port,
            "mode": mode,
            # The stack gives its containers the GPU: the GPU step runs and the group is NCCL's.
            "gpu": gpu,
            # The serving containers' devices, GPU request, limits, IPC and shm.
            "run": run,
            "container_prefix": container_prefix,
            "bytes": bytes_,
            "iterations": iterations,
            "deadline_s": deadline_s,
            "min_busbw_gbs": min_busbw_gbs,
            # With the GPU step: below this MemAvailable on any node the proof is not run (`skipped`).
            "min_available_bytes": min_available_bytes,
            **{key: None for key in OUTPUT_KEYS},
        }
        super().__init__(NodeProofProvider(), name, props, opts)
