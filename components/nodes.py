"""From validated config to how each node is reached: SSH targets and Docker provider settings.

A node is one of these, by layer (each a view of the same `nodes[]` entry, never a copy to keep in
step by hand):
- `NodeConfig` (components/config/nodes.py): what the operator wrote, validated;
- `NodeAccess` (here): that config with its SSH target, as the program reaches the node;
- `NodeDict` (here): the plain values a node resource takes and state keeps;
- `SshTarget` (components/remote.py): how one ssh command reaches it;
- `transfer.Endpoint` and `node_image.inputs.Node`: a NodeDict parsed back by a provider.
Its fabric address is `fabric_ip` in config and `fabric_host` in a NodeDict (and an Endpoint): the
state key predates the config key, and renaming it would change every node resource's inputs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypedDict

from components.config import NodeConfig, StackConfig
from components.errors import Qwen35Error
from components.remote import SshTarget, SshTransport, ssh_options


class NodeDict(TypedDict, total=False):
    """A node as node resources take it and state keeps it (plain values, so it pickles and diffs)."""

    name: str
    host: str
    port: int
    user: str
    identity_file: str | None
    known_hosts: str
    proxy_jump: str | None
    fabric_host: str | None  # the config's fabric_ip (the module docstring says why two names)
    image_store: str | None


NODE_KEYS = tuple(NodeDict.__annotations__)
# Which node of the stack a node dict is: its name. Every other key is how the node is reached (an
# address, a jump host, keys), which may change without it becoming another node. Resource names carry
# the node name too, so a renamed node is a new resource whatever its diff says.
NODE_IDENTITY = ("name",)
# Where its services answer: two node dicts with the same address reach the same sshd and Docker daemon.
ADDRESS_KEYS = ("host", "port")


class NodeDictError(Qwen35Error, ValueError):
    """A node dict that cannot be used; the message names the role and what is missing."""


def same_node(old: Mapping[str, Any] | None, new: Mapping[str, Any] | None) -> bool:
    """Whether two node dicts are the same node of the stack (NODE_IDENTITY)."""
    old, new = old or {}, new or {}
    return all(old.get(key) == new.get(key) for key in NODE_IDENTITY)


def same_address(old: Mapping[str, Any] | None, new: Mapping[str, Any] | None) -> bool:
    """Whether two node dicts reach the same sshd and daemon (ADDRESS_KEYS)."""
    old, new = old or {}, new or {}
    return all(old.get(key) == new.get(key) for key in ADDRESS_KEYS)


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

    def node_dict(self) -> NodeDict:
        """The node dict node resources take (NodeDict)."""
        return NodeDict(
            name=self.node.name,
            host=self.target.host,
            port=self.target.port,
            user=self.target.user,
            identity_file=self.target.identity_file,
            known_hosts=self.target.known_hosts,
            proxy_jump=self.target.proxy_jump,
            fabric_host=self.node.fabric_ip,
            image_store=self.node.image_store,
        )


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


def checked_target(role: str, raw: Any, connect_timeout: int = 10) -> SshTarget:
    """The SshTarget of a node dict (as `NodeAccess.node_dict` writes it and state keeps it), or
    NodeDictError naming `role` when it lacks what SSH needs."""
    if not isinstance(raw, Mapping) or not raw.get("host") or not raw.get("known_hosts"):
        raise NodeDictError(f"{role}: give a node dict with host, user, known_hosts (got {raw!r})")
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


def transport_to(role: str, raw: Any, error: type[Exception] = NodeDictError) -> SshTransport:
    """The SSH transport to the node of a node dict; `error` (the package's own) naming `role` when
    the dict lacks what SSH needs."""
    try:
        return SshTransport(checked_target(role, raw))
    except NodeDictError as exc:
        raise error(str(exc)) from None
