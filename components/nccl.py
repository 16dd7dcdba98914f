"""NCCL's own account of the transport it chose, and the verdict on it: shared by FabricCheck, the
node proof and the serve bench (pure: no I/O).

`parse_nccl_log` turns NCCL's INFO lines (NCCL_DEBUG=INFO) into `NcclFacts`: the network it used, the
HCAs, GID index and socket interface it took. `nccl_problems` and `nccl_verdict` judge them against
the HCAs a node was given: NCCL on its TCP socket fallback while HCAs were given is refused under
enforce.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

ENFORCE = "enforce"
# NCCL's internal TCP transport: the one network that is the fallback from RDMA. `IB` is NCCL's own
# verbs; any other name (`IBext`, `IBext_v6`, `IBext_v8` from HPC-X's RDMA plugin, `UCX`,
# `AWS Libfabric`) is a network plugin, judged by the HCAs its `NET/IB : Using` line lists.
SOCKET = "Socket"


def networks(network: str | None) -> tuple[str, ...]:
    """The names in a network as the parser and the bench record it (several joined by `,`)."""
    return tuple(name.strip() for name in (network or "").split(",") if name.strip())


def on_sockets(network: str | None) -> bool:
    """Whether NCCL ran (any communicator) over its TCP socket fallback: the one test the node
    verdict and the bench's likely cause both use, so they never disagree."""
    return SOCKET in networks(network)


# ---- NCCL's own account of the transport it chose (NCCL_DEBUG=INFO, subsystems INIT,NET,ENV) ----------
# Each line is `<host>:<pid>:<tid> [<cuda dev>] NCCL INFO <message>` (NCCL's debug.cc); the prefix may be
# cut (a log shipped without it). The messages below are NCCL's own format strings, read in its sources
# (v2.28.9 and master, 2026-12-04): src/init.cc, src/plugin/net.cc, src/transport/net_ib*.cc,
# src/transport/net_socket.cc, src/misc/param.cc.
_NCCL_INFO = re.compile(r"NCCL INFO (?P<message>.*?)\s*$")
# `Using network %s`: the name may hold a space (`AWS Libfabric`).
_USING_NETWORK = re.compile(r"^Using network (?P<name>.+)$")
# `Channel 00/0 : 0[0] -> 1[0] [send] via NET/IBext_v6/1` (transport/net.cc): the network each
# channel runs over, read where no `Using network` line was kept.
_CHANNEL_NETWORK = re.compile(r"^Channel \d+/\d+ : .* via NET/(?P<name>[^/]+)/\d+")
# `NET/IB : Using [0]mlx5_0:1/RoCE [1]mlx5_1:1/RoCE [RO]; OOB eth0:10.0.0.1<0>` (the list may be empty;
# newer NCCL adds `:rail` or `::plane` after the port). A plugin prints the same line: HPC-X's adds
# `/SHARP` after the link; IBext_v8 may merge ports as `[0]={[0] mlx5_2:1/RoCE, [1] mlx5_3:1/RoCE}`.
_IB_USING = re.compile(r"^NET/IB : Using(?P<devices>.*?);\s*OOB (?P<oob>\S+)")
_IB_DEVICE = re.compile(
    r"\[(?P<index>\d+)\] ?(?P<device>[^\s:/\[\]{}=,]+):(?P<port>\d+)(?::[^\s/]*)?/(?P<link>\w+)"
)
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
# Exact messages: `Failed to initialize NET plugin IBext` is a plugin failing, after which NCCL's
# own IB may still serve.
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

    # The networks the communicators used (`IB`, `Socket`, or a plugin's name; several joined by `,`,
    # in the order NCCL named them); None: no `Using network` or channel line.
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

    @property
    def ib_listed(self) -> bool:
        """Whether NCCL's IB (or a plugin in its format) printed its `NET/IB : Using … OOB` line."""
        return self.oob is not None


def _env_value(value: str) -> str:
    # param.cc prints numbers as `%lld.`: the period is not part of the value.
    return value[:-1] if re.fullmatch(r"-?\d+\.", value) else value


def _nccl_line(found: dict[str, Any], message: str) -> bool:
    """Fold one INFO message into `found`; True when it is one to quote (a channel line only the first
    time its network shows: there is one per channel and peer)."""
    if m := _USING_NETWORK.match(message):
        found["networks"].setdefault(m["name"], None)
    elif m := _CHANNEL_NETWORK.match(message):
        if m["name"] in found["channels"]:
            return False
        found["channels"].setdefault(m["name"], None)
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
    elif message in _IB_FAILED:
        found["ib_failed"] = True
    else:
        return False
    return True


def parse_nccl_log(text: str) -> NcclFacts:
    """NCCL's INFO lines (NCCL_DEBUG=INFO output, any other lines among them ignored) as NcclFacts."""
    # Dicts as ordered sets: every rank and communicator repeats its lines.
    found: dict[str, Any] = {"gids": [], "env": {}, "lines": {}, "networks": {}, "channels": {}}
    for raw in text.splitlines():
        m = _NCCL_INFO.search(raw)
        if m and _nccl_line(found, m["message"]):
            found["lines"].setdefault(f"NCCL INFO {m['message']}", None)
    devices = {d.index: d for d in found.get("ib_devices", ())}
    gid_index: dict[str, int] = {}
    active_mtu: dict[str, int] = {}
    for ibdev, port, gid, mtu in found["gids"]:
        name = devices[ibdev].hca if ibdev in devices else f"IbDev {ibdev}:{port}"
        gid_index.setdefault(name, gid)
        active_mtu.setdefault(name, IBV_MTU_BYTES.get(mtu, mtu))
    disable = found["env"].get("NCCL_IB_DISABLE", "0")
    return NcclFacts(
        network=",".join(found["networks"] or found["channels"]) or None,
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


@dataclass(frozen=True)
class NcclVerdict:
    """What one node's NCCL log says about its transport: problems (a refusal under enforce) and
    warnings; `refusal` is the message that stops `up`, None where it goes on."""

    node: str
    network: str | None
    problems: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    refusal: str | None = None

    @property
    def verdict(self) -> str:
        return "fail" if self.problems else "pass"


def _hca_taken(entry: str, taken: Sequence[str]) -> bool:
    """A configured NCCL_IB_HCA entry (`dev` or `dev:port`) among the `dev:port` NCCL took."""
    entry = entry.lstrip("=")
    return entry in taken if ":" in entry else any(hca.split(":")[0] == entry for hca in taken)


def _socket_fallback_step(nccl: NcclFacts) -> str:
    """The next step for an NCCL that fell back to sockets, from what its log says."""
    if nccl.ib_disabled:
        return (
            "NCCL_IB_DISABLE is set in the container's environment while HCAs are given: remove it "
            "(fabric_env sets it only on a node without HCAs)"
        )
    return (
        "NCCL saw no usable RDMA device in the container: check that it has /dev/infiniband "
        "(containers.devices), that the image has libibverbs and its provider (rdma-core: `ibv_devices` "
        "in the image lists the HCAs), and that NCCL_IB_HCA names this node's devices (`rdma link show`)"
    )


def nccl_problems(node: str, nccl: NcclFacts, ib_hca: Sequence[str]) -> tuple[list[str], list[str]]:
    """(problems, warnings) of one node's NCCL transport against the HCAs it was given (`ib_hca`,
    NCCL_IB_HCA's entries; none: sockets are what it was meant to use)."""
    if not ib_hca:
        return [], []
    said = "; ".join(f"`{line}`" for line in nccl.lines) or "no NCCL INFO line"
    if nccl.network is None:
        return [
            f"{node}: NCCL's log names no network (no `Using network` line; it said: {said}); next: run "
            "with NCCL_DEBUG=INFO and NCCL_DEBUG_SUBSYS=INIT,NET,ENV so the transport can be judged"
        ], []
    if on_sockets(nccl.network):
        return [
            f"{node}: NCCL used network {nccl.network}, not RDMA, although NCCL_IB_HCA is "
            f"{','.join(ib_hca)}: it fell back to TCP sockets without failing (a fraction of the "
            f"speed, or a hang under load). NCCL said: {said}; next: {_socket_fallback_step(nccl)}"
        ], []
    if not nccl.ib_listed and nccl.network != "IB":
        return [], [
            f"{node}: NCCL used the network plugin {nccl.network}, which printed no `NET/IB : Using` "
            f"line, so which of {','.join(ib_hca)} it took is not known (not TCP sockets: NCCL names "
            f"those `Socket`). NCCL said: {said}; next: see the plugin's own lines in {node}'s log"
        ]
    missing = [entry for entry in ib_hca if not _hca_taken(entry, nccl.ib_hcas)]
    if not missing:
        return [], []
    return [], [
        f"{node}: NCCL took {', '.join(nccl.ib_hcas) or 'no HCA'} but was given {','.join(ib_hca)} "
        f"({', '.join(missing)} left out: less bandwidth); NCCL said: {said}; next: check "
        f"{', '.join(missing)} with `rdma link show` on {node}"
    ]


def nccl_verdict(node: str, mode: str, nccl: NcclFacts, ib_hca: Sequence[str] | None = None) -> NcclVerdict:
    """The verdict on one node's NCCL log: refused under enforce when NCCL used sockets while HCAs
    were configured (`ib_hca`: the node's NCCL_IB_HCA entries; None: what the log says NCCL read)."""
    if ib_hca is None:
        ib_hca = [e for e in nccl.env.get("NCCL_IB_HCA", "").split(",") if e]
    problems, warnings = nccl_problems(node, nccl, ib_hca)
    message = None
    if mode == ENFORCE and problems:
        message = (
            f"NCCL check on {node}: NCCL would not use the fabric's RDMA ({len(problems)} problem(s)):\n"
            + "\n".join(f"  - {p}" for p in problems)
            + "\n  (fabric.check: enforce stops here; `report` records these and goes on)"
        )
    return NcclVerdict(node, nccl.network, tuple(problems), tuple(warnings), message)
