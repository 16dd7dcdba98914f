"""What a node's RoCE fabric looks like, for FabricCheck (runs ON A NODE; standard library only).

    fabric_facts SPEC    SPEC (JSON): sysfs (default "/sys"), socket_ifname, addresses

Reads, never changes. Prints one JSON report:
- `devices`: every RDMA device under `<sysfs>/class/infiniband/` (an absent folder is a node without
  RDMA: an empty list), each port's `state`, `phys_state`, `link_layer` and its used GID entries
  (`gids/<i>` with `gid_attrs/types/<i>` and `gid_attrs/ndevs/<i>`); unused entries read as zeros
  or fail with EINVAL and are left out;
- `netdevs`: the socket interface and every netdev a GID names: whether it exists, `operstate`,
  `mtu` (from `<sysfs>/class/net/<if>/`) and its IPv4 addresses.
Real sysfs entries are symlinks into `/sys/devices/…`: every path here is opened through them.

Addresses come from `ip -j addr show` (`addresses: "ip"`) or, for a test tree, from a file holding
what that command prints (`addresses: "<path>"`).
"""

from __future__ import annotations

import errno
import json
import os
import sys
from enum import IntEnum


class Exit(IntEnum):
    OK = 0
    USAGE = 2  # no SPEC, or not the JSON object described above
    ADDRESSES = 3  # the node's addresses could not be read (`ip` missing or its output unreadable)


ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"
IP_TIMEOUT_S = 20


def read(path: str) -> str | None:
    """A sysfs attribute's text, or None where it cannot be read (absent, EINVAL for unused)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read().strip()
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.EINVAL, errno.ENOTDIR, errno.EACCES, errno.EPERM):
            return None
        raise


def listing(path: str) -> list[str]:
    """The names in a sysfs folder (symlinks followed), [] where it does not exist."""
    try:
        return sorted(os.listdir(path))
    except (FileNotFoundError, NotADirectoryError):
        return []


def gid_entries(port_dir: str) -> list[dict]:
    """The port's used GID table entries: index, GID, type and netdev (zeros and EINVAL left out)."""
    entries = []
    names = [n for n in listing(os.path.join(port_dir, "gids")) if n.isdigit()]
    for index in sorted(names, key=int):
        gid = read(os.path.join(port_dir, "gids", index))
        if not gid or gid == ZERO_GID:
            continue
        attrs = os.path.join(port_dir, "gid_attrs")
        entries.append(
            {
                "index": int(index),
                "gid": gid.lower(),
                "type": read(os.path.join(attrs, "types", index)),
                "ndev": read(os.path.join(attrs, "ndevs", index)),
            }
        )
    return entries


def port_numbers(device_dir: str) -> list[int]:
    return sorted(int(n) for n in listing(os.path.join(device_dir, "ports")) if n.isdigit())


def devices(sysfs: str) -> list[dict]:
    """Every RDMA device and its ports, as sysfs shows them."""
    found = []
    root = os.path.join(sysfs, "class", "infiniband")
    for name in listing(root):
        device_dir = os.path.join(root, name)
        ports = []
        for number in port_numbers(device_dir):
            port_dir = os.path.join(device_dir, "ports", str(number))
            ports.append(
                {
                    "port": number,
                    "state": read(os.path.join(port_dir, "state")),
                    "phys_state": read(os.path.join(port_dir, "phys_state")),
                    "link_layer": read(os.path.join(port_dir, "link_layer")),
                    "gids": gid_entries(port_dir),
                }
            )
        # The PCI function's own netdevs: named in an error when no GID names one.
        netdevs = listing(os.path.join(device_dir, "device", "net"))
        found.append({"name": name, "ports": ports, "netdevs": netdevs})
    return found


def ip_addr_text(source: str) -> str:
    if source != "ip":
        with open(source, encoding="utf-8") as handle:
            return handle.read()
    import subprocess  # (only a real node pays for the import)

    proc = subprocess.run(
        ["ip", "-j", "addr", "show"], capture_output=True, text=True, timeout=IP_TIMEOUT_S, check=False
    )
    if proc.returncode != 0:
        raise OSError(f"`ip -j addr show` exited {proc.returncode}: {proc.stderr.strip()[-300:]}")
    return proc.stdout


def ipv4_addresses(text: str) -> dict[str, list[str]]:
    """Interface name -> its IPv4 addresses, from what `ip -j addr show` prints."""
    addresses: dict[str, list[str]] = {}
    for link in json.loads(text or "[]"):
        ifname = link.get("ifname")
        if not isinstance(ifname, str):
            continue
        for info in link.get("addr_info") or []:
            if info.get("family") == "inet" and isinstance(info.get("local"), str):
                addresses.setdefault(ifname, []).append(info["local"])
    return addresses


def netdev(sysfs: str, name: str, addresses: dict[str, list[str]]) -> dict:
    folder = os.path.join(sysfs, "class", "net", name)
    mtu = read(os.path.join(folder, "mtu"))
    return {
        "exists": os.path.isdir(folder),
        "operstate": read(os.path.join(folder, "operstate")),
        "mtu": int(mtu) if mtu and mtu.isdigit() else None,
        "addresses": addresses.get(name, []),
    }


def facts(spec: dict) -> tuple[Exit, dict]:
    sysfs = str(spec.get("sysfs") or "/sys")
    socket_ifname = str(spec["socket_ifname"])
    report: dict = {"sysfs": sysfs, "socket_ifname": socket_ifname}
    try:
        addresses = ipv4_addresses(ip_addr_text(str(spec.get("addresses") or "ip")))
    except (OSError, ValueError, AttributeError, TypeError) as exc:
        report["error"] = f"the node's addresses could not be read: {exc}"
        return Exit.ADDRESSES, report
    report["devices"] = devices(sysfs)
    names = {socket_ifname}
    for device in report["devices"]:
        names.update(device["netdevs"])
        for port in device["ports"]:
            names.update(g["ndev"] for g in port["gids"] if g["ndev"])
    report["netdevs"] = {name: netdev(sysfs, name, addresses) for name in sorted(names)}
    return Exit.OK, report


def main(argv: list[str]) -> int:
    try:
        spec = json.loads(argv[0]) if len(argv) == 1 else None
    except ValueError:
        spec = None
    if not isinstance(spec, dict) or not isinstance(spec.get("socket_ifname"), str):
        sys.stderr.write('usage: fabric_facts \'{"socket_ifname": "IF", "sysfs": "/sys"}\'\n')
        return Exit.USAGE
    status, report = facts(spec)
    report["exit"] = int(status)
    sys.stdout.write(json.dumps(report, sort_keys=True) + "\n")
    sys.stdout.flush()
    return int(status)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
