"""A node's fabric as `node_programs/fabric_facts.py` reports it, as frozen values (pure: no I/O).

The programs' reports are read by `provider_kit.reports`; `node_facts` turns the facts program's
report into `NodeFacts`; `parse_nccl_log` turns NCCL's own
INFO lines (NCCL_DEBUG=INFO) into `NcclFacts`: the network it used, the HCAs, GID index and socket
interface it took. The decisions on these facts are in `plan.py`.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
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


# ---- NCCL's own account of the transport it chose (NCCL_DEBUG=INFO, subsystems INIT,NET,ENV) ----------
# Each line is `<host>:<pid>:<tid> [<cuda dev>] NCCL INFO <message>` (NCCL's debug.cc); the prefix may be
# cut (a log shipped without it). The messages below are NCCL's own format strings, read in its sources
# (v2.28.9 and master, 2026-12-04): src/init.cc, src/plugin/net.cc, src/transport/net_ib*.cc,
# src/transport/net_socket.cc, src/misc/param.cc.
_NCCL_INFO = re.compile(r"NCCL INFO (?P<message>.*?)\s*$")
_USING_NETWORK = re.compile(r"^Using network (?P<name>\S+)")
# `NET/IB : Using [0]mlx5_0:1/RoCE [1]mlx5_1:1/RoCE [RO]; OOB eth0:10.0.0.1<0>` (the list may be empty;
# newer NCCL adds `:rail` or `::plane` after the port).
_IB_USING = re.compile(r"^NET/IB : Using(?P<devices>.*?);\s*OOB (?P<oob>\S+)")
_IB_DEVICE = re.compile(r"\[(?P<index>\d+)\](?P<device>[^\s:/\[]+):(?P<port>\d+)(?::[^\s/]*)?/(?P<link>\w+)")
# `NET/Socket : Using [0]lo:127.0.0.1<0> [1]eth0:10.0.0.1<0>`
_SOCKET_USING = re.compile(r"^NET/Socket : Using(?P<ifs>.*)$")
_SOCKET_IF = re.compile(r"\[(?P<index>\d+)\](?P<ifname>[^\s:\[]+):(?P<address>[^\s<]+)(?:<\d+>)?")
# One per queue pair on RoCE: `NET/IB: NCCL Dev 0 IbDev 0 Port 1 qpn 1234 mtu 5 GID 3 (…)` (2.28), or
# `NET/IB: ncclIbConnect: NCCL Dev 0 IbDev 0 Port 1 qp_num 1234 mtu 5 GID 3 (…)` (later). `IbDev` is the
# index of the `NET/IB : Using` list; `mtu` is the port's active MTU as verbs' enum (5 = 4096 bytes).
_GID = re.compile(
    r"^NET/IB: (?:\w+: )?NCCL (?:Merged)?Dev \d+ IbDev (?P<ibdev>\d+) Port (?P<port>\d+) "
    r"(?:qpn|qp_num) \d+ mtu (?P<mtu>\d+) GID (?P<gid>-?\d+)"
)
# `NCCL_IB_HCA set to …` (net_ib) and `NCCL_X set by environment to …` (a number ends with a period).
_ENV = re.compile(r"^(?P<key>NCCL_\w+) set (?:by environment )?to (?P<value>.*)$")
_IB_FAILED = ("NET/IB : No device found.", "Failed to initialize NET plugin IB")
IBV_MTU_BYTES = {1: 256, 2: 512, 3: 1024, 4: 2048, 5: 4096}


@dataclass(frozen=True)
class NcclDevice:
    """One RDMA device and port NCCL took (`NET/IB : Using [i]dev:port/RoCE`)."""

    index: int
    device: str
    port: int
    link: str

    @property
    def hca(self) -> str:
        return f"{self.device}:{self.port}"


@dataclass(frozen=True)
class NcclFacts:
    """What one node's NCCL said about its transport, from its INFO lines (pure values)."""

    # The network the communicator used (`IB`, `Socket`, or a plugin's name); None: no such line.
    network: str | None = None
    ib_disabled: bool = False
    # `NET/IB : No device found.` or `Failed to initialize NET plugin IB`.
    ib_failed: bool = False
    ib_devices: tuple[NcclDevice, ...] = ()
    # The IB plugin's out-of-band interface and address (`eth0:10.0.0.1`).
    oob: str | None = None
    # The socket transport's interfaces: (ifname, address).
    socket_ifs: tuple[tuple[str, str], ...] = ()
    # Per port NCCL used over RoCE (`dev:port`, or `IbDev N:port` when the device list is missing): the
    # GID index it chose, and the port's active MTU in bytes.
    gid_index: Mapping[str, int] = field(default_factory=dict)
    active_mtu: Mapping[str, int] = field(default_factory=dict)
    # `NCCL_X set to V` / `set by environment to V`: what NCCL read from its environment.
    env: Mapping[str, str] = field(default_factory=dict)
    # Every line that said one of the above, as `NCCL INFO <message>` (the prefix cut).
    lines: tuple[str, ...] = ()

    @property
    def ib_hcas(self) -> tuple[str, ...]:
        return tuple(d.hca for d in self.ib_devices)


def _env_value(value: str) -> str:
    # param.cc prints numbers as `%lld.`: the period is not part of the value.
    return value[:-1] if re.fullmatch(r"-?\d+\.", value) else value


def _nccl_line(found: dict[str, Any], message: str) -> bool:
    """Fold one INFO message into `found`; True when it was one this parser reads."""
    if m := _USING_NETWORK.match(message):
        found["network"] = m["name"]
    elif m := _IB_USING.match(message):
        found["ib_devices"] = [
            NcclDevice(int(d["index"]), d["device"], int(d["port"]), d["link"])
            for d in _IB_DEVICE.finditer(m["devices"])
        ]
        found["oob"] = re.sub(r"<\d+>$", "", m["oob"])
    elif m := _SOCKET_USING.match(message):
        found["socket_ifs"] = [(s["ifname"], s["address"]) for s in _SOCKET_IF.finditer(m["ifs"])]
    elif m := _GID.match(message):
        found["gids"].append((int(m["ibdev"]), int(m["port"]), int(m["gid"]), int(m["mtu"])))
    elif m := _ENV.match(message):
        found["env"][m["key"]] = _env_value(m["value"].strip())
    elif message.startswith(_IB_FAILED):
        found["ib_failed"] = True
    else:
        return False
    return True


def parse_nccl_log(text: str) -> NcclFacts:
    """NCCL's INFO lines (NCCL_DEBUG=INFO output, any other lines among them ignored) as NcclFacts."""
    found: dict[str, Any] = {"gids": [], "env": {}, "lines": []}
    for raw in text.splitlines():
        m = _NCCL_INFO.search(raw)
        if m and _nccl_line(found, m["message"]):
            found["lines"].append(f"NCCL INFO {m['message']}")
    devices = {d.index: d for d in found.get("ib_devices", ())}
    gid_index: dict[str, int] = {}
    active_mtu: dict[str, int] = {}
    for ibdev, port, gid, mtu in found["gids"]:
        name = devices[ibdev].hca if ibdev in devices else f"IbDev {ibdev}:{port}"
        gid_index.setdefault(name, gid)
        active_mtu.setdefault(name, IBV_MTU_BYTES.get(mtu, mtu))
    disable = found["env"].get("NCCL_IB_DISABLE", "0")
    return NcclFacts(
        network=found.get("network"),
        ib_disabled=disable.lstrip("-").isdigit() and int(disable) != 0,
        ib_failed=bool(found.get("ib_failed")),
        ib_devices=tuple(found.get("ib_devices", ())),
        oob=found.get("oob"),
        socket_ifs=tuple(found.get("socket_ifs", ())),
        gid_index=gid_index,
        active_mtu=active_mtu,
        env=dict(found["env"]),
        lines=tuple(found["lines"]),
    )
