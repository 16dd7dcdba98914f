"""A checkpoint snapshot without weights, as the model-support check sees one: the config.json of
Qwen/Qwen3.5-122B-A10B-FP8 (patches/proof_configs/qwen3_5_moe-fp8, shaped like the published one) and a
model.safetensors.index.json naming every tensor the way Qwen's FP8 release names them.

The naming is written here from the release's description, independently of prove_model.py's own
naming scheme, so that a wrong name in either one shows up as a failed load.
"""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path

from tests.release.releases import PATCHES

CONFIG = PATCHES / "proof_configs" / "qwen3_5_moe-fp8" / "config.json"

# Per layer kind: the modules with weights; FP8 ones also carry `weight_scale_inv` unless the config's
# modules_to_not_convert lists them. Tensors that are not matrices are listed with their full suffix.
LINEAR_ATTENTION = ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj")
LINEAR_ATTENTION_TENSORS = ("conv1d.weight", "A_log", "dt_bias", "norm.weight")
FULL_ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
FULL_ATTENTION_TENSORS = ("q_norm.weight", "k_norm.weight")
EXPERT = ("gate_proj", "up_proj", "down_proj")
VISION_BLOCK = ("attn.qkv", "attn.proj", "mlp.linear_fc1", "mlp.linear_fc2")
MTP_NORMS = ("norm", "pre_fc_norm_embedding", "pre_fc_norm_hidden")


def real_config() -> dict:
    return json.loads(CONFIG.read_text())


def index_names(config: dict) -> list[str]:
    """Every tensor name of the checkpoint's safetensors index for this config."""
    text, vision = config["text_config"], config["vision_config"]
    skip = set(config.get("quantization_config", {}).get("modules_to_not_convert", []))
    fp8 = config.get("quantization_config", {}).get("quant_method") == "fp8"
    names: list[str] = []

    def weights(module: str, bias: bool = False) -> None:
        names.append(f"{module}.weight")
        if bias:
            names.append(f"{module}.bias")
        if fp8 and module not in skip:
            names.append(f"{module}.weight_scale_inv")

    def decoder_layer(layer: str, kind: str) -> None:
        names.extend([f"{layer}.input_layernorm.weight", f"{layer}.post_attention_layernorm.weight"])
        if kind == "linear_attention":
            for module in LINEAR_ATTENTION:
                weights(f"{layer}.linear_attn.{module}")
            names.extend(f"{layer}.linear_attn.{t}" for t in LINEAR_ATTENTION_TENSORS)
        else:
            for module in FULL_ATTENTION:
                weights(f"{layer}.self_attn.{module}")
            names.extend(f"{layer}.self_attn.{t}" for t in FULL_ATTENTION_TENSORS)
        weights(f"{layer}.mlp.gate")
        weights(f"{layer}.mlp.shared_expert_gate")
        for module in EXPERT:
            weights(f"{layer}.mlp.shared_expert.{module}")
            for e in range(text["num_experts"]):
                weights(f"{layer}.mlp.experts.{e}.{module}")

    lm = "model.language_model"
    names += [f"{lm}.embed_tokens.weight", f"{lm}.norm.weight"]
    weights("lm_head")
    for i, kind in enumerate(text["layer_types"]):
        decoder_layer(f"{lm}.layers.{i}", kind)
    # The MTP head: a fusion layer and full-attention decoder layers of its own.
    weights("mtp.fc")
    names += [f"mtp.{norm}.weight" for norm in MTP_NORMS]
    for i in range(text["mtp_num_hidden_layers"]):
        decoder_layer(f"mtp.layers.{i}", "full_attention")
    visual = "model.visual"
    names += [
        f"{visual}.patch_embed.proj.weight",
        f"{visual}.patch_embed.proj.bias",
        f"{visual}.pos_embed.weight",
    ]
    for b in range(vision["depth"]):
        for norm in ("norm1", "norm2"):
            names += [f"{visual}.blocks.{b}.{norm}.weight", f"{visual}.blocks.{b}.{norm}.bias"]
        for module in VISION_BLOCK:
            weights(f"{visual}.blocks.{b}.{module}", bias=True)
    names += [f"{visual}.merger.norm.weight", f"{visual}.merger.norm.bias"]
    weights(f"{visual}.merger.linear_fc1", bias=True)
    weights(f"{visual}.merger.linear_fc2", bias=True)
    return names


def write_checkpoint(folder: Path, config: dict | None = None, names: list[str] | None = None) -> Path:
    """A snapshot folder with config.json and model.safetensors.index.json (39 shards, as published)."""
    config = copy.deepcopy(config or real_config())
    names = index_names(config) if names is None else names
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    (folder / "model.safetensors.index.json").write_text(json.dumps(_index(names)))
    return folder


def write_hf_cache(root: Path, config: dict | None = None, names: list[str] | None = None) -> Path:
    """The same checkpoint as the Hugging Face cache keeps it (`models--Qwen--…/blobs/<hash>`, a snapshot
    of relative links, `refs/main`), read-only as the model-support check mounts it; the snapshot."""
    repo = root / "hub" / "models--Qwen--Qwen3.5-122B-A10B-FP8"
    flat = write_checkpoint(root / "flat", config, names)
    commit = hashlib.sha1(b"qwen35-release-tier").hexdigest()
    snapshot = repo / "snapshots" / commit
    (repo / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    for source in sorted(flat.iterdir()):
        blob = repo / "blobs" / hashlib.sha1(source.read_bytes()).hexdigest()
        source.rename(blob)
        blob.chmod(0o444)
        (snapshot / source.name).symlink_to(f"../../blobs/{blob.name}")
    flat.rmdir()
    for folder in (snapshot, repo / "blobs"):
        folder.chmod(0o555)
    return snapshot


def _index(names: list[str]) -> dict:
    shards = 39
    weight_map = {
        name: f"model-{i * shards // len(names) + 1:05d}-of-{shards:05d}.safetensors"
        for i, name in enumerate(names)
    }
    return {"metadata": {"total_size": 125_700_000_000}, "weight_map": weight_map}
