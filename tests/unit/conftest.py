"""Fixtures shared by the unit tests: the real vLLM release trees (downloaded once, cached)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.vllm_trees import BASE_VERSION, DONOR_VERSION, vllm_tree


@pytest.fixture(scope="session")
def base_tree() -> Path:
    return vllm_tree(BASE_VERSION)


@pytest.fixture(scope="session")
def donor_tree() -> Path:
    return vllm_tree(DONOR_VERSION)
