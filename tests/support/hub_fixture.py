"""The stand-in Hub (lab/standin_hub.py) serving one generated model repo, as a pytest fixture.

Every tier that fetches a checkpoint declares its Hub with `hub_fixture`: the unit tier (the fetch
program on this machine), the lab (Checkpoint on the lab nodes), the release tier (a release's Hub
client) and the engine tier (the lab stack under `pulumi up`).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from lab.standin_hub import StandinHub, generate_repo


def hub_fixture(repo_id: str, *, shards: int, shard_bytes: int, scope: str = "module", name: str = "hub"):
    """A fixture `name` serving `repo_id`: a repo of `shards` safetensors files of `shard_bytes` each."""

    def served(tmp_path_factory) -> Iterator[StandinHub]:
        repo = generate_repo(tmp_path_factory.mktemp(f"{name}-repo"), shards=shards, shard_bytes=shard_bytes)
        with StandinHub({repo_id: repo}) as hub:
            yield hub

    return pytest.fixture(scope=scope, name=name)(served)
