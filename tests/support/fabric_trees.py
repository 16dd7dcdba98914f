"""Sysfs trees modelled on a DGX Spark's RoCE functions, for FabricCheck's tests (unit and lab).

A Spark has two ConnectX-7 PCI functions per cable port pair: `rocep1s0f0`/`rocep1s0f1` (netdevs
`enp1s0f0np0`/`enp1s0f1np1`) and `roceP2p1s0f0`/`roceP2p1s0f1` (`enP2p1s0f0np0`/`enP2p1s0f1np1`).
As in real sysfs, `class/infiniband/<dev>` and `class/net/<if>` are symlinks into a `devices/`
folder. A tree is a value (files and links by relative path) so a test can write it here or ship it
to a lab node.
"""

from __future__ import annotations

import ipaddress
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

ROCE_V1 = "IB/RoCE v1"
ROCE_V2 = "RoCE v2"
LINK_LOCAL = "fe80:0000:0000:0000:0e42:a1ff:fe00:0001"
GLOBAL_V6 = "fd00:0000:0000:0000:0e42:a1ff:fe00:0001"
# A Spark's four functions: device -> (PCI address, netdev).
SPARK_FUNCTIONS = {
    "rocep1s0f0": ("0000:01:00.0", "enp1s0f0np0"),
    "rocep1s0f1": ("0000:01:00.1", "enp1s0f1np1"),
    "roceP2p1s0f0": ("0002:01:00.0", "enP2p1s0f0np0"),
    "roceP2p1s0f1": ("0002:01:00.1", "enP2p1s0f1np1"),
}
ACTIVE = "4: ACTIVE"
DOWN = "1: DOWN"


def ipv4_gid(address: str) -> str:
    """The IPv4-mapped GID of an address, as sysfs prints it (8 groups of 4 hex digits)."""
    packed = ipaddress.IPv6Address(f"::ffff:{address}").packed
    return ":".join(packed[i : i + 2].hex() for i in range(0, 16, 2))


def gid_table(
    address: str | None,
    ndev: str,
    ipv6_global: bool = False,
    foreign: tuple[str, str] | None = None,
) -> list[tuple[str, str, str]]:
    """mlx5's table for a netdev: link-local v1/v2, (a global IPv6 v1/v2,) then its IPv4 v1/v2.
    With `ipv6_global` the IPv4 RoCE v2 entry moves from index 3 to 5, as after a netplan change.
    `foreign` (address, netdev): another netdev's IPv4 v1/v2 entries before the port's own (a VLAN
    or bond over the function adds such entries), so its own RoCE v2 IPv4 entry moves to 5."""
    table = [(LINK_LOCAL, ROCE_V1, ndev), (LINK_LOCAL, ROCE_V2, ndev)]
    if ipv6_global:
        table += [(GLOBAL_V6, ROCE_V1, ndev), (GLOBAL_V6, ROCE_V2, ndev)]
    if foreign:
        table += [(ipv4_gid(foreign[0]), ROCE_V1, foreign[1]), (ipv4_gid(foreign[0]), ROCE_V2, foreign[1])]
    if address:
        table += [(ipv4_gid(address), ROCE_V1, ndev), (ipv4_gid(address), ROCE_V2, ndev)]
    return table


@dataclass
class PortSpec:
    """One RDMA port with its netdev; `gids` overrides the table `gid_table` would give."""

    device: str
    address: str | None = None
    state: str = ACTIVE
    phys_state: str = "5: LinkUp"
    mtu: int = 9000
    operstate: str = "up"
    port: int = 1
    ipv6_global: bool = False
    # Another netdev's (address, name) whose IPv4 entries this port's GID table holds first.
    foreign: tuple[str, str] | None = None
    gids: list[tuple[str, str, str]] | None = None

    @property
    def netdev(self) -> str:
        return SPARK_FUNCTIONS[self.device][1]


@dataclass
class Tree:
    """Files (relative path -> text) and symlinks (relative path -> target) of a sysfs root, plus
    `ip-addr.json`: what `ip -j addr show` would print on the node."""

    files: dict[str, str] = field(default_factory=dict)
    links: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps({"files": self.files, "links": self.links}, sort_keys=True)


GID_SLOTS = 8  # unused entries read as zeros (and the last ones fail with EINVAL in real sysfs)


def _port_files(tree: Tree, base: str, spec: PortSpec) -> None:
    port = f"{base}/ports/{spec.port}"
    tree.files[f"{port}/state"] = spec.state
    tree.files[f"{port}/phys_state"] = spec.phys_state
    tree.files[f"{port}/link_layer"] = "Ethernet"
    table = spec.gids
    if table is None:
        table = gid_table(spec.address, spec.netdev, spec.ipv6_global, spec.foreign)
    for index in range(max(GID_SLOTS, len(table))):
        gid, kind, ndev = table[index] if index < len(table) else ("0000:" * 7 + "0000", None, None)
        tree.files[f"{port}/gids/{index}"] = gid
        if kind is not None:
            tree.files[f"{port}/gid_attrs/types/{index}"] = kind
            tree.files[f"{port}/gid_attrs/ndevs/{index}"] = ndev


def spark_tree(ports: list[PortSpec], socket: str = "enp1s0f0np0", socket_address: str | None = None) -> Tree:
    """A Spark's sysfs: every function of `ports` (and its netdev), links as real sysfs has them.
    The socket interface is one of the ports' netdevs, or a plain netdev of its own."""
    tree = Tree()
    addresses: dict[str, list[str]] = {}
    for spec in ports:
        pci, netdev = SPARK_FUNCTIONS[spec.device]
        domain = pci.split(":")[0]
        function = f"devices/pci{domain}:00/{pci}"
        base = f"{function}/infiniband/{spec.device}"
        if f"{base}/ports/{spec.port}/state" not in tree.files:
            _port_files(tree, base, spec)
        tree.links[f"class/infiniband/{spec.device}"] = f"../../{base}"
        tree.links[f"{base}/device"] = "../.."
        tree.files[f"{function}/net/{netdev}/mtu"] = str(spec.mtu)
        tree.files[f"{function}/net/{netdev}/operstate"] = spec.operstate
        tree.links[f"class/net/{netdev}"] = f"../../{function}/net/{netdev}"
        if spec.address:
            addresses.setdefault(netdev, []).append(spec.address)
    if socket_address:
        addresses.setdefault(socket, []).append(socket_address)
    if f"class/net/{socket}" not in tree.links:
        tree.files[f"devices/virtual/net/{socket}/mtu"] = "9000"
        tree.files[f"devices/virtual/net/{socket}/operstate"] = "up"
        tree.links[f"class/net/{socket}"] = f"../../devices/virtual/net/{socket}"
    links = [
        {"ifname": name, "addr_info": [{"family": "inet", "local": a, "prefixlen": 24} for a in found]}
        for name, found in sorted(addresses.items())
    ]
    tree.files["ip-addr.json"] = json.dumps(links)
    return tree


def write_tree(root: Path, tree: Tree) -> Path:
    """Write `tree` under `root` (made fresh where absent); `root` back."""
    for relative, text in tree.files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")
    for relative, target in tree.links.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.is_symlink():
            path.unlink()
        os.symlink(target, path)
    return root


def writer_source(tree: Tree) -> bytes:
    """`write_tree` as a program for a lab node's `python3 - ROOT` (the tree inside it, on stdin)."""
    return (f"TREE = {tree.to_json()!r}\n" + WRITER).encode()


WRITER = r"""
import json, os, shutil, sys
root, tree = sys.argv[1], json.loads(TREE)
shutil.rmtree(root, ignore_errors=True)
for relative, text in tree["files"].items():
    path = os.path.join(root, relative)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as handle:
        handle.write(text + "\n")
for relative, target in tree["links"].items():
    path = os.path.join(root, relative)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    os.symlink(target, path)
print(root)
"""
