"""The lab: Docker daemons on this machine, each behind its own OpenSSH server, standing in for Sparks.

from lab import up, docker
nodes = up(["node-a", "node-b"])
docker(nodes["node-a"], "info")
"""

from __future__ import annotations

import dataclasses

from lab.images import busybox_image, debian_image
from lab.layout import NODE_NAMES, NODE_SPECS, LabError, LabNode, NodeSpec, door_port
from lab.nodes import down, running_nodes, spare_address, status, up
from lab.remote import Result, docker, on_node, pipeline, remote_command, ssh_argv, ssh_options


def node_config(node: LabNode) -> dict:
    """The NodeImage/stack node dict for a lab node (with `proxy_jump` for a node behind a jump)."""
    config = {
        "host": node.host,
        "port": node.port,
        "user": node.user,
        "identity_file": node.identity_file,
        "known_hosts": node.known_hosts,
        "fabric_host": node.host,  # the lab's "fabric" is loopback: the node's own address
    }
    if node.proxy_jump:
        config["proxy_jump"] = node.proxy_jump
    return config


def via_door(jump: LabNode) -> LabNode:
    """The jump node (node-a) reached at its second door: its sessions see node-e's network, so it can
    serve as the source of a copy onto node-e, as spark-1 does for spark-2."""
    return dataclasses.replace(jump, port=door_port())


__all__ = [
    "NODE_NAMES",
    "NODE_SPECS",
    "LabError",
    "LabNode",
    "NodeSpec",
    "Result",
    "busybox_image",
    "debian_image",
    "docker",
    "down",
    "node_config",
    "on_node",
    "pipeline",
    "remote_command",
    "running_nodes",
    "spare_address",
    "ssh_argv",
    "ssh_options",
    "status",
    "up",
    "via_door",
]
