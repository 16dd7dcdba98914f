"""The memory-fit preflight as a table: the checkpoint's weights over TP × PP ranks against each node."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from components.model_support.errors import MemoryFitError
from components.model_support.memory_fit import (
    GB,
    MIN_KV_CACHE_GB,
    RUNTIME_RESERVE_GB,
    ModelShape,
    NodeMemory,
    ServeMemory,
    check_memory_fit,
    kv_sizing,
    memory_fit,
    model_shape,
    rank_budget_bytes,
    rank_weight_bytes,
)

# Qwen3.5-122B-A10B-FP8: ~250 GB in BF16, FP8 experts and attention, BF16 embeddings, norms, router,
# vision encoder: about 126 GB on disk (the check reads the exact figure from the index). 48 layers.
QWEN35_122B_FP8 = 126 * GB
LAYERS = 48
SPARK = NodeMemory("spark-1")
SPARK2 = NodeMemory("spark-2")
FOUR = [NodeMemory(f"spark-{i}") for i in range(1, 5)]

FIT_TABLE = [
    # (case, weight bytes, nodes, tp, pp, utilization, layers, fits)
    ("122B FP8 over two GB10s, TP 2", QWEN35_122B_FP8, [SPARK, SPARK2], 2, 1, 0.85, LAYERS, True),
    ("122B FP8 over two GB10s, PP 2", QWEN35_122B_FP8, [SPARK, SPARK2], 1, 2, 0.85, LAYERS, True),
    ("122B FP8 on one GB10", QWEN35_122B_FP8, [SPARK], 1, 1, 0.85, LAYERS, False),
    # Utilization cannot buy back the operating system's share: capped at 128 - 8 = 120 GB.
    ("122B FP8 on one GB10 at 0.99", QWEN35_122B_FP8, [SPARK], 1, 1, 0.99, LAYERS, False),
    ("122B FP8 over four GB10s", QWEN35_122B_FP8, FOUR, 4, 1, 0.85, LAYERS, True),
    ("two GB10s at a low utilization", QWEN35_122B_FP8, [SPARK, SPARK2], 2, 1, 0.5, LAYERS, False),
    ("a 100 GB model on one GB10 at 0.85", 100 * GB, [SPARK], 1, 1, 0.85, None, True),
    # Two GPUs on one node share its memory.
    (
        "two GPUs on one 128 GB node",
        QWEN35_122B_FP8,
        [NodeMemory("big", 128, gpus=2)],
        2,
        1,
        0.85,
        LAYERS,
        False,
    ),
    (
        "two GPUs on one 256 GB node",
        QWEN35_122B_FP8,
        [NodeMemory("big", 256, gpus=2)],
        2,
        1,
        0.85,
        LAYERS,
        True,
    ),
    # A node declared smaller than the rest fails alone.
    ("one small node", QWEN35_122B_FP8, [SPARK, NodeMemory("small", 64)], 2, 1, 0.85, LAYERS, False),
]


@pytest.mark.parametrize(
    ("case", "weights", "nodes", "tp", "pp", "util", "layers", "fits"),
    FIT_TABLE,
    ids=[f[0] for f in FIT_TABLE],
)
def test_fit_table(case, weights, nodes, tp, pp, util, layers, fits):
    fit = memory_fit(weights, nodes, tp, pp, util, layers)
    assert fit.fits is fits, fit.summary()
    assert fit.ranks == tp * pp
    if fits:
        assert check_memory_fit(fit, util) is fit
    else:
        with pytest.raises(MemoryFitError) as info:
            check_memory_fit(fit, util)
        message = str(info.value)
        assert f"{weights / GB:.1f} GB of weights" in message
        for node in fit.per_node:
            assert (f"  {node.node}: needs" in message) is (not node.fits)
        assert "next:" in message


def test_the_numbers_of_two_sparks():
    fit = memory_fit(QWEN35_122B_FP8, [SPARK, SPARK2], 2, 1, 0.85, LAYERS)
    rank = fit.per_node[0]
    assert rank.weight_bytes == 63 * GB
    assert rank.budget_bytes == int(128 * 0.85 * GB)
    assert rank.need_bytes == (63 + RUNTIME_RESERVE_GB + MIN_KV_CACHE_GB) * GB
    summary = fit.summary()
    assert summary["per_rank"]["spark-1"] == {"budget_gb": 108.8, "weights_gb": 63.0, "kv_cache_gb": 41.8}
    assert summary["fits"] is True and summary["weights_gb"] == 126.0


def test_one_spark_error_names_the_node_and_both_numbers():
    fit = memory_fit(QWEN35_122B_FP8, [SPARK], 1, 1, 0.85, LAYERS)
    with pytest.raises(MemoryFitError) as info:
        check_memory_fit(fit, 0.85)
    assert "spark-1: needs 132.0 GB per GPU, has 108.8 GB" in str(info.value)


@pytest.mark.parametrize(
    ("layers", "pp", "share"),
    [
        (48, 2, 1 / 2),  # even split
        (48, 3, 1 / 3),
        (3, 2, 2 / 3),  # the larger stage has 2 of 3 layers
        (49, 2, 25 / 49),
        (None, 2, 1 / 2),  # layer count unknown: an even split
        (48, 1, 1.0),
    ],
)
def test_pipeline_parallel_splits_the_layers(layers, pp, share):
    assert rank_weight_bytes(1_000_000 * 49 * 3, 1, pp, layers) == pytest.approx(
        1_000_000 * 49 * 3 * share, abs=1
    )


def test_tensor_parallel_divides_each_stage():
    assert rank_weight_bytes(120 * GB, 4, 1) == 30 * GB
    assert rank_weight_bytes(120 * GB, 2, 2, 48) == 30 * GB


def test_uneven_pipeline_stages_can_decide_the_fit():
    # 3 layers over PP 2: the 2-layer stage holds 2/3 of the weights, not half.
    nodes = [NodeMemory("a", 100), NodeMemory("b", 100)]
    weights = 120 * GB  # even split: 60 + 6 <= 85 fits; the 2-layer stage: 80 + 6 > 85 does not
    assert memory_fit(weights, nodes, 1, 2, 0.85, None).fits
    assert not memory_fit(weights, nodes, 1, 2, 0.85, 3).fits


def test_budget_is_capped_below_the_operating_systems_share():
    assert rank_budget_bytes(SPARK, 0.5) == 64 * GB
    assert rank_budget_bytes(SPARK, 1.0) == 120 * GB
    assert rank_budget_bytes(NodeMemory("x", 256, gpus=4), 0.5) == 32 * GB


def test_nodes_without_gpus_run_no_rank():
    fit = memory_fit(10 * GB, [SPARK, NodeMemory("cpu-only", 16, gpus=0)], 1, 1, 0.85)
    assert [n.node for n in fit.per_node] == ["spark-1"]


@pytest.mark.parametrize(("tp", "pp"), [(0, 1), (1, 0)])
def test_parallel_sizes_must_be_positive(tp, pp):
    with pytest.raises(ValueError, match="≥ 1"):
        rank_weight_bytes(GB, tp, pp)


# ---- the KV cache one request needs (config.json) ------------------------------------------------------

FIXTURES = Path(__file__).resolve().parents[2] / "patches" / "proof_configs"
MOE_122B = model_shape(json.loads((FIXTURES / "qwen3_5_moe-fp8" / "config.json").read_text()))
DENSE_27B = model_shape(json.loads((FIXTURES / "qwen3_5-fp8" / "config.json").read_text()))
# A dense BF16 model with full attention in every layer (Qwen3-32B's sizes): 64 layers, 8 KV heads of 128.
DENSE_BF16 = model_shape(
    {
        "num_hidden_layers": 64,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "torch_dtype": "bfloat16",
        "max_position_embeddings": 40960,
    }
)
RECIPE = ServeMemory(
    max_model_len=32768, kv_cache_dtype="fp8", speculative_tokens=1, language_model_only=True
)


def test_the_122b_shape_counts_only_its_full_attention_layers():
    assert (
        ModelShape(
            full_attention_layers=12,
            num_kv_heads=2,
            head_dim=256,
            dtype_bytes=2,
            linear_layers=36,
            linear_conv_dim=2 * 16 * 128 + 64 * 128,
            linear_conv_kernel=4,
            linear_state_elems=64 * 128 * 128,
            max_position_embeddings=262144,
            mtp_layers=1,
        )
        == MOE_122B
    )
    kv = kv_sizing(MOE_122B, RECIPE, tp=2, pp=1)
    # 12 full-attention layers + the MTP layer, K and V, 1 KV head per rank (2 over TP 2), 256, fp8.
    assert kv.bytes_per_token == 13 * 2 * 1 * 256 * 1
    # 36 gated-delta layers: conv state (12288 channels × 3) + recurrent state (64 × 128 × 128), BF16, / TP.
    assert kv.state_bytes == 36 * (12288 * 3 + 64 * 128 * 128) * 2 // 2
    assert kv.request_bytes == (32768 + 1) * kv.bytes_per_token + kv.state_bytes
    bf16 = kv_sizing(MOE_122B, ServeMemory(max_model_len=32768), tp=2, pp=1)
    assert bf16.bytes_per_token == 12 * 2 * 1 * 256 * 2  # auto: the model's BF16; no MTP layer


# (case, weights, nodes, tp, shape, serve, utilization, fits with the flat floor, fits by KV cache)
KV_TABLE = [
    ("122B recipe on two Sparks", QWEN35_122B_FP8, [SPARK, SPARK2], 2, MOE_122B, RECIPE, 0.85, True, True),
    (
        "122B at its full 262144 context, BF16 KV",
        QWEN35_122B_FP8,
        [SPARK, SPARK2],
        2,
        MOE_122B,
        ServeMemory(max_model_len=None),
        0.85,
        True,
        True,
    ),
    # The flat 2 GB floor says "fits"; one 40960-token request needs 10.7 GB of BF16 KV cache.
    (
        "dense BF16 32B on one node at 0.6",
        int(65.5 * GB),
        [SPARK],
        1,
        DENSE_BF16,
        ServeMemory(max_model_len=None),
        0.6,
        True,
        False,
    ),
    (
        "dense BF16 32B on one node at 0.6, fp8 KV",
        int(65.5 * GB),
        [SPARK],
        1,
        DENSE_BF16,
        ServeMemory(max_model_len=None, kv_cache_dtype="fp8"),
        0.6,
        True,
        True,
    ),
    (
        "dense BF16 32B on one node at 0.6, 16k context",
        int(65.5 * GB),
        [SPARK],
        1,
        DENSE_BF16,
        ServeMemory(max_model_len=16384),
        0.6,
        True,
        True,
    ),
    (
        "27B FP8 dense hybrid on one node at 0.35",
        29 * GB,
        [SPARK],
        1,
        DENSE_27B,
        ServeMemory(max_model_len=262144),
        0.35,
        True,
        False,
    ),
]


@pytest.mark.parametrize(
    ("case", "weights", "nodes", "tp", "shape", "serve", "util", "floor_fits", "fits"),
    KV_TABLE,
    ids=[k[0] for k in KV_TABLE],
)
def test_kv_cache_table(case, weights, nodes, tp, shape, serve, util, floor_fits, fits):
    assert memory_fit(weights, nodes, tp, 1, util).fits is floor_fits
    fit = memory_fit(weights, nodes, tp, 1, util, shape=shape, serve=serve)
    assert fit.fits is fits, fit.summary()
    assert (fit.max_concurrency >= 1) is fits
    if not fits:
        with pytest.raises(MemoryFitError) as info:
            check_memory_fit(fit, util)
        message = str(info.value)
        assert f"max_model_len {fit.kv.max_model_len} tokens" in message
        assert "next: a smaller serve.max_model_len, a higher serve.gpu_memory_utilization" in message
        assert ("serve.kv_cache_dtype: fp8" in message) is (serve.kv_cache_dtype == "auto")
        longest = fit.kv.longest_fitting(fit.per_node[0].kv_cache_bytes)
        assert f"holds max_model_len {longest} at most" in message
        assert memory_fit(
            weights, nodes, tp, 1, util, shape=shape, serve=replace(serve, max_model_len=longest)
        ).fits
        too_long = replace(serve, max_model_len=longest + 1)
        assert not memory_fit(weights, nodes, tp, 1, util, shape=shape, serve=too_long).fits


def test_the_recipe_on_two_sparks_reports_the_concurrency_vllm_prints():
    mtp, vision = int(2.4 * GB), int(0.9 * GB)
    fit = memory_fit(
        QWEN35_122B_FP8, [SPARK, SPARK2], 2, 1, 0.85, LAYERS,
        shape=MOE_122B, serve=RECIPE, mtp_bytes=mtp, vision_bytes=vision,
    )  # fmt: skip
    # Speculative decoding on: the MTP head is loaded; language_model_only: the vision encoder is not.
    assert fit.loaded_weight_bytes == QWEN35_122B_FP8 - vision
    rank = fit.per_node[0]
    assert rank.max_concurrency == pytest.approx(rank.kv_cache_bytes / fit.kv.request_bytes)
    summary = fit.summary()
    assert summary["max_model_len"] == 32768 and summary["kv_cache_dtype"] == "fp8"
    assert summary["max_concurrency"] == round(rank.max_concurrency, 2) > 100
    assert summary["per_rank"]["spark-1"]["max_concurrency"] == summary["max_concurrency"]
    off = memory_fit(QWEN35_122B_FP8, [SPARK, SPARK2], 2, 1, 0.85, LAYERS, shape=MOE_122B,
                     serve=ServeMemory(max_model_len=32768), mtp_bytes=mtp, vision_bytes=vision)  # fmt: skip
    assert off.loaded_weight_bytes == QWEN35_122B_FP8 - mtp


def test_only_the_mtp_method_loads_the_mtp_head_and_its_attention_layer():
    ngram = ServeMemory(
        max_model_len=32768, kv_cache_dtype="fp8", speculative_tokens=3, speculative_method="ngram"
    )
    fit = memory_fit(QWEN35_122B_FP8, [SPARK, SPARK2], 2, 1, 0.85, shape=MOE_122B, serve=ngram, mtp_bytes=GB)
    assert fit.loaded_weight_bytes == QWEN35_122B_FP8 - GB
    assert fit.kv.bytes_per_token == 12 * 2 * 256 and fit.kv.speculative_tokens == 3
    old_name = replace(ngram, speculative_method="qwen3_5_mtp")
    assert kv_sizing(MOE_122B, old_name, 2, 1).bytes_per_token == 13 * 2 * 256


def test_a_config_without_attention_sizes_falls_back_to_the_floor_and_says_so():
    assert model_shape({"architectures": ["X"], "model_type": "qwen3_5_moe"}) is None
    fit = memory_fit(10 * GB, [SPARK], 1, 1, 0.85, shape=None, serve=RECIPE)
    assert fit.kv is None and fit.per_node[0].request_bytes == MIN_KV_CACHE_GB * GB
    assert "flat floor" in fit.summary()["kv_sizing"] and fit.summary()["max_concurrency"] is None
