"""What a node's host runs, for the node proof's drift (runs ON A NODE, on the host, no container;
standard library only).

    node_software SPEC    SPEC (JSON): root (default "/")

Reads, never changes. Prints one JSON report, each fact None where it cannot be read:
- `driver`: the NVIDIA driver's version (`<root>/proc/driver/nvidia/version`, else nvidia-smi's);
- `cuda`: the CUDA version that driver supports (nvidia-smi's `CUDA Version:`);
- `kernel`: the kernel release (`<root>/proc/sys/kernel/osrelease`);
- `firmware`: each RDMA device's firmware (`<root>/sys/class/infiniband/<dev>/fw_ver`).
nvidia-smi runs only on the real root; a test tree (`root` other than "/") stands in for it with
`nvidia-smi.txt`, holding what `nvidia-smi` prints.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from enum import IntEnum


class Exit(IntEnum):
    OK = 0
    USAGE = 2  # no SPEC, or not the JSON object described above


SMI_FILE = "nvidia-smi.txt"
SMI_TIMEOUT_S = 20
# `NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  580.95.05  Release Build  (…)  <date>`
_NVRM = re.compile(r"^NVRM version:.*?Kernel Module(?: for \S+)?\s+(\d+(?:\.\d+)+)\b", re.M)
_SMI_DRIVER = re.compile(r"Driver Version:\s*(\d+(?:\.\d+)+)")
_SMI_CUDA = re.compile(r"CUDA Version:\s*(\d+(?:\.\d+)+)")


def read(path: str) -> str | None:
    """A file's text, or None where it cannot be read."""
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except OSError:
        return None


def driver_of(proc_version: str | None) -> str | None:
    """The driver's version from /proc/driver/nvidia/version's NVRM line."""
    found = _NVRM.search(proc_version or "")
    return found.group(1) if found else None


def smi_versions(text: str | None) -> tuple[str | None, str | None]:
    """(driver, CUDA) from what `nvidia-smi` prints in its header."""
    driver, cuda = _SMI_DRIVER.search(text or ""), _SMI_CUDA.search(text or "")
    return (driver.group(1) if driver else None, cuda.group(1) if cuda else None)


def osrelease_of(text: str | None) -> str | None:
    """The kernel release: the file's one line, or None when empty."""
    line = (text or "").strip()
    return line or None


def smi_text(root: str) -> str | None:
    """What nvidia-smi prints (a test tree's file stands in for it); None without it."""
    if root != "/":
        return read(os.path.join(root, SMI_FILE))
    try:
        done = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=SMI_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def firmware(root: str) -> dict[str, str]:
    """RDMA device -> its firmware version (none: a node without RDMA)."""
    folder = os.path.join(root, "sys", "class", "infiniband")
    try:
        devices = sorted(os.listdir(folder))
    except OSError:
        return {}
    found = {}
    for device in devices:
        text = (read(os.path.join(folder, device, "fw_ver")) or "").strip()
        if text:
            found[device] = text
    return found


def facts(root: str) -> dict:
    """Every fact this program reads under `root`."""
    smi_driver, cuda = smi_versions(smi_text(root))
    return {
        "driver": driver_of(read(os.path.join(root, "proc", "driver", "nvidia", "version"))) or smi_driver,
        "cuda": cuda,
        "kernel": osrelease_of(read(os.path.join(root, "proc", "sys", "kernel", "osrelease"))),
        "firmware": firmware(root),
    }


def main(argv: list[str]) -> int:
    try:
        spec = json.loads(argv[1])
        root = str(spec.get("root") or "/")
    except (IndexError, ValueError, AttributeError) as exc:
        print(json.dumps({"error": f"usage: node_software SPEC ({exc})"}))
        return Exit.USAGE
    print(json.dumps(facts(root), sort_keys=True))
    return Exit.OK


if __name__ == "__main__":
    sys.exit(main(sys.argv))
