"""A node's fabric as `node_programs/fabric_facts.py` reports it, as frozen values (pure: no I/O).

The programs' reports are read by `provider_kit.reports`; `node_facts` turns the facts program's
report into `NodeFacts`. The decisions on these facts are in `plan.py`; NCCL's own INFO lines are
read and judged in `components/nccl.py`.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from components.fabric_check.errors import FabricCheckError

ROCE_V2 = "RoCE v2"


@dataclass(frozen=True)
class Netdev:
    """A network interface: whether it exists, its operstate, MTU and IPv4 addresses."""

    name: str
    exists: bool
    operstate: str | None
    mtu: int | None
    addresses: tuple[str, ...]

    @property
    def up(self) -> bool:
        return self.exists and self.operstate == "up"


@dataclass(frozen=True)
class Gid:
    """One used entry of a port's GID table."""

    index: int
    gid: str
    type: str | None
    ndev: str | None

    @property
    def ipv4(self) -> str | None:
        """The IPv4 address this GID maps (`…:0000:ffff:XXXX:XXXX`), None for any other GID."""
        return ipv4_of_gid(self.gid)

    @property
    def roce_v2(self) -> bool:
        return self.type == ROCE_V2


@dataclass(frozen=True)
class Port:
    """One port of an RDMA device."""

    device: str
    port: int
    state: str | None
    phys_state: str | None
    link_layer: str | None
    gids: tuple[Gid, ...]
    device_netdevs: tuple[str, ...] = ()

    @property
    def hca(self) -> str:
        """The port as NCCL_IB_HCA names it: `device:port`."""
        return f"{self.device}:{self.port}"

    @property
    def active(self) -> bool:
        return (self.state or "").split(":")[-1].strip() == "ACTIVE"

    @property
    def own_netdevs(self) -> tuple[str, ...]:
        """The port's own netdevs: its PCI function's (`device/net/`), else those its GIDs name."""
        return self.device_netdevs or tuple(dict.fromkeys(g.ndev for g in self.gids if g.ndev))

    @property
    def netdevs(self) -> tuple[str, ...]:
        """Its own netdevs first, then any other its GIDs name (first appearance): the first is the
        port's fabric path (its MTU), even when the GID table names another netdev before it."""
        named = (g.ndev for g in self.gids if g.ndev)
        return tuple(dict.fromkeys((*self.own_netdevs, *named)))


@dataclass(frozen=True)
class NodeFacts:
    """Everything FabricCheck read on one node."""

    node: str
    sysfs: str
    socket: Netdev
    netdevs: Mapping[str, Netdev]
    ports: tuple[Port, ...]

    def port(self, hca: str) -> Port | None:
        return next((p for p in self.ports if p.hca == hca), None)

    def device_ports(self, device: str) -> tuple[Port, ...]:
        return tuple(p for p in self.ports if p.device == device)


def ipv4_of_gid(gid: str) -> str | None:
    try:
        mapped = ipaddress.IPv6Address(gid).ipv4_mapped
    except ValueError:
        return None
    return str(mapped) if mapped else None


def _netdev(name: str, raw: Mapping[str, Any] | None) -> Netdev:
    raw = raw or {}
    mtu = raw.get("mtu")
    return Netdev(
        name=name,
        exists=bool(raw.get("exists")),
        operstate=raw.get("operstate"),
        mtu=mtu if isinstance(mtu, int) else None,
        addresses=tuple(raw.get("addresses") or ()),
    )


def _ports(device: Mapping[str, Any]) -> list[Port]:
    return [
        Port(
            device=str(device["name"]),
            port=int(port["port"]),
            state=port.get("state"),
            phys_state=port.get("phys_state"),
            link_layer=port.get("link_layer"),
            gids=tuple(
                Gid(int(g["index"]), str(g["gid"]), g.get("type"), g.get("ndev"))
                for g in port.get("gids") or ()
            ),
            device_netdevs=tuple(device.get("netdevs") or ()),
        )
        for port in device.get("ports") or ()
    ]


def node_facts(node: str, report: Mapping[str, Any]) -> NodeFacts:
    """The facts program's report as NodeFacts; FabricCheckError when it says it could not read them."""
    if report.get("error") or "devices" not in report:
        raise FabricCheckError(
            f"{node}: the fabric facts could not be read: "
            f"{report.get('error') or 'no devices in the report'}\n"
            "  next: the node needs python3 and `ip` (iproute2); run `ip -j addr show` there to see why"
        )
    netdevs = {name: _netdev(name, raw) for name, raw in (report.get("netdevs") or {}).items()}
    socket = str(report["socket_ifname"])
    return NodeFacts(
        node=node,
        sysfs=str(report.get("sysfs") or "/sys"),
        socket=netdevs.get(socket) or _netdev(socket, None),
        netdevs=netdevs,
        ports=tuple(p for device in report["devices"] for p in _ports(device)),
    )
