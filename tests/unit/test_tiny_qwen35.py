"""The lab's tiny real Qwen3.5-MoE checkpoint (lab/tiny_qwen35.py): deterministic, complete, well formed.

vLLM itself judges it in the lab (tests/lab/test_real_vllm.py); here the format, the naming against the
release tier's independent table, and the constraints vLLM states for this architecture."""

from __future__ import annotations

import json
import struct

import pytest

from lab import tiny_qwen35 as tiny
from tests.release.checkpoint import index_names


def header(data: bytes) -> dict:
    (length,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8 : 8 + length])


def test_the_repo_is_byte_identical_on_every_call():
    assert tiny.files() == tiny.files()


def test_every_tensor_the_release_names_is_in_a_shard_the_index_points_to():
    files = tiny.files()
    index = json.loads(files["model.safetensors.index.json"])
    config = json.loads(files["config.json"])
    # The release tier's table, written independently of prove_model.py's.
    assert sorted(index["weight_map"]) == sorted(index_names(config))
    assert any(n.startswith("mtp.") for n in index["weight_map"]), "no MTP layer"
    assert any(n.startswith("model.visual.") for n in index["weight_map"]), "no vision tower"
    total = 0
    for shard in sorted(set(index["weight_map"].values())):
        data = files[shard]
        head = header(data)
        body = len(data) - 8 - struct.unpack("<Q", data[:8])[0]
        tensors = {k: v for k, v in head.items() if k != "__metadata__"}
        assert {index["weight_map"][k] for k in tensors} == {shard}
        for name, meta in tensors.items():
            count = 1
            for dim in meta["shape"]:
                count *= dim
            assert (
                meta["dtype"] == "BF16" and meta["data_offsets"][1] - meta["data_offsets"][0] == 2 * count
            ), name
        assert max(m["data_offsets"][1] for m in tensors.values()) == body
        total += body
    assert index["metadata"]["total_size"] == total


def bf16_values(data: bytes) -> list[float]:
    widened = b"".join(b"\0\0" + data[i : i + 2] for i in range(0, len(data), 2))
    return [value for (value,) in struct.iter_unpack("<f", widened)]


def test_values_are_small_finite_bf16():
    for value in bf16_values(tiny.tensor_bytes("model.language_model.norm.weight", (256,))):
        assert 2**-8 < abs(value) < 2**-3, value


@pytest.mark.parametrize(
    ("name", "low", "high"),
    [
        ("lm_head.weight", 2**-6, 2**-1),  # x4: logits spread enough that the input decides
        ("model.language_model.embed_tokens.weight", 2**-6, 2**-1),
        ("model.language_model.layers.1.mlp.gate.weight", 2**-4, 2**1),  # x16: decisive routing
        ("model.language_model.layers.1.mlp.shared_expert_gate.weight", 2**-8, 2**-3),
    ],
)
def test_the_kinds_drawn_larger_are_and_no_others(name, low, high):
    for value in bf16_values(tiny.tensor_bytes(name, (512,), tiny.scale_of(name))):
        assert low < abs(value) < high, (name, value)


def test_the_changed_checkpoint_differs_in_one_expert_s_tensor_only():
    plain, changed = tiny.files(), tiny.files(changed=True)
    assert plain == tiny.files() and changed == tiny.files(changed=True)
    differ = sorted(name for name in plain if plain[name] != changed[name])
    (shard,) = differ  # one shard file: the one holding the expert
    header = json.loads(plain[shard][8 : 8 + struct.unpack("<Q", plain[shard][:8])[0]])
    body = 8 + struct.unpack("<Q", plain[shard][:8])[0]
    moved = [
        name
        for name, meta in header.items()
        if name != "__metadata__"
        and plain[shard][body + meta["data_offsets"][0] : body + meta["data_offsets"][1]]
        != changed[shard][body + meta["data_offsets"][0] : body + meta["data_offsets"][1]]
    ]
    assert moved == [tiny.CHANGED_EXPERT]


def test_the_config_is_the_release_s_architecture_cut_to_what_two_ranks_split():
    config = tiny.config()
    text, vision = config["text_config"], config["vision_config"]
    assert config["architectures"] == ["Qwen3_5MoeForConditionalGeneration"]
    assert config["model_type"] == "qwen3_5_moe" and "quantization_config" not in config
    assert (
        text["layer_types"].count("linear_attention") == 3
        and text["layer_types"].count("full_attention") == 1
    )
    assert text["num_experts"] == 4 and text["mtp_num_hidden_layers"] == 1 and vision["depth"] == 2
    for key in ("linear_num_key_heads", "linear_num_value_heads", "num_attention_heads", "num_experts"):
        assert text[key] % 2 == 0, key
    rope = text["rope_parameters"]
    # vLLM's MRotaryEmbedding refuses a model whose sections do not sum to the rotary half-width.
    assert sum(rope["mrope_section"]) == text["head_dim"] * rope["partial_rotary_factor"] / 2


def test_the_tokenizer_holds_every_byte_and_qwen_s_special_tokens_inside_the_vocabulary():
    files = tiny.files()
    tokenizer = json.loads(files["tokenizer.json"])
    config = json.loads(files["config.json"])
    ids = [t["id"] for t in tokenizer["added_tokens"]] + list(tokenizer["model"]["vocab"].values())
    assert sorted(ids) == list(range(len(ids))) and len(ids) <= config["text_config"]["vocab_size"]
    specials = {t["content"]: t["id"] for t in tokenizer["added_tokens"]}
    assert config["text_config"]["eos_token_id"] == specials["<|im_end|>"]
    assert config["image_token_id"] == specials["<|image_pad|>"]
    template = json.loads(files["tokenizer_config.json"])["chat_template"]
    assert "<|im_start|>" in template and "add_generation_prompt" in template
