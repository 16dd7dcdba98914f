"""The two ends of a transfer: how the orchestrator reaches each node, and how the source reaches the
destination (its fabric address, with the destination's user and port, keys pinned)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from components.config import CopyConfig
from components.errors import Qwen35Error
from components.nodes import target_from_dict
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
        if not isinstance(raw, Mapping) or not raw.get("host") or not raw.get("known_hosts"):
            raise EndpointError(f"{role}: give a node dict with host, user, known_hosts (got {raw!r})")
        target = target_from_dict(raw, connect_timeout)
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
        """Two endpoints with the same key are the same node."""
        return (self.target.host, self.target.port)

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
