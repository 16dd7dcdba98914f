"""The memory-fit preflight as a table: the checkpoint's weights over TP × PP ranks against each node."""

from __future__ import annotations

import pytest

from components.memory_fit import (
    GB,
    MIN_KV_CACHE_GB,
    RUNTIME_RESERVE_GB,
    MemoryFitError,
    NodeMemory,
    check_memory_fit,
    memory_fit,
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
