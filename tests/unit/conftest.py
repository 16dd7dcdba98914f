"""Fixtures shared by the unit tests: the real vLLM release trees (downloaded once, cached); no
Docker daemon of the machine running them."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.vllm_trees import BASE_VERSION, DONOR_VERSION, vllm_tree


@pytest.fixture(autouse=True)
def no_docker_daemon(tmp_path_factory, monkeypatch):
    """Node programs run here ask the Engine API on DOCKER_HOST's socket before the (stand-in) CLI:
    point it at a socket that is not there, so a developer's own daemon never answers a unit test.
    A test that wants an engine sets its own (a stand-in on a unix socket)."""
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path_factory.mktemp('no-engine')}/docker.sock")
    monkeypatch.delenv("DOCKER_CONTEXT", raising=False)


@pytest.fixture(scope="session")
def base_tree() -> Path:
    return vllm_tree(BASE_VERSION)


@pytest.fixture(scope="session")
def donor_tree() -> Path:
    return vllm_tree(DONOR_VERSION)
