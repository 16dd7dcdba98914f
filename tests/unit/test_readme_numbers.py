"""The documented memory figures are the memory fit's own: computed here, found in the page that holds them.

The README states a node's memory; docs/model-support.md holds the check's and the recipe's figures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from components.model_support.memory_fit import (
    GB,
    GB10_MEMORY_GB,
    NodeMemory,
    ServeMemory,
    check_memory_fit,
    memory_fit,
    model_shape,
)

ROOT = Path(__file__).resolve().parents[2]
# Wrapped lines read as one: the figures are looked for in running text.
README = " ".join((ROOT / "README.md").read_text().split())
PAGE = " ".join((ROOT / "docs/model-support.md").read_text().split())
CONFIGURATION = (ROOT / "docs/configuration.md").read_text()
SHAPE = model_shape(json.loads((ROOT / "patches/proof_configs/qwen3_5_moe-fp8/config.json").read_text()))
TWO = [NodeMemory("spark-1"), NodeMemory("spark-2")]
WEIGHTS = 126 * GB  # the page's "~126 GB", counted whole (no MTP or vision bytes left out)
RECIPE = ServeMemory(32768, "fp8", 1, True)


def fit(serve: ServeMemory, nodes=TWO, tp: int = 2, utilization: float = 0.85):
    return memory_fit(WEIGHTS, nodes, tp, 1, utilization, 48, shape=SHAPE, serve=serve)


def test_the_introduction_and_the_code_agree_on_a_node_s_memory():
    assert f"{GB10_MEMORY_GB:g} GB unified memory each" in README
    assert "120 GB unified memory" not in README
    assert f"{GB10_MEMORY_GB:g} GB of unified memory" in " ".join(CONFIGURATION.split())


def test_two_sparks_with_the_recipe():
    recipe = fit(RECIPE)
    rank = recipe.per_node[0]
    assert f"{rank.budget_bytes / GB:.1f} GB budget, {rank.weight_bytes / GB:.0f} GB of weights" in PAGE
    assert f"**{rank.kv_cache_bytes / GB:.1f} GB of KV cache**" in PAGE
    assert f"one 32768-token request {recipe.kv.request_bytes / GB:.2f} GB" in PAGE
    assert f"~{recipe.max_concurrency:.0f} such requests" in PAGE
    assert f"{recipe.kv.bytes_per_token} B per token at fp8, ~{recipe.max_concurrency:.0f} requests" in PAGE
    full = fit(ServeMemory(262144, "fp8", 1, True))
    assert f"{full.kv.request_bytes / GB:.2f} GB at 262144 (~{full.max_concurrency:.0f} at once)" in PAGE
    assert f"adds {full.kv.state_bytes / 1e6:.0f} MB per sequence" in PAGE


def test_fp8_against_bf16_kv():
    fp8, bf16 = fit(ServeMemory(32768, "fp8")), fit(ServeMemory(32768, "auto"))
    assert (
        f"{fp8.kv.bytes_per_token} B per token per rank instead of {bf16.kv.bytes_per_token} (BF16); "
        f"one 32768-token request {fp8.kv.request_bytes / GB:.2f} GB instead of "
        f"{bf16.kv.request_bytes / GB:.2f} GB; ~{fp8.max_concurrency:.0f} requests of 32768 tokens at once "
        f"instead of ~{bf16.max_concurrency:.0f}"
    ) in PAGE


def test_the_spark_recipe_s_utilization():
    low = fit(ServeMemory(262144, "fp8", 1, True), utilization=0.7)
    left = low.per_node[0].kv_cache_bytes / GB
    assert f"leaves {left:.1f} GB of KV cache per rank, ~{low.max_concurrency:.1f}" in PAGE


def test_one_spark_is_refused_with_the_documented_numbers():
    one = fit(RECIPE, nodes=TWO[:1], tp=1)
    rank = one.per_node[0]
    assert f"needs {rank.need_bytes / GB:.1f} GB and has {rank.budget_bytes / GB:.1f} GB" in PAGE
    with pytest.raises(ValueError) as info:
        check_memory_fit(one, 0.85)
    assert f"needs {rank.need_bytes / GB:.1f} GB per GPU, has {rank.budget_bytes / GB:.1f} GB" in str(
        info.value
    )


def table(text: str, header: str) -> list[str]:
    """The rows of the Markdown table that starts with `header`."""
    lines = text.splitlines()
    start = lines.index(header)
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        rows.append(line)
    return rows


def test_the_readme_s_side_by_side_bench_is_the_upgrades_page_s():
    header = "| case | ray | mp | mp, real vLLM |"
    readme = table((ROOT / "README.md").read_text(), header)
    upgrades = table((ROOT / "docs/upgrades.md").read_text(), header)
    assert len(readme) == 7 and readme == upgrades
