"""BuildKit for lab builds: Debian trixie's docker-buildx, unpacked into the cache, never installed.

pulumi_docker.Image builds with BuildKit by default, through the daemon's own BuildKit; the docker CLI
here has no buildx plugin, so `docker build` uses the legacy builder. Running the plugin binary
standalone (with DOCKER_HOST from the node's SSH session and a private DOCKER_CONFIG, so nobody's
`docker build` changes) drives the same daemon-side BuildKit. The lab's nodes share this machine's
filesystem, so the binary's path is valid in their SSH sessions.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from lab.engines import apt_options, ensure_trixie_engine, trixie_dir
from lab.layout import LabError, cache_dir

PACKAGE = "docker-buildx"
PLUGIN = Path("usr/libexec/docker/cli-plugins/docker-buildx")


def buildx_dir() -> Path:
    return cache_dir() / "buildx"


def ensure_buildx() -> Path:
    """The docker-buildx binary from trixie (downloaded and unpacked once, ~13 MB)."""
    root = buildx_dir() / "root"
    binary = root / PLUGIN
    if (root / ".complete").exists():
        return binary
    ensure_trixie_engine()  # leaves trixie's apt lists in its private apt state
    debs = buildx_dir() / "debs"
    debs.mkdir(parents=True, exist_ok=True)
    options = apt_options(trixie_dir())
    fetched = _apt(["apt-get", *options, "-q", "download", PACKAGE], debs)
    if fetched.returncode != 0:  # lists too old for the mirror: refresh them once
        _check(_apt(["apt-get", *options, "-q", "update"], debs), "apt-get update (trixie)")
        _check(_apt(["apt-get", *options, "-q", "download", PACKAGE], debs), f"apt-get download {PACKAGE}")
    found = sorted(debs.glob(f"{PACKAGE}_*.deb"), key=lambda p: p.stat().st_mtime)
    if not found:
        raise LabError(f"lab: apt-get download left no {PACKAGE}_*.deb in {debs}")
    root.mkdir(parents=True, exist_ok=True)
    _check(_apt(["dpkg", "-x", str(found[-1]), str(root)], debs), f"dpkg -x {found[-1].name}")
    if not binary.is_file():
        raise LabError(f"lab: {found[-1].name} unpacked into {root} has no {PLUGIN}")
    (root / ".complete").write_text(found[-1].name + "\n")
    return binary


def buildx_argv(binary: Path) -> list[str]:
    """The start of a standalone `buildx` command line, run in a node's SSH session."""
    config = buildx_dir() / "config"
    config.mkdir(parents=True, exist_ok=True)
    return ["env", f"DOCKER_CONFIG={config}", str(binary)]


def _apt(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=600)


def _check(done: subprocess.CompletedProcess[str], what: str) -> None:
    if done.returncode != 0:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-5:])
        raise LabError(f"lab: {what} failed (exit {done.returncode}):\n{tail}")
