"""The lab nodes for a test session, and what the lab tiers read off a node: its resource-input dict,
its image tags, its containers.

Shared by tests/lab/, tests/engine/, bench/ and tests/support/node_image_lab.py.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest

import lab
from lab.sessions import lab_session


@contextlib.contextmanager
def session_nodes(names: list[str]) -> Iterator[dict[str, lab.LabNode]]:
    """name -> LabNode for `names`, all running; a lab that cannot start fails the test with the reason
    (never a skip). The last session still using the lab stops what sessions started."""
    with contextlib.ExitStack() as stack:
        try:
            nodes = stack.enter_context(lab_session(names))
        except lab.LabError as exc:
            pytest.fail(f"the lab could not start: {exc}", pytrace=False)
        yield nodes


def node_dict(node: lab.LabNode, **overrides) -> dict:
    """The node as a resource's `node` input (what components/ pass to providers)."""
    return {**lab.node_config(node), "name": node.name, **overrides}


def tags_on(node: lab.LabNode) -> set[str]:
    """Every `repository:tag` the node's Docker holds."""
    return set(lab.docker(node, "images", "--format", "{{.Repository}}:{{.Tag}}").out.split())


def container_ids(nodes: dict[str, lab.LabNode], *, stopped: bool = True) -> dict[str, str]:
    """The project's containers (`qwen35-*`) on these nodes, `node/name` to Docker ID; stopped ones too
    unless `stopped` is False."""
    found = {}
    for node in nodes.values():
        listed = ["ps", "-a"] if stopped else ["ps"]
        for line in lab.docker(node, *listed, "--format", "{{.Names}} {{.ID}}").out.splitlines():
            name, cid = line.split()
            if name.startswith("qwen35-"):
                found[f"{node.name}/{name}"] = cid
    return found
