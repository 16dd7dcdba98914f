"""FabricCheck's pure decisions: from one node's facts (and the head's recorded paths) to what NCCL on
that node is given, and every problem with its next step. No I/O: diff and the tests use these alone.

Per node:
- the ports NCCL uses: the pinned ones (`nodes[].ib_hca`, else the legacy `fabric.ib_hca`), each of
  which must exist and be ACTIVE, else every ACTIVE port;
- on each Ethernet (RoCE) port, the GID index whose type is RoCE v2 and whose GID is the IPv4-mapped
  address of that port's netdev (NCCL's own choice when `NCCL_IB_GID_INDEX` is unset);
- the MTU of its fabric path (the socket interface and each used port's netdev): none below
  `fabric.mtu` when set; MTUs that differ on the node or from the head's (every worker's reference)
  warn, as NCCL runs each connection at the smaller end's MTU.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from components.fabric_check.facts import NodeFacts, Port
from components.provider_kit.change import Change

ENFORCE, REPORT = "enforce", "report"
UNSET, RESOLVE = "unset", "resolve"
# What the check decides, recorded as outputs (and read back by refresh).
OUTPUT_KEYS = ("ib_hca", "gid_index", "gids", "mtu", "paths", "verdict", "problems", "throughput")
# What it decides from: a change to any of these checks again (in place: nothing is left on a node).
INPUT_KEYS = (
    "node",
    "fabric_ip",
    "socket_ifname",
    "sysfs_root",
    "mode",
    "pin",
    "gid",
    "mtu_expected",
    "reference",
    # On a worker: the head's name, fabric address and probe port, and fabric.min_gbps.
    "probe",
)


@dataclass(frozen=True)
class Settings:
    """The check's inputs for one node, as plain values."""

    node: str
    fabric_ip: str
    socket_ifname: str
    mode: str = ENFORCE
    # The operator's HCAs (`dev` or `dev:port`), None to use every ACTIVE port.
    pin: tuple[str, ...] | None = None
    # "unset", "resolve", or the index itself.
    gid: str | int = UNSET
    mtu_expected: int | None = None
    # The head's recorded outputs (`node`, `mtu`, `paths`) on a worker; None on the head.
    reference: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class Decision:
    """What NCCL on the node is given, and what is wrong with its fabric."""

    ib_hca: tuple[str, ...]
    gid_index: int | None
    gids: Mapping[str, int | None]
    mtu: int | None
    paths: Mapping[str, int | None]
    problems: tuple[str, ...] = field(default=())
    # A worker's probe to the head (`Probe.outputs`); None where none ran (the head, or a refresh).
    throughput: Mapping[str, Any] | None = None
    warnings: tuple[str, ...] = field(default=())

    @property
    def verdict(self) -> str:
        return "fail" if self.problems else "pass"

    def outputs(self) -> dict[str, Any]:
        # Refresh runs no probe: leaving `throughput` out keeps the one `up` recorded.
        probe = {} if self.throughput is None else {"throughput": dict(self.throughput)}
        return {
            **probe,
            "ib_hca": list(self.ib_hca),
            "gid_index": self.gid_index,
            "gids": dict(self.gids),
            "mtu": self.mtu,
            "paths": dict(self.paths),
            "verdict": self.verdict,
            "problems": list(self.problems),
        }


def whole(value: Any) -> Any:
    """A number as an int: the engine hands a dynamic provider every number as a float (3 -> 3.0)."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _whole_reference(reference: Mapping[str, Any]) -> dict[str, Any]:
    paths = {name: whole(mtu) for name, mtu in (reference.get("paths") or {}).items()}
    return {**reference, "mtu": whole(reference.get("mtu")), "paths": paths}


def settings(props: Mapping[str, Any]) -> Settings:
    """The provider's inputs as Settings."""
    pin = props.get("pin")
    reference = props.get("reference")
    return Settings(
        node=str(props["node"]["name"]),
        fabric_ip=str(props["fabric_ip"]),
        socket_ifname=str(props["socket_ifname"]),
        mode=str(props.get("mode") or ENFORCE),
        pin=None if pin is None else tuple(pin),
        gid=whole(props["gid"]) if props.get("gid") is not None else UNSET,
        mtu_expected=whole(props.get("mtu_expected")),
        reference=_whole_reference(reference) if reference else None,
    )


def persist_hint(ifname: str, key: str, value: Any) -> str:
    """The netplan drop-in that keeps a link setting after a reboot."""
    return (
        f"and to keep it after a reboot: /etc/netplan/90-qwen35-{ifname}.yaml holding "
        f"`network: {{version: 2, ethernets: {{{ifname}: {{{key}: {value}}}}}}}`, then `sudo netplan apply`"
    )


def socket_problems(s: Settings, facts: NodeFacts) -> list[str]:
    """The socket interface (NCCL/Gloo/Ray's TCP path) exists, is up and holds the node's fabric_ip."""
    sock = facts.socket
    if not sock.exists:
        present = ", ".join(sorted(n for n, d in facts.netdevs.items() if d.exists)) or "none"
        return [
            f"{s.node}: socket interface {sock.name} does not exist (interfaces seen: {present}); "
            f"next: set fabric.socket_ifname to the interface that holds {s.fabric_ip}"
        ]
    problems = []
    if not sock.up:
        problems.append(
            f"{s.node}: socket interface {sock.name} is {sock.operstate or 'in an unknown state'}, not up; "
            f"next: `sudo ip link set {sock.name} up`, and define it in netplan (`/etc/netplan/`) "
            "so it comes up after a reboot"
        )
    if s.fabric_ip not in sock.addresses:
        problems.append(
            f"{s.node}: socket interface {sock.name} does not hold fabric_ip {s.fabric_ip} "
            f"(it holds {', '.join(sock.addresses) or 'no IPv4 address'}); next: "
            f"`sudo ip addr add {s.fabric_ip}/24 dev {sock.name}` "
            f"{persist_hint(sock.name, 'addresses', f'[{s.fabric_ip}/24]')}, or correct nodes[].fabric_ip"
        )
    return problems


def _port_line(port: Port) -> str:
    return f"{port.hca} {port.state or '?'} ({port.phys_state or '?'})"


def port_order(port: Port) -> tuple[str, int]:
    """NCCL_IB_HCA's order for unpinned ports: by device, then port number, whatever order the facts
    came in, so a refresh that reads the same ports gives the same list (and replaces nothing)."""
    return (port.device, port.port)


def chosen_ports(s: Settings, facts: NodeFacts) -> tuple[list[Port], list[str]]:
    """The ports NCCL uses on the node and the problems with them: pinned ones that are missing or
    not ACTIVE; without a pin, no ACTIVE port at all."""
    seen = "; ".join(_port_line(p) for p in facts.ports)
    seen = seen or f"no RDMA device under {facts.sysfs}/class/infiniband"
    if s.pin is None:
        active = [p for p in facts.ports if p.active]
        if active:
            return sorted(active, key=port_order), []
        return [], [
            f"{s.node}: no ACTIVE RDMA port (found: {seen}); next: cable a port and check its link "
            "(`rdma link show`, `ibv_devinfo`), or pin the intended ones in nodes[].ib_hca"
        ]
    used: list[Port] = []
    problems: list[str] = []
    for entry in s.pin:
        ports = [facts.port(entry)] if ":" in entry else list(facts.device_ports(entry))
        ports = [p for p in ports if p is not None]
        if not ports:
            problems.append(
                f"{s.node}: pinned HCA {entry} does not exist (found: {seen}); next: correct "
                "nodes[].ib_hca (or fabric.ib_hca), or drop the pin to use every ACTIVE port"
            )
        elif not any(p.active for p in ports):
            problems.append(
                f"{s.node}: pinned HCA {entry} is not ACTIVE ({'; '.join(_port_line(p) for p in ports)}); "
                "next: cable it and check `rdma link show`, or pin the ACTIVE port instead"
            )
        used += [p for p in ports if p.active and p not in used]
    return used, problems


def roce_v2_index(port: Port, facts: NodeFacts) -> int | None:
    """The port's RoCE v2 GID that maps an IPv4 address of the netdev it names: an entry of the
    port's own netdev (its PCI function's) first, else one of another netdev (a VLAN or bond on it);
    the lowest index of either. A table may hold another netdev's IPv4 entry at a lower index."""
    fit = roce_v2_ipv4(port, facts)
    own = [gid for gid in fit if gid.ndev in port.own_netdevs]
    return (own or fit)[0].index if fit else None


def roce_v2_ipv4(port: Port, facts: NodeFacts) -> list:
    """Every entry of the port's table that is RoCE v2 and maps an IPv4 address of the netdev it
    names, by index: each is one NCCL can use (a pinned index is held to being one of them)."""
    return [
        gid
        for gid in sorted(port.gids, key=lambda g: g.index)
        if gid.roce_v2
        and gid.ipv4
        and gid.ipv4 in getattr(facts.netdevs.get(gid.ndev or ""), "addresses", ())
    ]


def nccl_gid_index(port: Port) -> int | None:
    """The index NCCL takes when NCCL_IB_GID_INDEX is unset: the lowest RoCE v2 entry that maps an
    IPv4 address, whatever netdev it belongs to (net_ib's ncclIbGetGidIndex never looks at it)."""
    return next((g.index for g in sorted(port.gids, key=lambda g: g.index) if g.roce_v2 and g.ipv4), None)


def unset_gid_warnings(s: Settings, facts: NodeFacts, found: Mapping[str, int | None]) -> list[str]:
    """Under `gid_index: unset`, each port where NCCL's own pick differs from the entry the check
    validated (its own netdev's): a VLAN or bond over the function puts another netdev's first."""
    warnings = []
    for hca, index in found.items():
        port = facts.port(hca)
        theirs = nccl_gid_index(port)
        if index is None or theirs is None or theirs == index:
            continue
        entry = next(g for g in port.gids if g.index == theirs)
        warnings.append(
            f"{s.node}: on {hca} NCCL takes GID index {theirs} ({entry.ipv4} of {entry.ndev}: the lowest "
            f"RoCE v2 IPv4 entry, whatever its netdev), not {index}, the entry of its own netdev "
            f"{', '.join(port.own_netdevs)} that the check validated; next: set fabric.gid_index: "
            f"resolve to give NCCL {index}, or make sure {entry.ndev}'s address reaches the other nodes"
        )
    return warnings


def _gid_lines(port: Port) -> str:
    return "; ".join(f"{g.index}: {g.type} {g.gid} ({g.ndev})" for g in port.gids) or "no used entry"


def gid_problems(s: Settings, facts: NodeFacts, ports: Sequence[Port]) -> tuple[dict, int | None, list[str]]:
    """Each used RoCE port's RoCE v2 IPv4 index, the index NCCL is given, and the problems (the
    warnings under `unset` are `unset_gid_warnings`)."""
    found = {p.hca: roce_v2_index(p, facts) for p in ports if p.link_layer == "Ethernet"}
    problems = []
    for hca, index in found.items():
        if index is None:
            port = facts.port(hca)
            names = ", ".join(port.netdevs) or "no netdev"
            addresses = {n: list(facts.netdevs[n].addresses) for n in port.netdevs if n in facts.netdevs}
            problems.append(
                f"{s.node}: {hca} has no RoCE v2 GID for an IPv4 address of {names} (addresses: "
                f"{addresses or 'none'}; GIDs: {_gid_lines(port)}); next: give {names} its fabric "
                "address (`ip addr add …`, kept by netplan): the kernel adds the RoCE v2 GID with it"
            )
    if s.gid == UNSET:
        return found, None, problems
    if s.gid == RESOLVE:
        indices = set(found.values())
        if len(indices) == 1 and None not in indices:
            return found, indices.pop(), problems
        if len(indices) > 1 and None not in indices:
            problems.append(
                f"{s.node}: the RoCE v2 IPv4 GID index differs between ports ({found}) and "
                "NCCL_IB_GID_INDEX is one value; next: set fabric.gid_index: unset (NCCL picks per "
                "device) or pin nodes[].ib_hca to ports that share one index"
            )
        return found, None, problems
    for hca in found:
        port = facts.port(hca)
        entry = next((g for g in port.gids if g.index == s.gid), None)
        # Any RoCE v2 IPv4 entry is a valid pin (not only the one `resolve` would choose).
        if entry is None or s.gid not in {g.index for g in roce_v2_ipv4(port, facts)}:
            what = "does not exist" if entry is None else f"is {entry.type} {entry.gid}"
            better = "none is RoCE v2 IPv4"
            if found[hca] is not None:
                better = f"the RoCE v2 IPv4 entry is {found[hca]}"
            problems.append(
                f"{s.node}: pinned GID index {s.gid} on {hca} {what} ({better}; GIDs: {_gid_lines(port)}); "
                "next: set fabric.gid_index: resolve (or unset, NCCL's own choice)"
            )
    return found, int(s.gid), problems


def mtu_fix(node: str, ifname: str, mtu: int) -> str:
    return f"on {node}: `sudo ip link set {ifname} mtu {mtu}` {persist_hint(ifname, 'mtu', mtu)}"


def mtu_problems(s: Settings, paths: Mapping[str, int | None]) -> tuple[list[str], list[str]]:
    """(problems, warnings) of the node's fabric path MTUs. NCCL runs each RDMA connection at the
    smaller MTU of its two ends (net_ib.cc, "Adjust the MTU"), so ends that differ work, at the
    smaller one's size: a warning. Refused: an MTU below `fabric.mtu` when it is set."""
    unread = [name for name, mtu in paths.items() if mtu is None]
    if unread:
        return [f"{s.node}: no MTU for {', '.join(unread)} (the netdev is missing from class/net)"], []
    if s.mtu_expected is not None:
        low = [
            f"{s.node}: {name} has MTU {mtu}, below fabric.mtu {s.mtu_expected}; next: "
            + mtu_fix(s.node, name, s.mtu_expected)
            for name, mtu in paths.items()
            if mtu < s.mtu_expected
        ]
        if low:
            return low, []
    return [], mtu_warnings(s, paths)


def mtu_warnings(s: Settings, paths: Mapping[str, int | None]) -> list[str]:
    """MTUs that differ on the node's path, or from the head's: each connection runs at the smaller."""
    values = set(paths.values())
    if len(values) > 1:
        top = max(values)
        return [
            f"{s.node}: the fabric path's MTUs differ ({dict(paths)}): NCCL runs each connection at the "
            f"smaller end's MTU, so {min(values)} bounds it; next: "
            + "; ".join(mtu_fix(s.node, name, top) for name, mtu in paths.items() if mtu != top)
        ]
    ref = s.reference or {}
    if not values or ref.get("mtu") is None or ref["mtu"] in values:
        return []
    mine, theirs = values.pop(), int(ref["mtu"])
    if mine < theirs:
        fixes = [mtu_fix(s.node, name, theirs) for name in paths]
    else:
        fixes = [mtu_fix(str(ref.get("node")), name, mine) for name in (ref.get("paths") or {})]
    return [
        f"{s.node}: fabric MTU {mine} ({dict(paths)}) but {ref.get('node')}'s is {theirs} "
        f"({dict(ref.get('paths') or {})}): NCCL takes the smaller of the two ends, so traffic between "
        f"them runs at {min(mine, theirs)}; next: "
        + "; ".join(fixes)
        + " (or set fabric.mtu to refuse an MTU below it)"
    ]


def decide(s: Settings, facts: NodeFacts) -> Decision:
    """Everything the check decides for one node from its facts."""
    problems = socket_problems(s, facts)
    ports, port_problems = chosen_ports(s, facts)
    gids, gid_index, found_problems = gid_problems(s, facts, ports)
    # A socket interface that does not exist is a problem of its own, not an unread MTU.
    paths: dict[str, int | None] = {facts.socket.name: facts.socket.mtu} if facts.socket.exists else {}
    for port in ports:
        for name in port.netdevs[:1]:
            netdev = facts.netdevs.get(name)
            paths[name] = netdev.mtu if netdev else None
    mtu_refused, mtu_warned = mtu_problems(s, paths)
    gid_warned = unset_gid_warnings(s, facts, gids) if s.gid == UNSET else []
    problems += port_problems + found_problems + mtu_refused
    known = [m for m in paths.values() if m is not None]
    return Decision(
        ib_hca=s.pin if s.pin is not None else tuple(p.hca for p in ports),
        gid_index=gid_index,
        gids=gids,
        mtu=min(known) if known else None,
        paths=paths,
        problems=tuple(problems),
        warnings=tuple(gid_warned + mtu_warned),
    )


def refusal(s: Settings, decision: Decision) -> str | None:
    """The message that stops `up` (mode enforce), None when it goes on."""
    if s.mode != ENFORCE or not decision.problems:
        return None
    return (
        f"fabric check on {s.node}: the fabric is not fit for NCCL ({len(decision.problems)} problem(s)):\n"
        + "\n".join(f"  - {p}" for p in decision.problems)
        + "\n  (fabric.check: enforce stops here, before any container; `report` records these in the "
        "stack output `fabric` and goes on)"
    )


def plan_change(olds: Mapping[str, Any], news: Mapping[str, Any]) -> Change:
    """Any input changed: check again, in place. A failed verdict recorded by refresh under enforce
    also checks again, so `up` refuses instead of keeping containers on a broken fabric."""
    updates = tuple(key for key in INPUT_KEYS if olds.get(key) != news.get(key))
    if olds.get("verdict") == "fail" and news.get("mode") == ENFORCE:
        updates += ("verdict",)
    return Change(replaces=(), updates=updates)


def check_id(props: Mapping[str, Any]) -> str:
    return f"fabric-{props['node']['name']}"


def validate(props: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(input, reason) for each input the check cannot use (config validates them first: a bug)."""
    problems = []
    if props.get("mode") not in (ENFORCE, REPORT):
        problems.append(("mode", f"{props.get('mode')!r}: give enforce or report (off creates no check)"))
    gid = whole(props.get("gid"))
    if gid not in (UNSET, RESOLVE) and not (isinstance(gid, int) and 0 <= gid <= 255):
        problems.append(("gid", f"{gid!r}: give unset, resolve or an index 0-255"))
    if not isinstance(props.get("node"), Mapping) or not props["node"].get("name"):
        problems.append(("node", "give the node dict (name, host, known_hosts)"))
    return problems + probe_input_problems(props.get("probe"))


def probe_input_problems(probe: Any) -> list[tuple[str, str]]:
    """(input, reason) for a `probe` input the probe cannot use; None (the head) is fine."""
    if probe is None:
        return []
    if not isinstance(probe, Mapping) or not all(probe.get(k) for k in ("head", "head_name", "host")):
        return [("probe", "give head (the node dict), head_name, host, port and min_gbps")]
    port, floor = whole(probe.get("port")), probe.get("min_gbps")
    problems = []
    if not (isinstance(port, int) and 1024 <= port <= 65535):
        problems.append(("probe", f"port {port!r}: give a port 1024-65535"))
    if floor is not None and not (isinstance(floor, (int, float)) and floor > 0):
        problems.append(("probe", f"min_gbps {floor!r}: give a positive Gb/s figure, or leave it unset"))
    return problems


def probe_after(workers: Sequence[str]) -> dict[str, str | None]:
    """Each worker's FabricCheck runs after the previous worker's (None: the first's waits only for
    the head's). Every probe's listener binds the head's one `fabric.probe_port`, so checks run in
    parallel would find it taken ("something else listens") on all but one node, and probes that
    share the head's link would each measure a fraction of it; one after the other, each takes
    at most its deadline (PROBE_DEADLINE_S) and measures the link alone."""
    return {worker: workers[i - 1] if i else None for i, worker in enumerate(workers)}


@dataclass(frozen=True)
class Probe:
    """One worker's probe to the head: what was measured, and what is wrong with it."""

    line: str
    gbytes_s: float | None
    problems: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()

    def outputs(self) -> dict[str, Any]:
        return {"line": self.line, "gbytes_s": self.gbytes_s, "problems": list(self.problems)}


def probe_verdict(
    s: Settings,
    probe: Mapping[str, Any],
    listened: Mapping[str, Any] | None,
    sent: Mapping[str, Any] | None,
) -> Probe:
    """From both ends' reports: the figure ("node-b → node-a 11.8 GB/s over IF"), an unreachable
    head as a problem, and a figure below `fabric.min_gbps` (Gb/s: the figure × 8) as a warning."""
    head, path = str(probe["head_name"]), f"{probe['host']}:{probe['port']}"
    route = f"{s.node} → {head}"
    if not sent or sent.get("exit") != 0:
        why = (listened or {}).get("hint") or "nothing accepted the connection before the deadline"
        return Probe(
            line=f"{route} unreachable at {path}",
            gbytes_s=None,
            problems=(
                f"{s.node}: cannot reach {head}'s fabric address {path} ({why}); next: check that "
                f"{head} holds {probe['host']} on its socket interface (`ip addr`), that the link is up, "
                f"and that no firewall drops port {probe['port']}",
            ),
        )
    seconds = float((listened or {}).get("seconds") or 0.0)
    received = int((listened or {}).get("bytes") or 0)
    if not listened or listened.get("exit") != 0 or seconds <= 0 or received <= 0:
        return Probe(
            line=f"{route} reachable, throughput not measured",
            gbytes_s=None,
            warnings=(
                f"{s.node}: the probe reached {head} at {path} but {head} measured nothing ({listened})",
            ),
        )
    rate = received / seconds / 1e9
    line = f"{route} {rate:.1f} GB/s over {s.socket_ifname}"
    slow = floor_warning(s.node, line, rate, probe.get("min_gbps"), s.socket_ifname)
    return Probe(line=line, gbytes_s=round(rate, 3), warnings=(slow,) if slow else ())


def gbits(gbytes_s: float) -> float:
    """A figure in GB/s (gigabytes, what the probe reports) in Gb/s (gigabits, a link's rate)."""
    return gbytes_s * 8


def floor_warning(node: str, line: str, gbytes_s: float, floor: Any, ifname: str) -> str | None:
    """The warning for a figure below `fabric.min_gbps`, which is in Gb/s (gigabits per second, the
    unit of a link's rate: 200 for a Spark's ConnectX-7 port), None at or above it (or unset)."""
    if floor is None or gbits(gbytes_s) >= float(floor):
        return None
    return (
        f"{node}: {line} ({gbits(gbytes_s):.1f} Gb/s), below fabric.min_gbps {float(floor):g} Gb/s; "
        f"next: check the link speed of {ifname} on both nodes (`ethtool {ifname}`: a link that came "
        "up at 10 Gb/s instead of 200) and its MTU"
    )


def with_probe(decision: Decision, probe: Probe) -> Decision:
    """The node's decision with its probe: an unreachable head is a problem like any other."""
    return replace(
        decision,
        problems=decision.problems + probe.problems,
        warnings=decision.warnings + probe.warnings,
        throughput=probe.outputs(),
    )
