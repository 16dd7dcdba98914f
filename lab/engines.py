"""Where each node's dockerd binary comes from: the system's, or trixie's unpacked into the cache."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

from lab.layout import Engine, LabError, cache_dir, cache_lock

SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"
TRIXIE_PACKAGES = ("docker.io",)  # dockerd runs beside bookworm's containerd and runc (DESIGN.md)

# Binaries the lab runs, and the Debian package that ships each.
PACKAGE_OF = {
    "dockerd": "docker.io",
    "containerd": "containerd",
    "runc": "runc",
    "sshd": "openssh-server",
    "ssh": "openssh-client",
    "ssh-keygen": "openssh-client",
    "apt-get": "apt",
    "dpkg": "dpkg",
    "debootstrap": "debootstrap",
    "tar": "tar",
    "nsenter": "util-linux",
    "unshare": "util-linux",
    "ip": "iproute2",
}


def find_binary(name: str) -> str:
    """Absolute path of `name`, or a LabError naming the package and `make setup`."""
    found = shutil.which(name, path=f"{os.environ.get('PATH', '')}:{SYSTEM_PATH}")
    if found is None:
        package = PACKAGE_OF.get(name, name)
        raise LabError(
            f"lab: {name} not found: install the Debian package {package} (make setup does it as root)"
        )
    return found


def debian_mirror(sources_dir: Path = Path("/etc/apt")) -> str:
    """The Debian mirror this machine's apt uses (deb822 or one-line format), else deb.debian.org."""
    for path in sorted((sources_dir / "sources.list.d").glob("*.sources")):
        mirror = mirror_from_deb822(path.read_text())
        if mirror:
            return mirror
    legacy = sources_dir / "sources.list"
    if legacy.exists():
        for line in legacy.read_text().splitlines():
            match = re.match(r"^deb\s+(?:\[[^\]]*\]\s+)?(\S+)\s+(\S+)", line.strip())
            if match and "security" not in match.group(2):
                return match.group(1).rstrip("/")
    return DEFAULT_MIRROR


def mirror_from_deb822(text: str) -> str | None:
    """First URI of a stanza that serves the main archive (not -security)."""
    for stanza in re.split(r"\n\s*\n", text):
        fields = {}
        for line in stanza.splitlines():
            key, _, value = line.partition(":")
            if value and not line.startswith(("#", " ")):
                fields[key.strip().lower()] = value.strip()
        uris, suites = fields.get("uris", ""), fields.get("suites", "")
        if uris and suites and "security" not in suites:
            return uris.split()[0].rstrip("/")
    return None


def trixie_dir() -> Path:
    return cache_dir() / "trixie"


def apt_options(base: Path) -> list[str]:
    """apt-get options that use a private sources list and state, leaving the system's apt untouched."""
    return [
        "-o", f"Dir::Etc::SourceList={base / 'apt' / 'sources.list'}",
        "-o", "Dir::Etc::SourceParts=/dev/null",
        "-o", "Dir::Etc::Preferences=/dev/null",
        "-o", "Dir::Etc::PreferencesParts=/dev/null",
        "-o", f"Dir::State::Lists={base / 'apt' / 'lists'}",
        "-o", f"Dir::Cache={base / 'apt' / 'cache'}",
        "-o", "APT::Sandbox::User=root",  # the cache is root's; _apt cannot write there
    ]  # fmt: skip


def ensure_trixie_engine() -> Path:
    """Unpacked trixie docker.io under the cache (fetched once); returns the tree's root."""
    base = trixie_dir()
    root = base / "root"
    if (root / ".complete").exists():
        return root
    with cache_lock("trixie-engine"):
        if not (root / ".complete").exists():  # or another process made it while this one waited
            _fetch_trixie_engine(base, root)
    return root


def _fetch_trixie_engine(base: Path, root: Path) -> None:
    for name in ("apt-get", "dpkg"):
        find_binary(name)
    if not Path(KEYRING).exists():
        raise LabError(f"lab: {KEYRING} missing: install debian-archive-keyring (it holds trixie's keys)")
    (base / "apt" / "lists" / "partial").mkdir(parents=True, exist_ok=True)
    (base / "apt" / "cache" / "archives" / "partial").mkdir(parents=True, exist_ok=True)
    debs = base / "debs"
    debs.mkdir(parents=True, exist_ok=True)
    mirror = debian_mirror()
    (base / "apt" / "sources.list").write_text(f"deb [signed-by={KEYRING}] {mirror} trixie main\n")
    options = apt_options(base)
    _run_apt(["apt-get", *options, "-q", "update"], cwd=debs, what=f"apt-get update (trixie from {mirror})")
    _run_apt(["apt-get", *options, "-q", "download", *TRIXIE_PACKAGES], cwd=debs, what="apt-get download")
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    for package in TRIXIE_PACKAGES:
        deb = _newest_deb(debs, package)
        _run_apt(["dpkg", "-x", str(deb), str(root)], cwd=debs, what=f"dpkg -x {deb.name}")
    if not (root / "usr" / "sbin" / "dockerd").exists():
        raise LabError(f"lab: trixie docker.io unpacked into {root} has no usr/sbin/dockerd")
    (root / ".complete").write_text("\n".join(p.name for p in sorted(debs.glob("*.deb"))) + "\n")


def _newest_deb(debs: Path, package: str) -> Path:
    found = sorted(debs.glob(f"{package}_*.deb"), key=lambda p: p.stat().st_mtime)
    if not found:
        raise LabError(f"lab: apt-get download left no {package}_*.deb in {debs}")
    return found[-1]


def _run_apt(argv: list[str], *, cwd: Path, what: str) -> None:
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-5:])
        raise LabError(f"lab: {what} failed (exit {done.returncode}):\n{tail}")


def engine_bin_dirs(engine: Engine) -> list[Path]:
    """Folders to put first on dockerd's PATH (its docker-proxy, docker-init)."""
    if engine is Engine.BOOKWORM:
        return []
    root = ensure_trixie_engine()
    return [root / "usr" / "sbin", root / "usr" / "bin"]


def dockerd_binary(engine: Engine) -> str:
    if engine is Engine.BOOKWORM:
        return find_binary("dockerd")
    return str(ensure_trixie_engine() / "usr" / "sbin" / "dockerd")
