"""What the lab tiers read off a lab node: its resource-input dict, its image tags, its containers.

Shared by tests/lab/, tests/engine/ and tests/support/node_image_lab.py.
"""

from __future__ import annotations

import lab


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
