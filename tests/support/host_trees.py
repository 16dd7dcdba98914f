"""Host trees for the node proof's software facts (unit and lab): a folder laid out like `/` with
what a DGX Spark's host shows (the NVRM line of /proc/driver/nvidia/version, the kernel release, each
ConnectX function's firmware) plus `nvidia-smi.txt`, what `nvidia-smi` prints. A tree is a value, as
fabric_trees' are, written here with `write_tree` or on a lab node with `writer_source`."""

from __future__ import annotations

from components.node_programs.node_software import SMI_FILE
from tests.support.fabric_trees import Tree

NVRM = (
    "NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  {}  Release Build  "
    "(dvs-builder@U22-I3-AF03-09-1)  Tue Sep 23 09:38:35 UTC 2025\n"
    "GCC version:  gcc version 13.3.0 (Ubuntu 13.3.0-6ubuntu2~24.04)"
)
SMI = (
    "+-----------------------------------------------------------------------------------------+\n"
    "| NVIDIA-SMI {0}              Driver Version: {0}      CUDA Version: {1}     |\n"
    "|-----------------------------------------+------------------------+----------------------+"
)
KERNEL = "6.11.0-1016-nvidia"
FIRMWARE = {"rocep1s0f0": "28.45.1020", "rocep1s0f1": "28.45.1020"}


def host_tree(driver: str = "580.95.05", cuda: str = "13.0", firmware: dict[str, str] | None = None) -> Tree:
    """A Spark's host software as files under a root."""
    files = {
        "proc/driver/nvidia/version": NVRM.format(driver),
        "proc/sys/kernel/osrelease": KERNEL,
        SMI_FILE: SMI.format(driver, cuda),
    }
    for device, version in (FIRMWARE if firmware is None else firmware).items():
        files[f"sys/class/infiniband/{device}/fw_ver"] = version
    return Tree(files=files)
