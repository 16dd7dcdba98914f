"""The facts program (`components/node_programs/fabric_facts.py`) and the probe
(`components/node_programs/fabric_probe.py`) as a node runs them: their argv, and what their exit
status means.

Each travels in its command line (`program_argv`: `python3 -I -S -c …`); its one JSON report comes
back on stdout (parsed in `facts.py`). Building these touches no node.
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Mapping
from typing import Any

from components.node_programs import fabric_facts, fabric_probe, program_argv

DEFAULT_SYSFS = "/sys"
# A lab tree (`nodes[].sysfs_root`) stands in for the node's addresses too: this file in it holds
# what `ip -j addr show` would print. Real sysfs has no such file; a real node runs `ip`.
ADDRESSES_FILE = "ip-addr.json"
# What the program's exit status means (declared once, in the node program).
EXIT_HINTS = {
    fabric_facts.Exit.USAGE: "the facts program was given a bad SPEC (a bug in this program)",
    fabric_facts.Exit.ADDRESSES: "the node needs `ip` (iproute2) with JSON output (`ip -j addr show`)",
}


def facts_spec(props: Mapping[str, Any]) -> dict[str, Any]:
    """What the facts program reads: the sysfs root, the socket interface, where addresses come from."""
    root = props.get("sysfs_root")
    return {
        "sysfs": root or DEFAULT_SYSFS,
        "socket_ifname": str(props["socket_ifname"]),
        "addresses": posixpath.join(root, ADDRESSES_FILE) if root else "ip",
    }


def facts_argv(props: Mapping[str, Any], python: str = "python3") -> list[str]:
    """The command run on the node."""
    return program_argv("fabric_facts", [json.dumps(facts_spec(props), sort_keys=True)], python)


# The probe's bounds: at most 1 GiB or 3 s of sending; the listener gives up after PROBE_DEADLINE_S.
PROBE_MAX_BYTES = 1 << 30
PROBE_MAX_S = 3.0
PROBE_DEADLINE_S = 20.0
PROBE_HINTS = {
    fabric_probe.Exit.USAGE: "the probe was given a bad SPEC (a bug in this program)",
    fabric_probe.Exit.PORT_BUSY: "something else listens on that port: set fabric.probe_port to a free one",
    fabric_probe.Exit.NOT_LOCAL: "the head does not hold that address: correct nodes[].fabric_ip",
}


def probe_spec(probe: Mapping[str, Any]) -> dict[str, Any]:
    """What both ends of the probe are given: the head's fabric address, the port and the bounds."""
    return {
        "host": str(probe["host"]),
        "port": int(probe["port"]),
        "deadline_s": PROBE_DEADLINE_S,
        "max_bytes": PROBE_MAX_BYTES,
        "max_s": PROBE_MAX_S,
    }


def probe_argv(verb: str, probe: Mapping[str, Any], python: str = "python3") -> list[str]:
    """`fabric_probe listen` (run on the head) or `fabric_probe send` (run on the worker)."""
    if verb not in ("listen", "send"):
        raise ValueError(f"probe verb {verb!r}: give listen or send")
    return program_argv("fabric_probe", [verb, json.dumps(probe_spec(probe), sort_keys=True)], python)
