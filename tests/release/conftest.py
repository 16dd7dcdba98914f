"""Session fixtures of the real-release tier: the venvs and overlays (made once per machine, minutes the
first time), a venv that cannot be made fails the tests with the reason; nothing here is skipped."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.release.releases import ReleaseError, hybrid_overlay, release_venv, transformers_overlay
from tests.support.vllm_trees import DONOR_VERSION, VllmTreeError, vllm_tree

PREBUILT_VERSION = "0.17.1"  # a vLLM with native Qwen3.5 support, used as is
SEED_BASE_VERSION = "0.14.0"  # the seed's base image's vLLM
SEED_TRANSFORMERS = "5.2.0"  # what the seed's Dockerfile installs over it


def _made(what: str, make):
    try:
        return make()
    except (ReleaseError, VllmTreeError) as exc:
        pytest.fail(f"{what} could not be made: {exc}", pytrace=False)


@pytest.fixture(scope="session")
def prebuilt() -> Path:
    """The python of vLLM 0.17.1 installed from PyPI: what a prebuilt image holds."""
    return _made(f"the vLLM {PREBUILT_VERSION} venv", lambda: release_venv(PREBUILT_VERSION))


@pytest.fixture(scope="session")
def seed_base() -> Path:
    return _made(f"the vLLM {SEED_BASE_VERSION} venv", lambda: release_venv(SEED_BASE_VERSION))


@pytest.fixture(scope="session")
def seed_hybrid(seed_base: Path) -> Path:
    """The PYTHONPATH overlay that turns the 0.14.0 venv into the seed's hybrid (donor files, patched)."""
    return _made("the seed's hybrid overlay", lambda: hybrid_overlay(seed_base, vllm_tree(DONOR_VERSION)))


@pytest.fixture(scope="session")
def transformers5(seed_base: Path) -> Path:
    return _made(
        f"the transformers {SEED_TRANSFORMERS} overlay",
        lambda: transformers_overlay(SEED_TRANSFORMERS, seed_base),
    )
