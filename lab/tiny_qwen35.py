"""A tiny, real Qwen3.5-MoE checkpoint that vLLM's CPU build serves: made here, deterministically, in
seconds, with the standard library only.

The config is Qwen3.5-122B-A10B-FP8's own (patches/proof_configs/qwen3_5_moe-fp8/config.json) with its
sizes cut: BF16 (the CPU build has no FP8 block kernels), three Gated DeltaNet layers and one full
attention layer, four experts, the MTP layer and a two-block vision tower, and head counts that two
tensor-parallel ranks can split. The tensors carry the release's Hugging Face names and shapes
(`patches/prove_model.py` `checkpoint_tensors`, the model-support proof's own table; vLLM's loader is the
judge that both are right), in two safetensors shards with an index. The tokenizer is a byte-level BPE
in `tokenizer.json` format with Qwen's special tokens and a ChatML chat template. The values are
pseudo-random BF16 from SHAKE-256 of each tensor's name, a few kinds drawn larger (`SCALES`) so that
the next token depends on the input and a changed expert shows: the output is noise, the mechanics
are real, and what the server computes can be held to another implementation's answer.

    python -m lab.tiny_qwen35 DIR     # writes the repo into DIR
"""

from __future__ import annotations

import copy
import hashlib
import importlib.util
import json
import struct
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE_CONFIG = ROOT / "patches" / "proof_configs" / "qwen3_5_moe-fp8" / "config.json"
PROVE_MODEL = ROOT / "patches" / "prove_model.py"
ARCHITECTURE = "Qwen3_5MoeForConditionalGeneration"
# The repo id the stand-in Hub serves it under.
REPO_ID = "lab/qwen3.5-tiny-moe"
SHARDS = 2

# Text sizes: whole 128-wide blocks; heads divisible by two ranks (linear key/value heads, query heads;
# key/value heads of full attention are replicated when fewer than the ranks).
TEXT = {
    "hidden_size": 256,
    "moe_intermediate_size": 128,
    "shared_expert_intermediate_size": 128,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 64,
    "linear_value_head_dim": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"],
    "num_hidden_layers": 4,
    "mtp_num_hidden_layers": 1,
    "max_position_embeddings": 4096,
    # head_dim x partial_rotary_factor / 2 = 8: the three multimodal rotary sections must sum to it,
    # or vLLM's MRotaryEmbedding refuses the model.
    "rope_parameters": {"mrope_interleaved": True, "mrope_section": [3, 3, 2], "rope_type": "default",
                        "rope_theta": 10000000, "partial_rotary_factor": 0.25},
}  # fmt: skip
VISION = {"depth": 2, "hidden_size": 128, "intermediate_size": 256, "num_heads": 2,
          "num_position_embeddings": 64, "deepstack_visual_indexes": []}  # fmt: skip

# Byte-level BPE: one token per byte (GPT-2's printable mapping), then Qwen's special tokens.
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
                  "<|image_pad|>", "<|video_pad|>")  # fmt: skip
VOCAB_SIZE = 512
# The ChatML turns Qwen's models are trained on, written here for this tokenizer.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['content'] is string %}{{- message['content'] }}"
    "{%- else %}{%- for part in message['content'] %}"
    "{%- if part['type'] == 'text' %}{{- part['text'] }}{%- endif %}"
    "{%- endfor %}{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def special_id(token: str) -> int:
    return 256 + SPECIAL_TOKENS.index(token)


def config() -> dict:
    """The release's config.json with tiny sizes, BF16, and token ids inside the tiny vocabulary."""
    tiny = copy.deepcopy(json.loads(SOURCE_CONFIG.read_text()))
    tiny.pop("quantization_config", None)
    text, vision = tiny["text_config"], tiny["vision_config"]
    text.pop("full_attention_interval", None)
    text.update(copy.deepcopy(TEXT), vocab_size=VOCAB_SIZE, eos_token_id=special_id("<|im_end|>"))
    vision.update(VISION, out_hidden_size=TEXT["hidden_size"])
    tiny.update(
        architectures=[ARCHITECTURE],
        image_token_id=special_id("<|image_pad|>"),
        video_token_id=special_id("<|video_pad|>"),
        vision_start_token_id=special_id("<|vision_start|>"),
        vision_end_token_id=special_id("<|vision_end|>"),
        torch_dtype="bfloat16",
    )
    return tiny


def _prove_model():
    spec = importlib.util.spec_from_file_location("qwen35_prove_model", PROVE_MODEL)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


def tensor_shapes(tiny: dict) -> dict[str, tuple[int, ...]]:
    """Every tensor the served model and its MTP head load, by the release's names."""
    prove = _prove_model()
    return {**prove.checkpoint_tensors(tiny, "model"), **prove.checkpoint_tensors(tiny, "mtp")}


# High bytes of a little-endian BF16 whose exponent is 2^-7 .. 2^-4, either sign: small, finite values.
# A shift of s adds s to each, multiplying the values by 4^s.
def _high(shift: int) -> bytes:
    return bytes((0x3C + shift, 0x3D + shift, 0xBC + shift, 0xBD + shift)[b % 4] for b in range(256))


# Tensors drawn larger than the rest (name suffix -> shift): values of one scale everywhere give
# near-uniform logits (every next token within a few tenths of a nat of the others), and a check of
# the answers would then pass whatever the server computed. With these the next token depends on the
# input, the experts' share of the residual stream is large enough that a wrong expert moves it, and
# the model still answers noise.
# Measured with transformers (float32 against BF16, and one expert changed), 2026-12-07:
# - `lm_head` and `embed_tokens` x4: logits spread about 3.5 nats (0.9 before), the top token 0.2 to
#   3.5 nats above the next;
# - the experts' router (`mlp.gate`) x16: the two experts each token takes are chosen by a clear
#   margin, so BF16's rounding does not flip one (flipped, a token's logprobs moved 3 nats);
# - then BF16 and float32 agree within 0.3 nats at every position of the short prompts, while one
#   expert's down_proj in layer 0 redrawn moves them by 4 to 14 nats.
SCALES: dict[str, int] = {"lm_head.weight": 1, "embed_tokens.weight": 1, "mlp.gate.weight": 2}
# The tensor `changed` redraws (`files(changed=True)`): one expert of the first layer, as a wrong
# shard or a broken MoE kernel would leave it. The answer check must refuse a server that loads it.
CHANGED_EXPERT = "model.language_model.layers.0.mlp.experts.0.down_proj.weight"


def scale_of(name: str) -> int:
    return next((shift for suffix, shift in SCALES.items() if name.endswith(suffix)), 0)


def tensor_bytes(name: str, shape: tuple[int, ...], shift: int | None = None) -> bytes:
    count = 1
    for dim in shape:
        count *= dim
    data = bytearray(hashlib.shake_256(name.encode()).digest(2 * count))
    data[1::2] = bytes(data[1::2]).translate(_high(scale_of(name) if shift is None else shift))
    return bytes(data)


def safetensors(tensors: dict[str, tuple[int, ...]], changed: str | None = None) -> bytes:
    """One safetensors file: an 8-byte header length, the JSON header, the data (BF16); the tensor
    `changed`, if it is here, drawn anew (same shape and scale, other values)."""
    header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name in sorted(tensors):
        drawn = f"{name}#changed" if name == changed else name
        blob = tensor_bytes(drawn, tensors[name], scale_of(name))
        header[name] = {
            "dtype": "BF16",
            "shape": list(tensors[name]),
            "data_offsets": [offset, offset + len(blob)],
        }
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(blobs)


def byte_symbols() -> list[str]:
    """GPT-2's byte-to-character map: every byte as a printable character, in byte order."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    symbols, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            symbols[byte] = chr(byte)
        else:
            symbols[byte] = chr(256 + extra)
            extra += 1
    return [symbols[b] for b in range(256)]


def tokenizer() -> dict:
    """tokenizer.json: byte-level BPE without merges (each byte a token), Qwen's special tokens."""
    vocab = {symbol: index for index, symbol in enumerate(byte_symbols())}
    added = [{"id": special_id(t), "content": t, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for t in SPECIAL_TOKENS]  # fmt: skip
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    model = {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
             "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
             "vocab": vocab, "merges": []}  # fmt: skip
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
            "normalizer": None, "pre_tokenizer": byte_level, "post_processor": None, "decoder": byte_level,
            "model": model}  # fmt: skip


def tokenizer_config() -> dict:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": TEXT["max_position_embeddings"],
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
    }


def files(changed: bool = False) -> dict[str, bytes]:
    """The repo's files: path -> bytes, identical on every call; with `changed`, CHANGED_EXPERT
    drawn anew and every other byte the same."""
    tiny = config()
    shapes = tensor_shapes(tiny)
    names = sorted(shapes)
    split = (len(names) + SHARDS - 1) // SHARDS
    out: dict[str, bytes] = {}
    weight_map, total = {}, 0
    for index in range(SHARDS):
        shard = f"model-{index + 1:05d}-of-{SHARDS:05d}.safetensors"
        part = {name: shapes[name] for name in names[index * split : (index + 1) * split]}
        out[shard] = safetensors(part, CHANGED_EXPERT if changed else None)
        weight_map.update(dict.fromkeys(part, shard))
        total += sum(2 * _count(shape) for shape in part.values())
    index_doc = {"metadata": {"total_size": total}, "weight_map": weight_map}

    def as_json(doc: dict) -> bytes:
        return (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode()

    out["model.safetensors.index.json"] = as_json(index_doc)
    out["config.json"] = as_json(tiny)
    out["generation_config.json"] = as_json(
        {"eos_token_id": [special_id("<|im_end|>"), special_id("<|endoftext|>")], "do_sample": False}
    )
    out["tokenizer.json"] = as_json(tokenizer())
    out["tokenizer_config.json"] = as_json(tokenizer_config())
    return out


def _count(shape: tuple[int, ...]) -> int:
    count = 1
    for dim in shape:
        count *= dim
    return count


def write(directory: Path, changed: bool = False) -> Path:
    """The repo written into `directory` (made if missing); files already there with other names stay."""
    directory.mkdir(parents=True, exist_ok=True)
    for name, data in files(changed).items():
        (directory / name).write_bytes(data)
    return directory


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m lab.tiny_qwen35 DIR", file=sys.stderr)
        return 2
    print(write(Path(args[0])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
