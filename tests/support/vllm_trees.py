"""Real vLLM release trees for tests: downloaded once from PyPI, unpacked into a cache outside git.

`vllm_tree("0.14.0")` returns `<cache>/vllm/0.14.0/vllm`, the unpacked `vllm` package of that release.
The cache is `${QWEN35_CACHE:-~/.cache/qwen35-spark}`, so it survives between clean clones.
Concurrent callers serialise on a file lock; a tree is published only once it is complete.
Run `python -m tests.support.vllm_trees` to fetch both trees and print their paths.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

BASE_VERSION = "0.14.0"
DONOR_VERSION = "0.17.1"

# Only the pure-Python files matter, and they are the same in every platform wheel of a release.
# Pinning one platform makes the download the same on x86_64 and aarch64 hosts.
WHEEL_PLATFORM = "manylinux_2_31_x86_64"
DOWNLOAD_TIMEOUT_S = 1800
_MARKER = "tree.json"


class VllmTreeError(RuntimeError):
    """The vLLM release could not be downloaded or unpacked."""


def cache_root() -> Path:
    """The cache folder for downloaded trees (outside git, shared by clones on this machine)."""
    return Path(os.environ.get("QWEN35_CACHE") or "~/.cache/qwen35-spark").expanduser() / "vllm"


def pip_download_argv(version: str, dest: Path) -> list[str]:
    """The pip command that fetches the release wheel only (no dependencies, never an sdist)."""
    return [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--platform",
        WHEEL_PLATFORM,
        "--dest",
        str(dest),
        f"vllm=={version}",
    ]


def vllm_tree(version: str) -> Path:
    """Return the unpacked `vllm` package directory of release `version`, downloading it if needed."""
    version_dir = cache_root() / version
    tree = version_dir / "vllm"
    if (version_dir / _MARKER).is_file():
        return tree
    version_dir.parent.mkdir(parents=True, exist_ok=True)
    with open(version_dir.parent / f"{version}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (version_dir / _MARKER).is_file():
            _fetch(version, version_dir)
    return tree


def _fetch(version: str, version_dir: Path) -> None:
    # Anything here without the marker is a leftover of an interrupted run: start clean.
    shutil.rmtree(version_dir, ignore_errors=True)
    download_dir = version_dir / "download"
    download_dir.mkdir(parents=True)
    argv = pip_download_argv(version, download_dir)
    started = time.monotonic()
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=DOWNLOAD_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        raise VllmTreeError(f"pip download of vllm=={version} timed out ({DOWNLOAD_TIMEOUT_S} s)") from exc
    wheels = sorted(download_dir.glob(f"vllm-{version}-*.whl"))
    if proc.returncode != 0 or not wheels:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
        raise VllmTreeError(
            f"could not download vllm=={version} (pip exit {proc.returncode}):\n{tail}\n"
            f"command: {' '.join(argv)}\n"
            "The tests need PyPI (or a pip index/find-links carrying this wheel) to fetch the real tree."
        )
    download_s = time.monotonic() - started
    staging = version_dir / "staging"
    with zipfile.ZipFile(wheels[0]) as wheel:
        members = [m for m in wheel.namelist() if m.startswith("vllm/")]
        if "vllm/__init__.py" not in members:
            raise VllmTreeError(f"{wheels[0].name} has no vllm/__init__.py: not a vLLM wheel")
        wheel.extractall(staging, members)
    (staging / "vllm").rename(version_dir / "vllm")
    # The unpacked tree is all the tests read; the wheel would double the disk use and a fresh
    # download takes seconds, so it is not kept.
    shutil.rmtree(download_dir)
    shutil.rmtree(staging)
    record = {"version": version, "wheel": wheels[0].name, "download_seconds": round(download_s, 1)}
    (version_dir / _MARKER).write_text(json.dumps(record, indent=2) + "\n")


def main() -> int:
    for version in (BASE_VERSION, DONOR_VERSION):
        print(f"{version}\t{vllm_tree(version)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
