"""From validated config to how each node is reached: SSH targets and Docker provider settings."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from components.config import NodeConfig, StackConfig
from components.remote import SshTarget, ssh_options


@dataclass(frozen=True)
class NodeAccess:
    """One node as the program reaches it: its config, its SSH target, its Docker host URL."""

    node: NodeConfig
    target: SshTarget

    @property
    def name(self) -> str:
        return self.node.name

    @property
    def docker_host(self) -> str:
        return f"ssh://{self.target.user}@{self.target.host}:{self.target.port}"

    def docker_ssh_opts(self) -> list[str]:
        """Options the docker provider hands to its ssh: the same pinned-key options we use."""
        return ssh_options(self.target)

    def node_image_dict(self) -> dict:
        """The node dict the NodeImage provider takes (plain values, so it pickles and diffs)."""
        return {
            "name": self.node.name,
            "host": self.target.host,
            "port": self.target.port,
            "user": self.target.user,
            "identity_file": self.target.identity_file,
            "known_hosts": self.target.known_hosts,
            "proxy_jump": self.target.proxy_jump,
            "fabric_host": self.node.fabric_ip,
            "image_store": self.node.image_store,
        }


def node_access(config: StackConfig) -> dict[str, NodeAccess]:
    """Every node's access, in config order (the head is `config.head`)."""
    result = {}
    for node in config.nodes:
        target = SshTarget(
            host=node.host,
            user=config.node_user(node),
            port=config.node_port(node),
            known_hosts=config.ssh.known_hosts,
            identity_file=config.ssh.identity_file,
            proxy_jump=config.jump_spec(node),
            name=node.name,
        )
        result[node.name] = NodeAccess(node=node, target=target)
    return result


def target_from_dict(raw: Mapping[str, Any], connect_timeout: int = 10) -> SshTarget:
    """The SshTarget of a node dict as `NodeAccess.node_image_dict` writes it (and state keeps it)."""
    return SshTarget(
        host=str(raw["host"]),
        user=str(raw.get("user") or "root"),
        port=int(raw.get("port") or 22),
        known_hosts=str(raw["known_hosts"]),
        identity_file=raw.get("identity_file") or None,
        proxy_jump=raw.get("proxy_jump") or None,
        name=str(raw.get("name") or ""),
        connect_timeout=connect_timeout,
    )
