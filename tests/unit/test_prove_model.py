"""patches/prove_model.py without torch: the tiny-model derivation, the checkpoint naming scheme, the
index filter, what it refuses, and its command line (usage errors, a missing environment)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support.patch_modules import PATCHES, load_patch_module

prove = load_patch_module("prove_model")

MOE = json.loads((PATCHES / "proof_configs" / "qwen3_5_moe-fp8" / "config.json").read_text())
DENSE = json.loads((PATCHES / "proof_configs" / "qwen3_5-fp8" / "config.json").read_text())


def test_the_fixtures_are_shaped_like_the_fp8_releases():
    for config in (MOE, DENSE):
        quant = config["quantization_config"]
        assert (quant["quant_method"], quant["weight_block_size"]) == ("fp8", [128, 128])
        assert "text_config" in config and "vision_config" in config
    assert MOE["architectures"] == ["Qwen3_5MoeForConditionalGeneration"]
    assert MOE["text_config"]["num_hidden_layers"] == 48 and MOE["text_config"]["num_experts"] == 256


@pytest.mark.parametrize("config", [MOE, DENSE], ids=["moe", "dense"])
def test_the_tiny_config_keeps_every_layer_kind_and_divides_into_fp8_blocks(config):
    tiny = prove.tiny_config(config)
    text = tiny["text_config"]
    assert text["layer_types"] == ["linear_attention"] * 3 + ["full_attention"]
    assert text["num_hidden_layers"] == 4
    assert tiny["architectures"] == config["architectures"] and tiny["model_type"] == config["model_type"]
    assert tiny["quantization_config"]["quant_method"] == "fp8"
    for key in ("hidden_size", "head_dim", "linear_key_head_dim", "linear_value_head_dim"):
        assert text[key] % 128 == 0, key
    assert tiny["vision_config"]["depth"] == 2
    assert tiny["vision_config"]["out_hidden_size"] == text["hidden_size"]
    assert config["text_config"]["num_hidden_layers"] > 4  # the fixture itself is untouched


def _with_text(config: dict, **text) -> dict:
    changed = json.loads(json.dumps(config))
    changed["text_config"].update(text)
    return changed


def _fused_widths(tiny: dict) -> dict[str, int]:
    """The output widths of the sub-shards vLLM fuses (and the inputs it splits), in the tiny model."""
    text = tiny["text_config"]
    nk, dk = text["linear_num_key_heads"], text["linear_key_head_dim"]
    nv, dv = text["linear_num_value_heads"], text["linear_value_head_dim"]
    heads, kv, hd = text["num_attention_heads"], text["num_key_value_heads"], text["head_dim"]
    return {"q/k of in_proj_qkv": nk * dk, "v of in_proj_qkv, in_proj_z": nv * dv,
            "k/v_proj": kv * hd, "o_proj input": heads * hd}  # fmt: skip


@pytest.mark.parametrize(
    "text",
    [{}, {"linear_key_head_dim": 64}, {"linear_value_head_dim": 64}, {"head_dim": 64}],
    ids=["as-released", "64-wide-linear-key-heads", "64-wide-linear-value-heads", "64-wide-heads"],
)
def test_every_fused_sub_shard_of_the_tiny_model_is_whole_fp8_blocks(text):
    # 64-wide key heads with one key head would give q/k sub-shards half a 128-row block wide.
    config = _with_text(MOE, **text)
    tiny = prove.tiny_config(config)
    for what, width in _fused_widths(tiny).items():
        assert width % 128 == 0, (what, width, tiny["text_config"])
    t = tiny["text_config"]
    assert t["linear_num_value_heads"] % t["linear_num_key_heads"] == 0
    assert t["num_attention_heads"] % t["num_key_value_heads"] == 0
    for key, value in text.items():  # head widths stay the checkpoint's own
        assert t[key] == value


@pytest.mark.parametrize(
    ("original", "least", "widths", "heads"),
    [
        (16, 1, [(64, 128)], 2),  # 16 x 64 is whole blocks: so must the tiny model's be
        (16, 1, [(128, 128)], 1),
        (3, 1, [(64, 128)], 1),  # 3 x 64 is not whole blocks in the checkpoint either
        (1, 1, [(64, 128)], 1),  # never more heads than the checkpoint has
        (256, 2, [(128, 128), (1, 128)], 128),  # one row per head (quantized in_proj_b): 128 heads
        (64, 2, [(1, 128)], 2),  # 64 rows are not whole blocks in the checkpoint: no constraint
        (32, 4, [(512, 128), (64, 256)], 4),
    ],
)
def test_tiny_heads_keeps_block_aligned_totals_aligned(original, least, widths, heads):
    assert prove.tiny_heads(original, least, *widths) == heads


def test_the_tiny_models_sizes_follow_the_checkpoints_block_size():
    config = json.loads(json.dumps(MOE))
    config["quantization_config"]["weight_block_size"] = [256, 128]
    text = prove.tiny_config(config)["text_config"]
    sizes = ("hidden_size", "intermediate_size", "moe_intermediate_size", "shared_expert_intermediate_size")
    for key in sizes:
        assert text[key] % 256 == 0, (key, text[key])
    assert text["linear_num_key_heads"] * text["linear_key_head_dim"] % 256 == 0
    assert text["num_key_value_heads"] * text["head_dim"] % 256 == 0
    vision = prove.tiny_config(config)["vision_config"]
    assert (vision["hidden_size"], vision["intermediate_size"]) == (256, 512)


def test_the_tiny_models_head_counts_stay_those_of_the_released_shape():
    text = prove.tiny_config(MOE)["text_config"]
    counts = ("linear_num_key_heads", "linear_num_value_heads", "num_attention_heads", "num_key_value_heads")
    assert [text[k] for k in counts] == [1, 2, 2, 1]
    assert (text["hidden_size"], text["moe_intermediate_size"]) == (256, 128)


def test_the_names_the_model_loads_are_compared_both_ways():
    shapes = prove.checkpoint_tensors(prove.tiny_config(MOE))
    dropped = "model.language_model.layers.3.self_attn.k_proj.weight_scale_inv"
    names = [n for n in shapes if n != dropped] + ["model.language_model.layers.0.mlp.experts.0.extra"]
    unknown, missing = prove.compare_names(shapes, names)
    assert (unknown, missing) == (["model.language_model.layers.0.mlp.experts.0.extra"], [dropped])
    assert prove.compare_names(shapes, list(shapes)) == ([], [])


def test_the_full_size_index_is_compared_by_name_for_every_layer_and_expert():
    # The tiny model loads 4 experts per layer; expert 200 of layer 40 is proven by its name only.
    names = {**prove.checkpoint_tensors(MOE), **prove.checkpoint_tensors(MOE, "mtp")}
    dropped = "model.language_model.layers.40.mlp.experts.200.up_proj.weight"
    index = {"weight_map": {n: "model-00001.safetensors" for n in names if n != dropped}}
    expected, unknown, absent = prove.full_size_names(MOE, index)
    assert (len(expected), unknown, absent) == (len(names), [], [dropped])
    assert len(expected) == 76656  # what tests/release/checkpoint.py names for the 122B release
    # An index without an MTP head is not asked for one (the head is then reported as not proven).
    no_mtp = {"weight_map": {n: "x" for n in names if not n.startswith("mtp.")}}
    assert prove.full_size_names(MOE, no_mtp)[1:] == ([], [])


@pytest.mark.parametrize(
    ("rows", "text"),
    [
        ([False, False, False], ""),
        ([True, True, False, False], "0-1"),
        ([False, True, False, True, True, False], "1, 3-4"),
        ([True], "0"),
    ],
)
def test_unwritten_ranges_are_named_as_index_runs(rows, text):
    assert prove.index_runs(rows) == text


def test_the_tiny_config_keeps_only_its_own_modules_to_not_convert():
    skipped = prove.tiny_config(MOE)["quantization_config"]["modules_to_not_convert"]
    assert "model.language_model.layers.0.linear_attn.in_proj_a" in skipped
    assert "model.language_model.layers.3.mlp.gate" in skipped
    assert not [s for s in skipped if ".layers.4." in s or ".blocks.2." in s]


def test_the_naming_scheme_names_fp8_scales_only_for_quantized_matrices():
    shapes = prove.checkpoint_tensors(prove.tiny_config(MOE))
    layer = "model.language_model.layers"
    assert shapes[f"{layer}.0.linear_attn.in_proj_qkv.weight_scale_inv"] == (4, 2)  # 512 x 256
    assert shapes[f"{layer}.3.self_attn.q_proj.weight"] == (1024, 256)  # 2 heads x 256 x output gate
    assert f"{layer}.0.linear_attn.in_proj_a.weight_scale_inv" not in shapes  # in modules_to_not_convert
    assert f"{layer}.0.mlp.gate.weight_scale_inv" not in shapes
    assert f"{layer}.0.mlp.experts.3.down_proj.weight_scale_inv" in shapes
    assert f"{layer}.0.mlp.experts.4.down_proj.weight" not in shapes
    assert "lm_head.weight_scale_inv" not in shapes and "lm_head.weight" in shapes
    assert not [n for n in shapes if n.startswith("mtp.")]


def test_the_mtp_head_loads_its_own_layers_and_the_shared_embeddings():
    tiny_models = prove.tiny_models(MOE)
    assert [(head, tiny["architectures"]) for head, tiny in tiny_models] == [
        ("model", ["Qwen3_5MoeForConditionalGeneration"]),
        ("mtp", ["Qwen3_5MoeMTP"]),
    ]
    shapes = prove.checkpoint_tensors(tiny_models[1][1], "mtp")
    assert shapes["mtp.fc.weight"] == (256, 512) and "mtp.fc.weight_scale_inv" not in shapes
    assert "mtp.layers.0.self_attn.q_proj.weight_scale_inv" in shapes
    assert "model.language_model.embed_tokens.weight" in shapes and "lm_head.weight" in shapes
    assert not [n for n in shapes if n.startswith(("model.visual.", "model.language_model.layers."))]


def test_the_index_filter_keeps_the_tiny_models_layers_experts_and_blocks():
    tiny = prove.tiny_config(MOE)
    weight_map = {
        name: "model-00001.safetensors"
        for name in (
            "model.language_model.layers.3.mlp.experts.1.up_proj.weight",
            "model.language_model.layers.4.mlp.experts.1.up_proj.weight",
            "model.language_model.layers.0.mlp.experts.255.up_proj.weight",
            "model.visual.blocks.1.attn.qkv.weight",
            "model.visual.blocks.26.attn.qkv.weight",
            "mtp.layers.0.mlp.gate.weight",
            "lm_head.weight",
        )
    }
    assert prove.index_names_for(tiny, {"weight_map": weight_map}) == [
        "lm_head.weight",
        "model.language_model.layers.3.mlp.experts.1.up_proj.weight",
        "model.visual.blocks.1.attn.qkv.weight",
    ]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"architectures": ["LlamaForCausalLM"]}, "unknown architecture 'LlamaForCausalLM'"),
        ({"architectures": []}, "exactly one architecture"),
        ({"model_type": "qwen3_5"}, "config says 'qwen3_5'"),
        ({"quantization_config": {"quant_method": "awq"}}, "unknown quantization method 'awq'"),
    ],
)
def test_what_the_proof_cannot_derive_is_refused_by_name(change, message):
    with pytest.raises(ValueError, match=message):
        prove.check_supported({**MOE, **change})


def test_describe_names_the_innermost_vllm_or_transformers_frame(tmp_path):
    source = tmp_path / "site-packages" / "vllm" / "model_executor" / "layers" / "x.py"
    source.parent.mkdir(parents=True)
    source.write_text("def f():\n    assert 1 == 2\n")
    namespace: dict = {}
    exec(compile(source.read_text(), str(source), "exec"), namespace)
    with pytest.raises(AssertionError) as caught:
        namespace["f"]()
    error, where = prove.describe(caught.value)
    assert where == "vllm/model_executor/layers/x.py:2"
    assert error == "AssertionError: assert 1 == 2"  # a bare assert's message is its source line


def test_describe_names_the_vllm_caller_of_a_transformers_frame():
    namespace: dict = {}
    exec(compile("def inner():\n    return [] | set()\n", "/site/transformers/rope.py", "exec"), namespace)
    exec(compile("def outer():\n    return inner()\n", "/site/vllm/configs/q.py", "exec"), namespace)
    with pytest.raises(TypeError) as caught:
        namespace["outer"]()
    error, where = prove.describe(caught.value)
    assert where == "transformers/rope.py:2 (from vllm/configs/q.py:2)"
    assert error == "TypeError: unsupported operand type(s) for |: 'list' and 'set'"


def run(*args: str) -> tuple[int, dict, str]:
    done = subprocess.run(
        [sys.executable, str(PATCHES / "prove_model.py"), *args], capture_output=True, text=True, timeout=60
    )
    return done.returncode, json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


def test_without_torch_the_environment_stage_fails_with_exit_2():
    code, report, stderr = run()  # this venv has neither torch nor vLLM
    assert code == 2 and report["verdict"] == "fail" and report["failed_stage"] == "environment"
    assert report["error"].startswith("ModuleNotFoundError: No module named") and "VERDICT fail" in stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--stages", "config,bake"], "unknown stage(s) bake"),
        (["--stages", "config,load"], "load needs construct"),
        (["--fixtures", "/nonexistent-fixtures"], "no <name>/config.json"),
        (["--checkpoint", "/nonexistent-snapshot"], "config.json is missing"),
    ],
)
def test_usage_errors_exit_2_with_a_report_naming_the_argument(args, message):
    code, report, _ = run(*args)
    assert code == 2 and report["verdict"] == "fail" and message in report["error"]
