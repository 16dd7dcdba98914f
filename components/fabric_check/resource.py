"""The FabricCheck resource as the Pulumi program declares it (type `qwen35:FabricCheck`)."""

from __future__ import annotations

from typing import Any

import pulumi
import pulumi.dynamic as dynamic

from components.fabric_check.plan import ENFORCE, OUTPUT_KEYS, UNSET
from components.fabric_check.provider import FabricCheckProvider


class FabricCheck(dynamic.Resource, module="qwen35", name="FabricCheck"):
    """On one node, before any container: its RDMA ports, RoCE v2 GID and MTU are fit for NCCL; its
    outputs are what that node's NCCL is given (`ib_hca`, `gid_index`)."""

    ib_hca: pulumi.Output[list]
    gid_index: pulumi.Output[int | None]
    gids: pulumi.Output[dict]
    mtu: pulumi.Output[int | None]
    paths: pulumi.Output[dict]
    verdict: pulumi.Output[str]
    problems: pulumi.Output[list]
    throughput: pulumi.Output[dict | None]

    def __init__(
        self,
        name: str,
        *,
        node: dict[str, Any],
        fabric_ip: str,
        socket_ifname: str,
        mode: str = ENFORCE,
        pin: list[str] | None = None,
        gid: str | int = UNSET,
        mtu_expected: int | None = None,
        sysfs_root: str | None = None,
        reference: pulumi.Input[dict] | None = None,
        probe: dict[str, Any] | None = None,
        opts: pulumi.ResourceOptions | None = None,
    ):
        props = {
            "node": node,
            "fabric_ip": fabric_ip,
            "socket_ifname": socket_ifname,
            "mode": mode,
            "pin": pin,
            "gid": gid,
            "mtu_expected": mtu_expected,
            # Lab only: a tree laid out like /sys (with ip-addr.json) instead of the node's own.
            "sysfs_root": sysfs_root,
            # The head's recorded `node`, `mtu` and `paths` (on a worker): its MTU must match them.
            "reference": reference,
            # On a worker: the head to probe (node dict, name, fabric address, port) and min_gbps.
            "probe": probe,
            **{key: None for key in OUTPUT_KEYS},
        }
        super().__init__(FabricCheckProvider(), name, props, opts)
