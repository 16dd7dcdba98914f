"""`pulumi preview` never contacts a node: a 64-node stack's preview under mocks, then every NodeImage's
diff against recorded state, with every way of reaching a node made to fail the test."""

from __future__ import annotations

import copy
import subprocess

import pytest

from components import remote
from components.node_image import NodeImageProvider
from tests.support.program import NODE_IMAGE, run_program, stack_config

NODES = 64


def sixty_four_nodes() -> dict:
    cfg = copy.deepcopy(stack_config("dev"))
    cfg["qwen35-spark:nodes"] = [
        {
            "name": f"spark-{i}",
            "host": f"10.1.{i // 200}.{i % 200 + 1}",
            "fabric_ip": f"192.168.{i // 200}.{i % 200 + 1}",
            **({"role": "head"} if i == 0 else {}),
        }
        for i in range(NODES)
    ]
    cfg["qwen35-spark:serve"] = {**cfg["qwen35-spark:serve"], "tensor_parallel_size": NODES}
    return cfg


@pytest.fixture
def no_node_io(monkeypatch):
    """Any SSH session or process started from here on fails the test."""

    def refuse(*args, **kwargs):
        pytest.fail(f"a node was contacted during preview/diff: {args[:1]}")

    monkeypatch.setattr(subprocess, "Popen", refuse)
    monkeypatch.setattr(subprocess, "run", refuse)
    monkeypatch.setattr(remote.SshTransport, "run", refuse)
    monkeypatch.setattr(remote, "_run_local", refuse)


def test_preview_of_64_nodes_and_every_diff_make_no_ssh_call(no_node_io):
    run = run_program(sixty_four_nodes(), preview=True)
    images = run.by_type(NODE_IMAGE)
    assert len(images) == NODES
    provider = NodeImageProvider()
    for registered in images:
        news = {key: value for key, value in registered.inputs.items() if not key.startswith("__")}
        # The state a previous `up` recorded: the same inputs plus what create observed.
        olds = {
            **news,
            "image_id": "sha256:" + "e" * 64,
            "verified_image_id": "sha256:" + "e" * 64,
            "source_image_id": news.get("source_image_id") or "sha256:" + "e" * 64,
            "store": "classic",
            "source_store": "classic",
        }
        unchanged = provider.diff(registered.name, olds, news)
        assert not unchanged.replaces, registered.name
        rebuilt = {**news, "trigger": "new-build"}
        assert provider.diff(registered.name, olds, rebuilt).replaces == ["trigger"]
        provider.check(olds, news)
    # Each worker copy takes its source's observed image as an input (the head's has none).
    with_source = [r for r in images if r.inputs.get("source_image_id")]
    assert len(with_source) == NODES - 1
