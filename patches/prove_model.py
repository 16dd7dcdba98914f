#!/usr/bin/env python3
"""Prove that this environment's vLLM can load, build and fill a Qwen3.5 model, on CPU, offline.

Three proofs, each stopping at the first failure:
  config     vLLM's own config loading of each config.json (text + vision sub-configs, FP8 quantization)
  construct  each architecture built on CPU from a tiny config of the same shape (whole FP8 blocks)
  load       `load_weights` of tiny random tensors under the checkpoint's Hugging Face names: every
             tensor the model loads must be among them, every name must land in a parameter, and
             every value of every parameter must be written (each shard of a fused one)

  python3 prove_model.py [--fixtures DIR] [--checkpoint SNAPSHOT_DIR] [--stages config,construct,load]

Without --checkpoint: every fixture under DIR (default: proof_configs/ next to this file). With
--checkpoint: the snapshot's own config.json, a tiny model derived from it, and the tensor names of its
model.safetensors.index.json (no weights needed). Progress goes to stderr; the last line of stdout is
one JSON report. Exit 0 pass, 1 a proof failed, 2 usage error or environment missing (no torch/vLLM).
Only the standard library is imported until the environment stage, so a missing torch is reported.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import math
import os
import re
import sys
import tempfile
import traceback
from dataclasses import dataclass, field
from pathlib import Path

STAGES = ("config", "construct", "load")
FIXTURES_DIR = Path(__file__).resolve().parent / "proof_configs"
INDEX_FILE = "model.safetensors.index.json"

# The Qwen3.5 architectures the tiny-model derivation and the naming scheme below know.
ARCHITECTURES = {
    "Qwen3_5MoeForConditionalGeneration": "qwen3_5_moe",
    "Qwen3_5ForConditionalGeneration": "qwen3_5",
}
# The MTP (speculative decoding) architecture vLLM builds from the same checkpoint's `mtp.*` tensors.
MTP_ARCHITECTURES = {
    "Qwen3_5MoeForConditionalGeneration": "Qwen3_5MoeMTP",
    "Qwen3_5ForConditionalGeneration": "Qwen3_5MTP",
}
# Quantization methods whose checkpoint tensors this program can name: none, or FP8 with block scales.
QUANTIZATIONS = (None, "fp8")

# Tiny dimensions, in units of the checkpoint's FP8 block edge (128 in the real checkpoint; 128 when it
# is not block-quantized), so every quantized matrix divides into whole blocks. Head sizes stay the
# checkpoint's own (rotary sections and kernels are defined over them); head counts are derived from
# them (`tiny_heads`), so each fused sub-shard that is whole blocks in the checkpoint is in the tiny model.
UNIT = 128
TINY_TEXT_UNITS = {
    "hidden_size": 2,
    "intermediate_size": 2,
    "moe_intermediate_size": 1,
    "shared_expert_intermediate_size": 1,
    "vocab_size": 8,
}
TINY_TEXT = {"max_position_embeddings": 4096}
TINY_GROUP = 2  # query heads per key/value head (and value per key head in linear attention), at most
TINY_EXPERTS, TINY_EXPERTS_PER_TOKEN, TINY_MTP_LAYERS = 4, 2, 1
TINY_VISION_UNITS = {"hidden_size": 1, "intermediate_size": 2}
TINY_VISION = {"num_heads": 1, "num_position_embeddings": 64}
TINY_VISION_DEPTH = 2

# Parameters vLLM creates with a default that a checkpoint may leave out: the KV-cache quantization
# scales of each attention layer (1.0 unless the checkpoint calibrated them; the real FP8 one did not).
DEFAULTED_PARAMETERS = re.compile(r"\.attn\.(?:k|v|q|prob)_scale$")

LM = "model.language_model."
VISUAL = "model.visual."


class ProofFailed(Exception):
    """A proof failed; carries the check that says so (the exception is in its detail)."""


@dataclass
class Report:
    """What the JSON line says; filled as the proofs go."""

    vllm: str | None = None
    transformers: str | None = None
    torch: str | None = None
    architecture: str | None = None
    model_type: str | None = None
    quantization: str | None = None
    failed_stage: str | None = None
    error: str | None = None
    where: str | None = None
    checks: list[dict] = field(default_factory=list)

    def check(self, stage: str, target: str, ok: bool, detail: str) -> None:
        self.checks.append({"stage": stage, "target": target, "ok": ok, "detail": detail})
        say(f"{stage:9} {target}: {'ok' if ok else 'FAILED'}: {detail}")

    def fail(self, stage: str, target: str, error: str, where: str | None = None) -> ProofFailed:
        self.failed_stage, self.error, self.where = stage, error, where
        self.check(stage, target, False, f"{error}" + (f" (at {where})" if where else ""))
        return ProofFailed(error)

    def as_json(self) -> str:
        verdict = "fail" if self.failed_stage or self.error else "pass"
        return json.dumps(
            {
                "verdict": verdict,
                "failed_stage": self.failed_stage,
                "error": self.error,
                "where": self.where,
                "vllm": self.vllm,
                "transformers": self.transformers,
                "torch": self.torch,
                "architecture": self.architecture,
                "model_type": self.model_type,
                "quantization": self.quantization,
                "checks": self.checks,
            }
        )


def say(message: str) -> None:
    print(f"prove_model: {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------------
# Pure parts: describing the error, deriving the tiny config, naming the checkpoint's tensors.
# ---------------------------------------------------------------------------------------------------


def describe(exc: BaseException) -> tuple[str, str | None]:
    """`Type: message` and the innermost vllm/transformers frame it was raised in (`vllm/x.py:12`);
    when that is in transformers, the vLLM code that called it follows (`… (from vllm/y.py:3)`)."""
    message, where, line, caller = " ".join(str(exc).split()), None, None, None
    for frame in traceback.extract_tb(exc.__traceback__):
        path = frame.filename.replace(os.sep, "/")
        found = re.search(r"(?:^|/)((vllm|transformers)/.+)$", path)
        if found:
            where, line = f"{found.group(1)}:{frame.lineno}", frame.line
            caller = where if found.group(2) == "vllm" else caller
    if where and caller and where.startswith("transformers/"):
        where = f"{where} (from {caller})"
    # A bare `assert` says nothing: its source line is the message.
    message = message or (line or "").strip()
    return (f"{type(exc).__name__}: {message}" if message else type(exc).__name__), where


def text_config(config: dict) -> dict:
    """The language model's part of a Qwen3.5 config (nested `text_config`, or the config itself)."""
    return config.get("text_config") or config


def quant_method(config: dict) -> str | None:
    quant = config.get("quantization_config") or text_config(config).get("quantization_config")
    return quant.get("quant_method") if quant else None


def layer_types(text: dict) -> list[str]:
    """Each decoder layer's kind: the config's `layer_types`, else Qwen3.5's every-Nth full attention."""
    if text.get("layer_types"):
        return list(text["layer_types"])
    interval = int(text.get("full_attention_interval", 4))
    return [
        "full_attention" if (i + 1) % interval == 0 else "linear_attention"
        for i in range(int(text["num_hidden_layers"]))
    ]


def tiny_layer_count(kinds: list[str]) -> int:
    """The fewest leading layers that hold every layer kind the model has (their indices are kept)."""
    wanted, seen = set(kinds), set()
    for index, kind in enumerate(kinds):
        seen.add(kind)
        if seen == wanted:
            return index + 1
    return len(kinds)


def check_supported(config: dict) -> tuple[str, str, str | None]:
    """The architecture, model type and quantization method, or ValueError naming what is unknown."""
    archs = config.get("architectures") or []
    if len(archs) != 1:
        raise ValueError(f"config.json must name exactly one architecture, found {archs!r}")
    arch, model_type, method = archs[0], config.get("model_type"), quant_method(config)
    if arch not in ARCHITECTURES:
        raise ValueError(
            f"unknown architecture {arch!r}: this proof derives tiny models for {', '.join(ARCHITECTURES)}"
        )
    if ARCHITECTURES[arch] != model_type:
        raise ValueError(
            f"architecture {arch} has model_type {ARCHITECTURES[arch]!r}, config says {model_type!r}"
        )
    if method not in QUANTIZATIONS:
        raise ValueError(
            f"unknown quantization method {method!r}: this proof knows {', '.join(map(str, QUANTIZATIONS))}"
        )
    return arch, model_type, method


def _keep_module(name: str, layers: int, depth: int, mtp_layers: int, experts: int) -> bool:
    """Whether a checkpoint module/tensor name belongs to the tiny model's kept layers and experts."""
    for pattern, limit in (
        (rf"^{re.escape(LM)}layers\.(\d+)\.", layers),
        (rf"^{re.escape(VISUAL)}blocks\.(\d+)\.", depth),
        (r"^mtp\.layers\.(\d+)\.", mtp_layers),
        (r"\.experts\.(\d+)\.", experts),
    ):
        found = re.search(pattern, name)
        if found and int(found.group(1)) >= limit:
            return False
    return True


def block_size(config: dict) -> tuple[int, int]:
    """The FP8 weight block (output rows, input columns) of a block-quantized config, else 128 x 128."""
    quant = config.get("quantization_config") or text_config(config).get("quantization_config") or {}
    if quant.get("quant_method") != "fp8":
        return UNIT, UNIT
    block_out, block_in = (quant.get("weight_block_size") or [UNIT, UNIT])[:2]
    return int(block_out), int(block_in)


def tiny_heads(original: int, least: int, *widths: tuple[int, int]) -> int:
    """The fewest heads, a multiple of `least`, such that for each (head width, block edge) whose total
    over the checkpoint's `original` heads is whole blocks, the tiny total is whole blocks too (a fused
    sub-shard narrower than a block cannot be loaded). At most the checkpoint's own count."""
    count = least
    for width, edge in widths:
        if original * width % edge == 0:
            count = math.lcm(count, edge // math.gcd(edge, width))
    return min(count, original)


def _tiny_head_counts(text: dict, config: dict) -> dict[str, int]:
    """Head counts of the tiny model: few, but every block-aligned width of the checkpoint kept aligned."""
    block_out, block_in = block_size(config)
    counts: dict[str, int] = {}
    if "linear_num_key_heads" in text:
        nk, nv = int(text["linear_num_key_heads"]), int(text["linear_num_value_heads"])
        dk, dv = int(text["linear_key_head_dim"]), int(text["linear_value_head_dim"])
        key = tiny_heads(nk, 1, (dk, block_out))  # q and k sub-shards of in_proj_qkv(z)
        # v and z sub-shards (outputs), out_proj's input; in_proj_b/a (one row per head) if quantized.
        value_widths = [(dv, block_out), (dv, block_in)]
        first = next((i for i, k in enumerate(layer_types(text)) if k == "linear_attention"), 0)
        if not _unquantized(f"{LM}layers.{first}.linear_attn.in_proj_b", config):
            value_widths.append((1, block_out))
        value = tiny_heads(nv, key * max(1, min(nv // nk, TINY_GROUP)), *value_widths)
        counts.update(linear_num_key_heads=key, linear_num_value_heads=value)
    if "num_key_value_heads" in text:
        heads, kv_heads = int(text["num_attention_heads"]), int(text["num_key_value_heads"])
        head_dim = int(text.get("head_dim") or int(text["hidden_size"]) // heads)
        gate = 2 if text.get("attn_output_gate", True) else 1
        kv = tiny_heads(kv_heads, 1, (head_dim, block_out))  # k and v sub-shards of qkv_proj
        # q sub-shard (with its output gate) and o_proj's input.
        q = tiny_heads(heads, kv * max(1, min(heads // kv_heads, TINY_GROUP)), (head_dim * gate, block_out),
                       (head_dim, block_in))  # fmt: skip
        counts.update(num_attention_heads=q, num_key_value_heads=kv)
    return counts


def tiny_config(config: dict) -> dict:
    """A config of the same architecture, model type and quantization with tiny dimensions.

    The leading layers are kept (as many as hold every layer kind), so the checkpoint's own names for
    those layers, experts and vision blocks apply to the tiny model unchanged.
    """
    tiny = copy.deepcopy(config)
    text = text_config(tiny)
    kinds = layer_types(text)
    layers = tiny_layer_count(kinds)
    unit = math.lcm(*block_size(config))
    text.update(_tiny_head_counts(text, config))
    text.update({key: units * unit for key, units in TINY_TEXT_UNITS.items()}, **TINY_TEXT)
    text.update(num_hidden_layers=layers, layer_types=kinds[:layers])
    text.pop("full_attention_interval", None)
    if "num_experts" in text:
        text["num_experts"] = min(int(text["num_experts"]), TINY_EXPERTS)
        text["num_experts_per_tok"] = min(
            int(text.get("num_experts_per_tok", 1)), text["num_experts"], TINY_EXPERTS_PER_TOKEN
        )
    if "mtp_num_hidden_layers" in text:
        text["mtp_num_hidden_layers"] = min(int(text["mtp_num_hidden_layers"]), TINY_MTP_LAYERS)
    vision = tiny.get("vision_config")
    depth = 0
    if vision is not None:
        depth = min(int(vision.get("depth", TINY_VISION_DEPTH)), TINY_VISION_DEPTH)
        vision.update(TINY_VISION, depth=depth, out_hidden_size=text["hidden_size"])
        vision.update({key: units * unit for key, units in TINY_VISION_UNITS.items()})
        if "deepstack_visual_indexes" in vision:
            vision["deepstack_visual_indexes"] = [i for i in vision["deepstack_visual_indexes"] if i < depth]
    quant = tiny.get("quantization_config")
    if quant and quant.get("modules_to_not_convert"):
        keep = [
            name
            for name in quant["modules_to_not_convert"]
            if _keep_module(f"{name}.", layers, depth, text.get("mtp_num_hidden_layers", 0), TINY_EXPERTS)
        ]
        quant["modules_to_not_convert"] = keep
    return tiny


def tiny_models(config: dict) -> list[tuple[str, dict]]:
    """The tiny models to build: the served architecture ("model") and, when the checkpoint has an MTP
    head, its MTP architecture ("mtp") from the same tiny config."""
    tiny = tiny_config(config)
    models = [("model", tiny)]
    arch = (tiny.get("architectures") or [None])[0]
    if int(text_config(tiny).get("mtp_num_hidden_layers", 0)) > 0 and arch in MTP_ARCHITECTURES:
        models.append(("mtp", {**tiny, "architectures": [MTP_ARCHITECTURES[arch]]}))
    return models


def _unquantized(module: str, config: dict) -> bool:
    quant = config.get("quantization_config") or {}
    if quant.get("quant_method") != "fp8":
        return True
    skipped = set(quant.get("modules_to_not_convert") or quant.get("ignored_layers") or [])
    # The module or any of its parents (`a.b.c` is skipped by `a.b`): a set lookup per prefix, since
    # a full-size config lists hundreds of modules and names tens of thousands.
    parts = module.split(".")
    return any(".".join(parts[:i]) in skipped for i in range(1, len(parts) + 1))


def _linear(shapes: dict, module: str, out: int, inp: int, config: dict, bias: bool = False) -> None:
    shapes[f"{module}.weight"] = (out, inp)
    if bias:
        shapes[f"{module}.bias"] = (out,)
    if not _unquantized(module, config):
        block_out, block_in = (config["quantization_config"].get("weight_block_size") or [UNIT, UNIT])[:2]
        shapes[f"{module}.weight_scale_inv"] = (math.ceil(out / block_out), math.ceil(inp / block_in))


def checkpoint_tensors(config: dict, head: str = "model") -> dict[str, tuple[int, ...]]:
    """The tensors a Qwen3.5 checkpoint of this config holds, by Hugging Face name, with their shapes (the
    naming of Qwen's own releases: `model.language_model.*`, `model.visual.*`, `lm_head`, per-expert MoE
    weights, FP8 `weight_scale_inv` beside each quantized matrix). head "model": what the served
    architecture loads; head "mtp": what its MTP (speculative decoding) architecture loads, `mtp.*` and
    the shared embeddings and `lm_head`."""
    text, vision = text_config(config), config.get("vision_config")
    h, vocab, shapes = int(text["hidden_size"]), int(text["vocab_size"]), {}
    shapes[f"{LM}embed_tokens.weight"] = (vocab, h)
    if not (config.get("tie_word_embeddings") or text.get("tie_word_embeddings")):
        _linear(shapes, "lm_head", vocab, h, config)
    if head == "mtp":
        _linear(shapes, "mtp.fc", h, 2 * h, config)
        for norm in ("norm", "pre_fc_norm_embedding", "pre_fc_norm_hidden"):
            shapes[f"mtp.{norm}.weight"] = (h,)
        for i in range(int(text.get("mtp_num_hidden_layers", 0))):
            _decoder_layer(shapes, f"mtp.layers.{i}", "full_attention", text, config)
        return shapes
    shapes[f"{LM}norm.weight"] = (h,)
    for i, kind in enumerate(layer_types(text)):
        _decoder_layer(shapes, f"{LM}layers.{i}", kind, text, config)
    if vision is not None:
        shapes.update(_vision_tensors(vision, config))
    return shapes


def _decoder_layer(shapes: dict, layer: str, kind: str, text: dict, config: dict) -> None:
    h = int(text["hidden_size"])
    shapes[f"{layer}.input_layernorm.weight"] = (h,)
    shapes[f"{layer}.post_attention_layernorm.weight"] = (h,)
    if kind == "linear_attention":
        nk, nv = int(text["linear_num_key_heads"]), int(text["linear_num_value_heads"])
        dk, dv = int(text["linear_key_head_dim"]), int(text["linear_value_head_dim"])
        attn, conv_dim = f"{layer}.linear_attn", 2 * nk * dk + nv * dv
        _linear(shapes, f"{attn}.in_proj_qkv", conv_dim, h, config)
        _linear(shapes, f"{attn}.in_proj_z", nv * dv, h, config)
        _linear(shapes, f"{attn}.in_proj_b", nv, h, config)
        _linear(shapes, f"{attn}.in_proj_a", nv, h, config)
        shapes[f"{attn}.conv1d.weight"] = (conv_dim, 1, int(text.get("linear_conv_kernel_dim", 4)))
        shapes[f"{attn}.A_log"] = (nv,)
        shapes[f"{attn}.dt_bias"] = (nv,)
        shapes[f"{attn}.norm.weight"] = (dv,)
        _linear(shapes, f"{attn}.out_proj", h, nv * dv, config)
    else:
        heads, kv_heads, head_dim = (
            int(text["num_attention_heads"]),
            int(text["num_key_value_heads"]),
            int(text["head_dim"]),
        )
        attn, gate = f"{layer}.self_attn", 2 if text.get("attn_output_gate", True) else 1
        _linear(shapes, f"{attn}.q_proj", heads * head_dim * gate, h, config)
        _linear(shapes, f"{attn}.k_proj", kv_heads * head_dim, h, config)
        _linear(shapes, f"{attn}.v_proj", kv_heads * head_dim, h, config)
        _linear(shapes, f"{attn}.o_proj", h, heads * head_dim, config)
        shapes[f"{attn}.q_norm.weight"] = (head_dim,)
        shapes[f"{attn}.k_norm.weight"] = (head_dim,)
    mlp = f"{layer}.mlp"
    if "num_experts" in text:
        inter, shared = int(text["moe_intermediate_size"]), int(text["shared_expert_intermediate_size"])
        _linear(shapes, f"{mlp}.gate", int(text["num_experts"]), h, config)
        for e in range(int(text["num_experts"])):
            _linear(shapes, f"{mlp}.experts.{e}.gate_proj", inter, h, config)
            _linear(shapes, f"{mlp}.experts.{e}.up_proj", inter, h, config)
            _linear(shapes, f"{mlp}.experts.{e}.down_proj", h, inter, config)
        _linear(shapes, f"{mlp}.shared_expert.gate_proj", shared, h, config)
        _linear(shapes, f"{mlp}.shared_expert.up_proj", shared, h, config)
        _linear(shapes, f"{mlp}.shared_expert.down_proj", h, shared, config)
        _linear(shapes, f"{mlp}.shared_expert_gate", 1, h, config)
    else:
        inter = int(text["intermediate_size"])
        _linear(shapes, f"{mlp}.gate_proj", inter, h, config)
        _linear(shapes, f"{mlp}.up_proj", inter, h, config)
        _linear(shapes, f"{mlp}.down_proj", h, inter, config)


def _vision_tensors(vision: dict, config: dict) -> dict[str, tuple[int, ...]]:
    hv, inter = int(vision["hidden_size"]), int(vision["intermediate_size"])
    patch, temporal = int(vision.get("patch_size", 16)), int(vision.get("temporal_patch_size", 2))
    merged = hv * int(vision.get("spatial_merge_size", 2)) ** 2
    shapes: dict[str, tuple[int, ...]] = {
        f"{VISUAL}patch_embed.proj.weight": (hv, int(vision.get("in_channels", 3)), temporal, patch, patch),
        f"{VISUAL}patch_embed.proj.bias": (hv,),
        f"{VISUAL}pos_embed.weight": (int(vision["num_position_embeddings"]), hv),
    }
    for b in range(int(vision["depth"])):
        block = f"{VISUAL}blocks.{b}"
        for norm in ("norm1", "norm2"):
            shapes[f"{block}.{norm}.weight"] = shapes[f"{block}.{norm}.bias"] = (hv,)
        _linear(shapes, f"{block}.attn.qkv", 3 * hv, hv, config, bias=True)
        _linear(shapes, f"{block}.attn.proj", hv, hv, config, bias=True)
        _linear(shapes, f"{block}.mlp.linear_fc1", inter, hv, config, bias=True)
        _linear(shapes, f"{block}.mlp.linear_fc2", hv, inter, config, bias=True)
    mergers = [("merger", hv)] + [
        (f"deepstack_merger_list.{k}", merged)
        for k in range(len(vision.get("deepstack_visual_indexes") or []))
    ]
    for merger, norm_dim in mergers:
        shapes[f"{VISUAL}{merger}.norm.weight"] = shapes[f"{VISUAL}{merger}.norm.bias"] = (norm_dim,)
        _linear(shapes, f"{VISUAL}{merger}.linear_fc1", merged, merged, config, bias=True)
        _linear(
            shapes, f"{VISUAL}{merger}.linear_fc2", int(vision["out_hidden_size"]), merged, config, bias=True
        )
    return shapes


def index_names_for(tiny: dict, index: dict, head: str = "model") -> list[str]:
    """The checkpoint index's tensor names that the tiny model's head loads: for "model" those of its
    layers, experts and vision blocks (not `mtp.*`); for "mtp" its MTP layers and experts plus the
    shared embeddings and `lm_head`."""
    text, vision = text_config(tiny), tiny.get("vision_config") or {}
    layers, depth = int(text["num_hidden_layers"]), int(vision.get("depth", 0))
    mtp_layers, experts = int(text.get("mtp_num_hidden_layers", 0)), int(text.get("num_experts", 0))
    shared = (f"{LM}embed_tokens.", "lm_head.")
    names = [
        n for n in (index.get("weight_map") or {}) if _keep_module(n, layers, depth, mtp_layers, experts)
    ]
    if head == "mtp":
        return sorted(n for n in names if n.startswith(("mtp.", *shared)))
    return sorted(n for n in names if not n.startswith("mtp."))


REFETCH = (
    "the checkpoint does not hold the tensors its config.json implies: fetch it again "
    "(`pulumi up --refresh`) or use the revision this config belongs to"
)


def absent_tensors(absent: list[str]) -> str:
    """The error part naming the tensors a model loads that the checkpoint's index lacks."""
    named = ", ".join(absent[:8])
    return f"{len(absent)} tensor(s) the model loads are missing from the checkpoint index: {named}"


def compare_names(shapes: dict[str, tuple[int, ...]], names: list[str]) -> tuple[list[str], list[str]]:
    """Both directions between the names a model of this config loads and a checkpoint's: the
    checkpoint's names outside them (unknown), and theirs the checkpoint lacks (absent); each sorted."""
    given = set(names)
    return sorted(given - shapes.keys()), sorted(shapes.keys() - given)


def full_size_names(config: dict, index: dict) -> tuple[dict[str, tuple[int, ...]], list[str], list[str]]:
    """The names a checkpoint of this (full-size) config holds, and both directions against its index:
    (expected, unknown, absent). The MTP head's names count only when the index has `mtp.*` tensors."""
    names = list(index.get("weight_map") or {})
    expected = checkpoint_tensors(config, "model")
    if any(n.startswith("mtp.") for n in names):
        expected.update(checkpoint_tensors(config, "mtp"))
    return (expected, *compare_names(expected, names))


def index_runs(flags: list[bool]) -> str:
    """The indices whose flag is set, as runs: `[F, T, F, T, T]` -> `1, 3-4`."""
    runs, start = [], None
    for i, flag in enumerate([*flags, False]):
        if flag and start is None:
            start = i
        elif not flag and start is not None:
            runs.append(f"{start}" if i - 1 == start else f"{start}-{i - 1}")
            start = None
    return ", ".join(runs)


# ---------------------------------------------------------------------------------------------------
# The proofs (torch and vLLM imported from here on).
# ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """One thing to prove: a folder with config.json (and, for a checkpoint, its safetensors index)."""

    name: str
    config_dir: Path
    from_index: bool  # (c) uses the index's tensor names; else the naming scheme's own for the tiny model

    def config(self) -> dict:
        return json.loads((self.config_dir / "config.json").read_text())

    def names(self, tiny: dict, head: str) -> list[str]:
        if not self.from_index:
            return sorted(checkpoint_tensors(tiny, head))
        return index_names_for(tiny, json.loads((self.config_dir / INDEX_FILE).read_text()), head)


class Environment:
    """torch, vLLM and transformers as imported here, and vLLM set up for one CPU process."""

    def __init__(self, report: Report) -> None:
        # Versions first, from package metadata, so a report of a broken environment still names them.
        from importlib import metadata

        for attr, package in (("torch", "torch"), ("transformers", "transformers"), ("vllm", "vllm")):
            with contextlib.suppress(metadata.PackageNotFoundError):
                setattr(report, attr, metadata.version(package))
        import torch
        import transformers
        import vllm

        self.torch = torch
        report.torch, report.transformers = torch.__version__, transformers.__version__
        report.vllm = getattr(vllm, "__version__", None) or report.vllm
        self.distributed = False

    def use_cpu(self) -> None:
        """Without a GPU vLLM picks an 'unspecified' platform with no device: make the CPU one current."""
        import vllm.platforms
        from vllm.platforms.cpu import CpuPlatform

        vllm.platforms._current_platform = CpuPlatform()

    def start_distributed(self, vllm_config, workdir: Path) -> None:
        """A gloo process group of one (once per process), and model parallel (1, 1) made anew for
        each model: vLLM creates the expert-parallel group only when the current config has experts."""
        from vllm.config import set_current_vllm_config
        from vllm.distributed import ensure_model_parallel_initialized, init_distributed_environment
        from vllm.distributed.parallel_state import destroy_model_parallel

        with set_current_vllm_config(vllm_config):
            if not self.distributed:
                init_distributed_environment(
                    world_size=1,
                    rank=0,
                    local_rank=0,
                    distributed_init_method=f"file://{workdir / 'gloo-rendezvous'}",
                    backend="gloo",
                )
                self.distributed = True
            destroy_model_parallel()
            ensure_model_parallel_initialized(1, 1)


def prove_config(env: Environment, report: Report, target: Target) -> None:
    """(a) vLLM's own config loading, then what it loaded is the Qwen3.5 shape the checkpoint says."""
    from vllm.transformers_utils import config as vllm_config_module

    raw = target.config()
    try:
        # What this vLLM knows comes first: an architecture or quantization it lacks is the finding.
        from vllm.model_executor.layers.quantization import QUANTIZATION_METHODS
        from vllm.model_executor.models.registry import ModelRegistry

        archs, method = raw.get("architectures") or [], quant_method(raw)
        unknown = [a for a in archs if a not in ModelRegistry.get_supported_archs()]
        if unknown:
            raise ValueError(f"architecture {unknown[0]!r} is not registered in this vLLM's model registry")
        if method is not None and method not in QUANTIZATION_METHODS:
            raise ValueError(f"quantization method {method!r} is not one this vLLM knows")
        arch, model_type, method = check_supported(raw)
        registry = getattr(vllm_config_module, "_CONFIG_REGISTRY", {})
        loader = "vllm get_config"
        if model_type in registry:
            loader += f" -> {registry[model_type].__name__}"
        hf = vllm_config_module.get_config(str(target.config_dir), trust_remote_code=False)
    except Exception as exc:
        raise report.fail("config", target.name, *describe(exc)) from exc
    text = getattr(hf, "text_config", hf)
    problems = []
    if getattr(hf, "model_type", None) != model_type:
        problems.append(f"model_type {getattr(hf, 'model_type', None)!r}, expected {model_type!r}")
    if not hasattr(hf, "vision_config") and "vision_config" in raw:
        problems.append("no vision_config")
    for key in ("hidden_size", "num_hidden_layers", "linear_num_value_heads"):
        if getattr(text, key, None) != text_config(raw).get(key):
            problems.append(
                f"text_config.{key} {getattr(text, key, None)!r} != {text_config(raw).get(key)!r}"
            )
    quant = getattr(hf, "quantization_config", None)
    if method is not None and (quant or {}).get("quant_method") != method:
        problems.append(f"quantization_config lost: {quant!r}")
    if problems:
        raise report.fail(
            "config", target.name, f"ConfigMismatch: {type(hf).__name__}: {'; '.join(problems)}"
        )
    blocks = (quant or {}).get("weight_block_size")
    report.check(
        "config",
        target.name,
        True,
        f"{loader}: {type(hf).__name__} ({type(text).__name__}, {len(layer_types(text_config(raw)))} layers, "
        f"quantization {method}{f' blocks {blocks}' if blocks else ''})",
    )


def prove_construct(env: Environment, report: Report, target: str, tiny: dict, workdir: Path):
    """(b) the architecture built on CPU from the tiny config, as vLLM's model loader builds it."""
    torch = env.torch
    model_dir = workdir / target
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "config.json").write_text(json.dumps(tiny, indent=1))
    try:
        env.use_cpu()
        from vllm.config import DeviceConfig, ModelConfig, VllmConfig, set_current_vllm_config
        from vllm.model_executor.model_loader.utils import initialize_model

        model_config = ModelConfig(
            model=str(model_dir),
            tokenizer=str(model_dir),
            dtype="bfloat16",
            enforce_eager=True,
            skip_tokenizer_init=True,
            max_model_len=256,
            seed=0,
        )
        vllm_config = VllmConfig(model_config=model_config, device_config=DeviceConfig(device="cpu"))
        env.start_distributed(vllm_config, workdir)
        with set_current_vllm_config(vllm_config), torch.device("cpu"):
            model = initialize_model(vllm_config=vllm_config)
    except Exception as exc:
        raise report.fail("construct", target, *describe(exc)) from exc
    params = dict(model.named_parameters())
    count = sum(p.numel() for p in params.values())
    quant = type(vllm_config.quant_config).__name__ if vllm_config.quant_config else "none"
    report.check(
        "construct",
        target,
        True,
        f"{type(model).__name__} on CPU: {len(params)} parameters ({count} values), quantization {quant}",
    )
    return model


def _tensor(torch, name: str, shape: tuple[int, ...], fp8: bool):
    """A small random tensor as the checkpoint stores it: FP8 weights, float32 block scales, else bf16."""
    if name.endswith("weight_scale_inv"):
        return torch.rand(shape, dtype=torch.float32) + 0.5
    weight = torch.randn(shape, dtype=torch.float32) * 0.02
    return weight.to(torch.float8_e4m3fn) if fp8 else weight.bfloat16()


def _unwritten(mask) -> str:
    """Where a parameter's sentinel survived: the indices of its first dimension (and, for a 3-d
    parameter such as the experts' fused w13, of its second) holding unwritten values, and how many."""
    parts = []
    for dim in range(1 if mask.dim() <= 2 else 2):
        along = mask.movedim(dim, 0).reshape(mask.shape[dim], -1).any(dim=1).tolist()
        parts.append(f"dim {dim}: {index_runs(along)} of {mask.shape[dim]}")
    return f"{', '.join(parts)}; {int(mask.sum())} of {mask.numel()} values never written"


def incomplete_load(
    absent: list[str], nowhere: list[str], unwritten: dict[str, str], missing: list[str]
) -> str:
    """`IncompleteLoad: …` naming what did not land (tensors absent from the checkpoint, names that
    landed nowhere, parameters not filled), or "" when everything landed."""
    parts = []
    if absent:
        parts.append(absent_tensors(absent))
    if nowhere:
        parts.append(f"{len(nowhere)} name(s) landed in no parameter: {', '.join(nowhere[:8])}")
    if unwritten:
        parts.append(
            f"{len(unwritten)} parameter(s) not filled: "
            + ", ".join(f"{name} ({where})" for name, where in list(unwritten.items())[:8])
        )
    if missing:
        parts.append(f"{len(missing)} parameter(s) not filled: {', '.join(missing[:8])}")
    if not parts:
        return ""
    return "IncompleteLoad: " + "; ".join(parts) + (f"; {REFETCH}" if absent else "")


def prove_load(
    env: Environment, report: Report, target: str, tiny: dict, head: str, names: list[str], model
) -> None:
    """(c) every tensor the model loads is in the checkpoint and every checkpoint tensor lands in a
    parameter; and every value of every parameter is written (each shard of a fused one)."""
    torch = env.torch
    shapes = checkpoint_tensors(tiny, head)
    unknown, absent = compare_names(shapes, names)
    if unknown:
        raise report.fail(
            "load",
            target,
            f"UnknownTensorName: {len(unknown)} checkpoint tensor(s) outside the Qwen3.5 naming scheme, "
            f"e.g. {', '.join(unknown[:5])}",
        )
    params = dict(model.named_parameters())
    defaulted = {n for n in params if DEFAULTED_PARAMETERS.search(n)}
    # A fused parameter (qkv_proj, in_proj_qkvz, the experts' w13, gate_up_proj) is filled by several
    # checkpoint tensors, and any one of them makes load_weights name it: so every value starts as NaN
    # and must be overwritten. (vLLM skips its own unloaded-weights check for FP8 checkpoints.)
    watched = {n for n, p in params.items() if n not in defaulted and p.is_floating_point()}
    with torch.no_grad():
        for name in watched:
            params[name].fill_(float("nan"))
    filled, nowhere = set(), []
    quantized = {n.removesuffix("_scale_inv") for n in shapes if n.endswith("weight_scale_inv")}
    try:
        for name in names:
            tensor = _tensor(torch, name, shapes[name], name in quantized)
            # One name per call: what it returns is where this name landed.
            landed = model.load_weights([(name, tensor)])
            if not landed:
                nowhere.append(name)
            filled |= set(landed or ())
    except Exception as exc:
        text, where = describe(exc)
        raise report.fail("load", target, f"{text} (loading {name} {list(shapes[name])})", where) from exc
    # Parameters may be replaced while loading: look them up again.
    params = dict(model.named_parameters())
    unwritten = {}
    for name in sorted(watched & set(params)):
        mask = torch.isnan(params[name].detach().float())
        if bool(mask.any()):
            unwritten[name] = _unwritten(mask)
    # What the sentinel cannot watch (non-float parameters): they must at least have been named.
    missing = sorted(set(params) - watched - defaulted - filled)
    incomplete = incomplete_load(absent, nowhere, unwritten, missing)
    if incomplete:
        raise report.fail("load", target, incomplete)
    text = text_config(tiny)
    scales = sum(1 for n in names if n.endswith("weight_scale_inv"))
    experts = f" and {text['num_experts']} experts" if "num_experts" in text else ""
    layers = text.get("mtp_num_hidden_layers") if head == "mtp" else text["num_hidden_layers"]
    report.check(
        "load",
        target,
        True,
        f"{len(names)} checkpoint tensors ({scales} FP8 weight_scale_inv), all {len(shapes)} the model "
        f"loads, filled every value of {len(params) - len(defaulted)} of {len(params)} parameters "
        f"(the other {len(defaulted)}: KV-cache scales, default 1.0); loaded for the tiny model's "
        f"{layers} layer{'s' if layers != 1 else ''}{experts} only",
    )


# ---------------------------------------------------------------------------------------------------
# Targets and the command line.
# ---------------------------------------------------------------------------------------------------


def fixture_targets(folder: Path) -> list[Target]:
    """Each `<folder>/<name>/config.json` (a full-size config; the tiny model is derived from it)."""
    dirs = sorted(p.parent for p in folder.glob("*/config.json"))
    if not dirs:
        raise UsageError(f"--fixtures {folder}: no <name>/config.json under it")
    return [Target(d.name, d, False) for d in dirs]


def checkpoint_target(snapshot: Path) -> Target:
    """The checkpoint's config.json for (a); a tiny model derived from it; its index's tensor names."""
    config_file, index_file = snapshot / "config.json", snapshot / INDEX_FILE
    for needed in (config_file, index_file):
        if not needed.is_file():
            raise UsageError(
                f"--checkpoint {snapshot}: {needed.name} is missing (is this a snapshot folder?)"
            )
    try:
        json.loads(config_file.read_text())
        index = json.loads(index_file.read_text())
    except ValueError as exc:
        raise UsageError(f"--checkpoint {snapshot}: not valid JSON: {exc}") from exc
    if not isinstance(index.get("weight_map"), dict) or not index["weight_map"]:
        raise UsageError(f"--checkpoint {snapshot}: {INDEX_FILE} has no weight_map")
    # Unknown architectures and quantizations fail in the config stage (naming them), not here.
    return Target(snapshot.name or "checkpoint", snapshot, True)


class UsageError(Exception):
    """Bad arguments: exit 2."""


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="prove_model.py", description=__doc__.splitlines()[0])
    parser.add_argument("--fixtures", type=Path, default=FIXTURES_DIR, help="folder of <name>/config.json")
    parser.add_argument("--checkpoint", type=Path, help="snapshot folder with config.json and the index")
    parser.add_argument("--stages", default=",".join(STAGES), help="comma-separated: config,construct,load")
    parser.add_argument(
        "--shards", action="store_true", help="with --checkpoint: the shards must be there (headers read)"
    )
    args = parser.parse_args(argv)
    stages = [s.strip() for s in args.stages.split(",") if s.strip()]
    bad = [s for s in stages if s not in STAGES]
    if bad or not stages:
        raise UsageError(
            f"--stages: unknown stage(s) {', '.join(bad) or '(none given)'}; choose from {','.join(STAGES)}"
        )
    if "load" in stages and "construct" not in stages:
        raise UsageError("--stages: load needs construct (the weights are loaded into the built model)")
    args.stages = [s for s in STAGES if s in stages]
    return args


def run(args: argparse.Namespace, report: Report) -> int:
    targets = [checkpoint_target(args.checkpoint)] if args.checkpoint else fixture_targets(args.fixtures)
    with tempfile.TemporaryDirectory(prefix="prove_model-") as tmp:
        workdir = Path(tmp)
        # vLLM keeps caches and settings under ~/.cache/vllm and ~/.config/vllm, torch's compiler and
        # Triton theirs in $TMPDIR and ~/.triton: keep them all in here, removed at the end.
        for key, folder in (
            ("VLLM_CACHE_ROOT", "vllm-cache"),
            ("VLLM_CONFIG_ROOT", "vllm-config"),
            ("TORCHINDUCTOR_CACHE_DIR", "torchinductor"),
            ("TRITON_CACHE_DIR", "triton"),
        ):
            os.environ[key] = str(workdir / folder)
        try:
            env = Environment(report)
        except Exception as exc:
            text, where = describe(exc)
            report.fail(
                "environment", "python", f"{text} (this proof needs torch, vLLM and transformers)", where
            )
            return 2
        say(
            f"vLLM {report.vllm}, transformers {report.transformers}, torch {report.torch}; "
            f"stages {','.join(args.stages)}"
        )
        try:
            for target in targets:
                prove_target(env, report, target, args.stages, workdir)
                if args.shards and target.from_index and "load" in args.stages:
                    prove_shards(report, target)
        except ProofFailed:
            return 1
    return 0


def prove_target(env: Environment, report: Report, target: Target, stages: list[str], workdir: Path) -> None:
    """The stages for one fixture or checkpoint; raises ProofFailed at the first failure."""
    raw = target.config()
    report.architecture = (raw.get("architectures") or [None])[0]
    report.model_type, report.quantization = raw.get("model_type"), quant_method(raw)
    if "config" in stages:
        prove_config(env, report, target)
    else:
        try:
            check_supported(raw)
        except ValueError as exc:
            raise report.fail("config", target.name, *describe(exc)) from exc
    if "construct" not in stages:
        return
    for head, tiny in tiny_models(raw):
        name = target.name if head == "model" else f"{target.name}:{tiny['architectures'][0]}"
        names = target.names(tiny, head)
        if head == "mtp" and not any(n.startswith("mtp.") for n in names):
            # A checkpoint whose config declares an MTP head but that ships none serves without
            # speculative decoding; there is nothing of the head to prove.
            report.check("construct", name, True, "no mtp.* tensors in the checkpoint: MTP head not proven")
            continue
        model = prove_construct(env, report, name, tiny, workdir)
        if "load" in stages:
            prove_load(env, report, name, tiny, head, names, model)
        del model
    if "load" in stages and target.from_index:
        prove_index_names(report, target, raw)


def prove_index_names(report: Report, target: Target, raw: dict) -> None:
    """(c) by name, at full size: the index holds exactly the tensors of every layer and expert the
    config implies (the tiny model loads only its own layers and experts)."""
    text = text_config(raw)
    expected, unknown, absent = full_size_names(raw, json.loads((target.config_dir / INDEX_FILE).read_text()))
    if unknown or absent:
        parts = [absent_tensors(absent)] if absent else []
        if unknown:
            parts.append(
                f"{len(unknown)} tensor(s) outside the Qwen3.5 naming scheme: {', '.join(unknown[:8])}"
            )
        raise report.fail("load", target.name, "IncompleteCheckpoint: " + "; ".join(parts) + f"; {REFETCH}")
    experts = f", {text['num_experts']} experts each" if "num_experts" in text else ""
    report.check(
        "load",
        target.name,
        True,
        f"by name: the index holds exactly the {len(expected)} tensors the config implies "
        f"({len(layer_types(text))} layers{experts}); those beyond the tiny model are not loaded",
    )


def prove_shards(report: Report, target: Target) -> None:
    """(d) on disk: every shard the index names is in the snapshot, and its header, as the safetensors
    library vLLM loads it with reads it, holds every tensor the index maps to it. Headers only: cheap
    at any size, and a shard that is missing or cut short fails here instead of at the load."""
    from safetensors import safe_open

    wanted: dict[str, set[str]] = {}
    for name, shard in json.loads((target.config_dir / INDEX_FILE).read_text())["weight_map"].items():
        wanted.setdefault(shard, set()).add(name)
    missing = [shard for shard in sorted(wanted) if not (target.config_dir / shard).is_file()]
    if missing:
        raise report.fail(
            "load", target.name,
            f"MissingShard: {len(missing)} of the {len(wanted)} shard(s) the index names are not in the "
            f"snapshot: {', '.join(missing[:4])}; {REFETCH}",
        )  # fmt: skip
    for shard, names in sorted(wanted.items()):
        try:
            with safe_open(str(target.config_dir / shard), framework="pt") as opened:
                absent = sorted(names - set(opened.keys()))
        except Exception as exc:
            raise report.fail("load", target.name, f"{shard}: {describe(exc)[0]}; {REFETCH}") from exc
        if absent:
            raise report.fail("load", target.name, f"{shard}: {absent_tensors(absent)}; {REFETCH}")
    count = sum(len(names) for names in wanted.values())
    report.check(
        "load", target.name, True, f"shards: all {len(wanted)} present, holding the index's {count} tensors"
    )


def main(argv: list[str] | None = None) -> int:
    # Offline, and nothing reported anywhere: the proof reads only its inputs.
    for key in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "VLLM_NO_USAGE_STATS", "DO_NOT_TRACK"):
        os.environ.setdefault(key, "1")
    report = Report()
    try:
        args = parse_args(sys.argv[1:] if argv is None else argv)
        code = run(args, report)
    except UsageError as exc:
        report.error = f"UsageError: {exc}"
        say(report.error)
        code = 2
    except SystemExit as exc:  # argparse: --help (0) or a usage error (2)
        if exc.code == 0:
            return 0
        report.error = "UsageError: see the usage message above"
        code = 2
    if report.failed_stage:
        say(
            f"VERDICT fail at {report.failed_stage}: {report.error}"
            + (f" (at {report.where})" if report.where else "")
            + f"; vLLM {report.vllm}, transformers {report.transformers}, torch {report.torch}"
        )
    elif code == 0:
        say(
            f"VERDICT pass: {len(report.checks)} checks; vLLM {report.vllm}, "
            f"transformers {report.transformers}, torch {report.torch}"
        )
    print(report.as_json(), flush=True)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
