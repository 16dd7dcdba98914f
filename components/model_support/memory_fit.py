"""Memory-fit preflight: do the weights, split over TP × PP ranks, and one request fit every node?

Pure: the model-support check feeds it the checkpoint's size and config.json (read on the head), the
declared nodes and the serving options, before any container starts.

Reserve model, per rank (one GPU, one vLLM worker):
- vLLM may use `memory_gb × gpu_memory_utilization` of its node's memory (vLLM's own meaning of
  the setting), and never more than `memory_gb − OS_RESERVE_GB`: unified memory is also the
  operating system's, Docker's and Ray's. For the GB10 (128 GB) that caps vLLM at 120 GB.
- Out of that budget: the weights of its shard (the MTP head's only with speculative decoding on,
  the vision encoder's not with `language_model_only`); `RUNTIME_RESERVE_GB` for activations of a
  prefill batch, CUDA graphs and NCCL buffers; what is left is the KV cache. vLLM refuses to start
  when that cannot hold one request of `max_model_len` tokens, and so does this check.
- One request (`ModelShape`, from config.json): `max_model_len` tokens × the KV bytes per token of the
  full-attention layers only (K and V, the rank's KV heads, `kv_cache_dtype`; the MTP layer's too
  with speculative decoding), plus the linear-attention (gated delta) layers' state, which is per
  sequence and does not grow with its length (conv state and recurrent state, in the model's dtype).
  A config without those sizes falls back to a flat `MIN_KV_CACHE_GB` floor, and says so.
- Expected maximum concurrency at `max_model_len`, as vLLM prints it at start-up: KV cache / one request.
- TP splits every layer over its ranks; PP splits the layers into stages, and the stage with the
  most layers (⌈layers / PP⌉) sets the need. Embeddings and the LM head are counted as spread evenly.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from components.config import GB10_MEMORY_GB
from components.model_support.errors import MemoryFitError

GB = 10**9
OS_RESERVE_GB = 8.0
RUNTIME_RESERVE_GB = 4.0
MIN_KV_CACHE_GB = 2.0


DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2}


@dataclass(frozen=True)
class ModelShape:
    """What the KV-cache sizing reads from the checkpoint's config.json (its text model)."""

    full_attention_layers: int
    num_kv_heads: int
    head_dim: int
    dtype_bytes: int = 2
    # Gated delta (linear attention) layers: their conv channels, kernel and recurrent state size.
    linear_layers: int = 0
    linear_conv_dim: int = 0
    linear_conv_kernel: int = 0
    linear_state_elems: int = 0
    max_position_embeddings: int | None = None
    mtp_layers: int = 0


def model_shape(config: Mapping[str, Any]) -> ModelShape | None:
    """The shape of a Hugging Face config.json (multimodal configs nest it in `text_config`), or None."""
    text = config.get("text_config") if isinstance(config.get("text_config"), Mapping) else config
    layers, heads = text.get("num_hidden_layers"), text.get("num_attention_heads")
    if not isinstance(layers, int) or not isinstance(heads, int) or layers < 1 or heads < 1:
        return None
    kv_heads = text.get("num_key_value_heads") or heads
    head_dim = text.get("head_dim") or (text.get("hidden_size") or 0) // heads
    if not head_dim:
        return None
    kinds = text.get("layer_types")
    if isinstance(kinds, list) and kinds:
        full = sum(1 for kind in kinds if kind == "full_attention")
        linear = sum(1 for kind in kinds if kind == "linear_attention")
    elif isinstance(text.get("full_attention_interval"), int) and text["full_attention_interval"] > 0:
        full = layers // text["full_attention_interval"]
        linear = layers - full
    else:
        full, linear = layers, 0
    key_dim = int(text.get("linear_num_key_heads") or 0) * int(text.get("linear_key_head_dim") or 0)
    v_heads = int(text.get("linear_num_value_heads") or 0)
    v_dim = int(text.get("linear_value_head_dim") or 0)
    dtype = str(text.get("dtype") or text.get("torch_dtype") or config.get("torch_dtype") or "bfloat16")
    return ModelShape(
        full_attention_layers=full,
        num_kv_heads=int(kv_heads),
        head_dim=int(head_dim),
        dtype_bytes=DTYPE_BYTES.get(dtype, 2),
        linear_layers=linear,
        linear_conv_dim=2 * key_dim + v_heads * v_dim,
        linear_conv_kernel=int(text.get("linear_conv_kernel_dim") or 0),
        linear_state_elems=v_heads * int(text.get("linear_key_head_dim") or 0) * v_dim,
        max_position_embeddings=text.get("max_position_embeddings") or config.get("max_position_embeddings"),
        mtp_layers=int(text.get("mtp_num_hidden_layers") or 0),
    )


@dataclass(frozen=True)
class ServeMemory:
    """The serving options that change what a rank holds."""

    max_model_len: int | None = None
    kv_cache_dtype: str = "auto"
    # 0: speculative decoding off (the MTP head's weights are not loaded).
    speculative_tokens: int = 0
    language_model_only: bool = False
    # vLLM's speculative method: only `mtp` (and its older `*_mtp` names) drafts with the MTP head.
    speculative_method: str = "mtp"

    @property
    def uses_mtp_head(self) -> bool:
        method = self.speculative_method
        return bool(self.speculative_tokens) and (method == "mtp" or method.endswith("_mtp"))


@dataclass(frozen=True)
class KvSizing:
    """One request of `max_model_len` tokens, per rank: KV bytes per token and per-sequence state."""

    max_model_len: int
    kv_cache_dtype: str
    bytes_per_token: int
    state_bytes: int
    full_attention_layers: int
    speculative_tokens: int = 0

    @property
    def request_bytes(self) -> int:
        return (self.max_model_len + self.speculative_tokens) * self.bytes_per_token + self.state_bytes

    def longest_fitting(self, kv_cache_bytes: int) -> int:
        """The largest `max_model_len` whose one request fits `kv_cache_bytes` (0 when none does)."""
        room = kv_cache_bytes - self.state_bytes
        return max(room // max(self.bytes_per_token, 1) - self.speculative_tokens, 0)


def kv_sizing(shape: ModelShape, serve: ServeMemory, tp: int, pp: int) -> KvSizing | None:
    """Per-rank sizing of one request; None when neither config nor serve gives `max_model_len`."""
    max_len = serve.max_model_len or shape.max_position_embeddings
    if not max_len:
        return None
    kv_bytes = (
        1
        if serve.kv_cache_dtype.startswith("fp8")
        else (2 if serve.kv_cache_dtype in ("bfloat16", "float16") else shape.dtype_bytes)
    )
    # KV heads are split over TP ranks; with fewer heads than ranks each rank keeps a copy of one.
    heads = max(shape.num_kv_heads // tp, 1)
    full = math.ceil(shape.full_attention_layers / pp)
    if serve.uses_mtp_head:
        full += shape.mtp_layers  # the MTP layer attends over the whole sequence too
    linear = math.ceil(shape.linear_layers / pp)
    per_layer_state = shape.linear_conv_dim * max(shape.linear_conv_kernel - 1, 0) + shape.linear_state_elems
    return KvSizing(
        max_model_len=int(max_len),
        kv_cache_dtype=serve.kv_cache_dtype,
        bytes_per_token=full * 2 * heads * shape.head_dim * kv_bytes,
        state_bytes=math.ceil(linear * per_layer_state * shape.dtype_bytes / tp),
        full_attention_layers=full,
        speculative_tokens=serve.speculative_tokens,
    )


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
    # The KV cache the server needs: one `max_model_len` request, or the flat floor when unsized.
    request_bytes: int

    @property
    def need_bytes(self) -> int:
        return self.weight_bytes + int(RUNTIME_RESERVE_GB * GB) + self.request_bytes

    @property
    def fits(self) -> bool:
        return self.need_bytes <= self.budget_bytes

    @property
    def kv_cache_bytes(self) -> int:
        """What is left for the KV cache once weights and activations are placed (may be negative)."""
        return self.budget_bytes - self.weight_bytes - int(RUNTIME_RESERVE_GB * GB)

    @property
    def max_concurrency(self) -> float:
        """Requests of `max_model_len` tokens the KV cache holds at once (vLLM's start-up figure)."""
        return max(self.kv_cache_bytes, 0) / max(self.request_bytes, 1)


@dataclass(frozen=True)
class MemoryFit:
    """The preflight's result: per-node numbers and whether every node fits."""

    weight_bytes: int
    ranks: int
    per_node: tuple[RankFit, ...]
    # None: config.json gave no attention sizes (or no max_model_len): the flat floor was used.
    kv: KvSizing | None = None
    # The weights the server loads (the checkpoint's less what the serving options leave out).
    loaded_weight_bytes: int | None = None

    @property
    def fits(self) -> bool:
        return all(node.fits for node in self.per_node)

    @property
    def max_concurrency(self) -> float | None:
        """The smallest node's concurrency at `max_model_len` (None when the request is unsized)."""
        if self.kv is None or not self.per_node:
            return None
        return min(n.max_concurrency for n in self.per_node)

    def summary(self) -> dict:
        """Plain values for the stack outputs (GB, one decimal)."""
        out: dict[str, Any] = {
            "fits": self.fits,
            "weights_gb": round(self.weight_bytes / GB, 1),
            "loaded_weights_gb": round((self.loaded_weight_bytes or self.weight_bytes) / GB, 1),
            "ranks": self.ranks,
            "per_rank": {
                n.node: {
                    "budget_gb": round(n.budget_bytes / GB, 1),
                    "weights_gb": round(n.weight_bytes / GB, 1),
                    "kv_cache_gb": round(n.kv_cache_bytes / GB, 1),
                    **({"max_concurrency": round(n.max_concurrency, 2)} if self.kv else {}),
                }
                for n in self.per_node
            },
        }
        if self.kv is None:
            out["kv_sizing"] = f"flat floor of {MIN_KV_CACHE_GB:g} GB (config.json gave no attention sizes)"
            out["max_concurrency"] = None
            return out
        out.update(
            kv_sizing="config.json",
            max_model_len=self.kv.max_model_len,
            kv_cache_dtype=self.kv.kv_cache_dtype,
            kv_bytes_per_token=self.kv.bytes_per_token,
            state_bytes_per_sequence=self.kv.state_bytes,
            request_gb=round(self.kv.request_bytes / GB, 2),
            max_concurrency=round(self.max_concurrency or 0.0, 2),
        )
        return out


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


def loaded_weight_bytes(
    weight_bytes: int, serve: ServeMemory, mtp_bytes: int = 0, vision_bytes: int = 0
) -> int:
    """The checkpoint's bytes less the MTP head (speculative decoding off) and the vision encoder
    (`language_model_only`): vLLM does not load those."""
    loaded = weight_bytes
    if not serve.uses_mtp_head:
        loaded -= mtp_bytes
    if serve.language_model_only:
        loaded -= vision_bytes
    return max(loaded, 0)


def memory_fit(
    weight_bytes: int,
    nodes: Sequence[NodeMemory],
    tensor_parallel_size: int,
    pipeline_parallel_size: int,
    gpu_memory_utilization: float,
    num_layers: int | None = None,
    *,
    shape: ModelShape | None = None,
    serve: ServeMemory | None = None,
    mtp_bytes: int = 0,
    vision_bytes: int = 0,
) -> MemoryFit:
    """The numbers for every node that runs ranks (nodes with no GPU run none)."""
    if weight_bytes < 0:
        raise ValueError(f"weight bytes must be ≥ 0 (got {weight_bytes})")
    serve = serve or ServeMemory()
    loaded = loaded_weight_bytes(weight_bytes, serve, mtp_bytes, vision_bytes)
    per_rank = rank_weight_bytes(loaded, tensor_parallel_size, pipeline_parallel_size, num_layers)
    kv = kv_sizing(shape, serve, tensor_parallel_size, pipeline_parallel_size) if shape else None
    request = kv.request_bytes if kv else int(MIN_KV_CACHE_GB * GB)
    per_node = tuple(
        RankFit(
            node=node.name,
            budget_bytes=rank_budget_bytes(node, gpu_memory_utilization),
            weight_bytes=per_rank,
            request_bytes=request,
        )
        for node in nodes
        if node.gpus > 0
    )
    return MemoryFit(weight_bytes, tensor_parallel_size * pipeline_parallel_size, per_node, kv, loaded)


def check_memory_fit(fit: MemoryFit, gpu_memory_utilization: float) -> MemoryFit:
    """`fit` itself when every node fits; else MemoryFitError naming each node that does not."""
    if fit.fits:
        return fit
    kv = fit.kv
    loaded = fit.loaded_weight_bytes if fit.loaded_weight_bytes is not None else fit.weight_bytes
    if kv is None:
        request = f"at least {MIN_KV_CACHE_GB:g} GB of KV cache (config.json gave no attention sizes)"
    else:
        request = (
            f"the KV cache of one request of max_model_len {kv.max_model_len} tokens: "
            f"{kv.request_bytes / GB:.2f} GB ({kv.bytes_per_token / 1024:.1f} KiB per token over "
            f"{kv.full_attention_layers} full-attention layer(s) at kv_cache_dtype {kv.kv_cache_dtype}, "
            f"plus {kv.state_bytes / 1e6:.0f} MB of linear-attention state per sequence)"
        )
    lines = [
        f"the model does not fit: {fit.weight_bytes / GB:.1f} GB of weights"
        + (f" ({loaded / GB:.1f} GB loaded)" if loaded != fit.weight_bytes else "")
        + f" over {fit.ranks} rank(s) is {fit.per_node[0].weight_bytes / GB:.1f} GB per GPU, and each "
        f"needs {RUNTIME_RESERVE_GB:g} GB for activations plus {request}"
    ]
    weights_fit = True
    for node in fit.per_node:
        if not node.fits:
            weights_fit = weights_fit and node.kv_cache_bytes > 0
            line = (
                f"  {node.node}: needs {node.need_bytes / GB:.1f} GB per GPU, has "
                f"{node.budget_bytes / GB:.1f} GB (memory_gb × gpu_memory_utilization "
                f"{gpu_memory_utilization:g}, at most memory_gb − {OS_RESERVE_GB:g})"
            )
            if kv is not None and node.kv_cache_bytes > 0:
                line += (
                    f": {node.kv_cache_bytes / GB:.2f} GB left for the KV cache holds "
                    f"max_model_len {kv.longest_fitting(node.kv_cache_bytes)} at most"
                )
            lines.append(line)
    if kv is not None and weights_fit:
        fp8 = "" if kv.kv_cache_dtype.startswith("fp8") else ", serve.kv_cache_dtype: fp8 (half the bytes)"
        lines.append(
            "  next: a smaller serve.max_model_len, a higher serve.gpu_memory_utilization"
            f"{fp8}, or more nodes (and tensor_parallel_size to match)"
        )
    else:
        lines.append(
            "  next: add nodes (and raise tensor_parallel_size or pipeline_parallel_size to match), "
            "raise serve.gpu_memory_utilization, or serve a smaller checkpoint; "
            "check nodes[].memory_gb if a node has more memory than declared"
        )
    raise MemoryFitError("\n".join(lines))
