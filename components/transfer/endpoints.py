"""The addresses of a transfer's nodes, as values (no session): how the orchestrator reaches each
node (`Endpoint`), and how the source reaches the destination (`peer_target`: its fabric address,
with the destination's user and port, keys pinned). The sessions held on them: `ends.py`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from components.config import CopyConfig
from components.errors import Qwen35Error
from components.nodes import ADDRESS_KEYS, NodeDictError, checked_target
from components.remote import SshTarget, SshTransport


class EndpointError(Qwen35Error, ValueError):
    """A node dict that cannot be used; the message names the role and what is missing."""


@dataclass(frozen=True)
class Endpoint:
    """One node of a transfer: its label, how the orchestrator reaches it, and its fabric address."""

    label: str
    target: SshTarget
    fabric_host: str

    @classmethod
    def fields_from(cls, role: str, raw: Mapping[str, Any], connect_timeout: int = 10) -> dict[str, Any]:
        """The constructor's arguments from a node dict (host, user, known_hosts, …, fabric_host)."""
        try:
            target = checked_target(role, raw, connect_timeout)
        except NodeDictError as exc:
            raise EndpointError(str(exc)) from None
        return {
            "label": target.name or f"{target.host}:{target.port}",
            "target": target,
            "fabric_host": str(raw.get("fabric_host") or raw["host"]),
        }

    @classmethod
    def from_dict(cls, role: str, raw: Mapping[str, Any], connect_timeout: int = 10) -> Endpoint:
        return cls(**cls.fields_from(role, raw, connect_timeout))

    @property
    def key(self) -> tuple[str, int]:
        """Two endpoints with the same key reach the same sshd and daemon (`nodes.ADDRESS_KEYS`)."""
        return tuple(getattr(self.target, key) for key in ADDRESS_KEYS)

    def transport(self, control_path: str | None = None) -> SshTransport:
        return SshTransport(self.target, control_path=control_path, name=self.label)


def peer_target(destination: Endpoint, tuning: CopyConfig) -> SshTarget:
    """How the source reaches the destination: its fabric address, the destination's user and port."""
    target = destination.target
    return SshTarget(
        host=destination.fabric_host,
        user=target.user,
        port=target.port,
        known_hosts=tuning.peer_known_hosts or target.known_hosts,
        identity_file=tuning.peer_identity_file or target.identity_file,
        name=destination.label,
        connect_timeout=tuning.connect_timeout_s,
    )
