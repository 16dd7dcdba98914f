"""Memory-fit preflight: do the checkpoint's weights, split over TP × PP ranks, fit every node?

Pure: the model-support check feeds it the checkpoint's size (read on the head) and the declared
nodes, before any container starts.

Reserve model, per rank (one GPU, one vLLM worker):
- vLLM may use `memory_gb × gpu_memory_utilization` of its node's memory (vLLM's own meaning of
  the setting), and never more than `memory_gb − OS_RESERVE_GB`: unified memory is also the
  operating system's, Docker's and Ray's. For the GB10 (128 GB) that caps vLLM at 120 GB.
- Out of that budget: the weights of its shard; `RUNTIME_RESERVE_GB` for activations of a prefill
  batch, CUDA graphs and NCCL buffers; and at least `MIN_KV_CACHE_GB` of KV cache, so the server
  can hold a few long requests. What is left over also goes to the KV cache.
- TP splits every layer over its ranks; PP splits the layers into stages, and the stage with the
  most layers (⌈layers / PP⌉) sets the need. Embeddings and the LM head are counted as spread evenly.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

GB = 10**9
# The GB10's unified memory; what a node has when config says nothing else.
GB10_MEMORY_GB = 128.0
OS_RESERVE_GB = 8.0
RUNTIME_RESERVE_GB = 4.0
MIN_KV_CACHE_GB = 2.0


class MemoryFitError(ValueError):
    """The model does not fit the declared nodes; the message carries the numbers."""


@dataclass(frozen=True)
class NodeMemory:
    """One node's memory as config declares it."""

    name: str
    memory_gb: float = GB10_MEMORY_GB
    gpus: int = 1


@dataclass(frozen=True)
class RankFit:
    """One node's numbers, per rank (GPU) on it."""

    node: str
    budget_bytes: int
    weight_bytes: int
    need_bytes: int

    @property
    def fits(self) -> bool:
        return self.need_bytes <= self.budget_bytes

    @property
    def kv_cache_bytes(self) -> int:
        """What is left for the KV cache once weights and activations are placed (may be negative)."""
        return self.budget_bytes - self.weight_bytes - int(RUNTIME_RESERVE_GB * GB)


@dataclass(frozen=True)
class MemoryFit:
    """The preflight's result: per-node numbers and whether every node fits."""

    weight_bytes: int
    ranks: int
    per_node: tuple[RankFit, ...]

    @property
    def fits(self) -> bool:
        return all(node.fits for node in self.per_node)

    def summary(self) -> dict:
        """Plain values for the stack outputs (GB, one decimal)."""
        return {
            "fits": self.fits,
            "weights_gb": round(self.weight_bytes / GB, 1),
            "ranks": self.ranks,
            "per_rank": {
                n.node: {
                    "budget_gb": round(n.budget_bytes / GB, 1),
                    "weights_gb": round(n.weight_bytes / GB, 1),
                    "kv_cache_gb": round(n.kv_cache_bytes / GB, 1),
                }
                for n in self.per_node
            },
        }


def rank_weight_bytes(weight_bytes: int, tp: int, pp: int, num_layers: int | None = None) -> int:
    """The weights one rank holds: 1/TP of its stage, the largest stage having ⌈layers/PP⌉ layers."""
    if tp < 1 or pp < 1:
        raise ValueError(f"tensor and pipeline parallel sizes must be ≥ 1 (got {tp}, {pp})")
    stage_share = math.ceil(num_layers / pp) / num_layers if num_layers and pp > 1 else 1 / pp
    return math.ceil(weight_bytes * stage_share / tp)


def rank_budget_bytes(node: NodeMemory, gpu_memory_utilization: float) -> int:
    """What vLLM may use per GPU on `node`: the utilization's share, capped below the OS reserve."""
    usable = min(node.memory_gb * gpu_memory_utilization, node.memory_gb - OS_RESERVE_GB)
    return int(max(usable, 0.0) * GB / max(node.gpus, 1))


def memory_fit(
    weight_bytes: int,
    nodes: Sequence[NodeMemory],
    tensor_parallel_size: int,
    pipeline_parallel_size: int,
    gpu_memory_utilization: float,
    num_layers: int | None = None,
) -> MemoryFit:
    """The numbers for every node that runs ranks (nodes with no GPU run none)."""
    if weight_bytes < 0:
        raise ValueError(f"weight bytes must be ≥ 0 (got {weight_bytes})")
    per_rank = rank_weight_bytes(weight_bytes, tensor_parallel_size, pipeline_parallel_size, num_layers)
    need = per_rank + int((RUNTIME_RESERVE_GB + MIN_KV_CACHE_GB) * GB)
    per_node = tuple(
        RankFit(
            node=node.name,
            budget_bytes=rank_budget_bytes(node, gpu_memory_utilization),
            weight_bytes=per_rank,
            need_bytes=need,
        )
        for node in nodes
        if node.gpus > 0
    )
    return MemoryFit(weight_bytes, tensor_parallel_size * pipeline_parallel_size, per_node)


def check_memory_fit(fit: MemoryFit, gpu_memory_utilization: float) -> MemoryFit:
    """`fit` itself when every node fits; else MemoryFitError naming each node that does not."""
    if fit.fits:
        return fit
    lines = [
        f"the model does not fit: {fit.weight_bytes / GB:.1f} GB of weights over {fit.ranks} rank(s) "
        f"is {fit.per_node[0].weight_bytes / GB:.1f} GB per GPU, and each needs "
        f"{RUNTIME_RESERVE_GB:g} GB for activations plus at least {MIN_KV_CACHE_GB:g} GB of KV cache"
    ]
    for node in fit.per_node:
        if not node.fits:
            lines.append(
                f"  {node.node}: needs {node.need_bytes / GB:.1f} GB per GPU, has "
                f"{node.budget_bytes / GB:.1f} GB (memory_gb × gpu_memory_utilization "
                f"{gpu_memory_utilization:g}, at most memory_gb − {OS_RESERVE_GB:g})"
            )
    lines.append(
        "  next: add nodes (and raise tensor_parallel_size or pipeline_parallel_size to match), "
        "raise serve.gpu_memory_utilization, or serve a smaller checkpoint; "
        "check nodes[].memory_gb if a node has more memory than declared"
    )
    raise MemoryFitError("\n".join(lines))
