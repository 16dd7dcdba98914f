"""Stand-in images made without a registry: busybox FROM scratch, and a debootstrapped Debian."""

from __future__ import annotations

import io
import os
import re
import shutil
import subprocess
import tarfile
import time
from collections.abc import Callable
from pathlib import Path

from lab.engines import debian_mirror, find_binary
from lab.layout import LabError, LabNode, cache_dir, cache_lock, data_dir
from lab.remote import docker, ssh_argv

BUSYBOX_TAG = "lab-busybox:1"
DEBIAN_TAG = "lab-debian:bookworm"
DEBIAN_SUITE = "bookworm"
DEBIAN_INCLUDE = ("python3", "python3-venv", "ca-certificates")
BUSYBOX_PATHS = ("/bin/busybox", "/usr/bin/busybox")
FIXED_MTIME = 1_700_000_000  # same context bytes everywhere, so builds agree across nodes
TAG_PATTERN = re.compile(r"^[a-z0-9][a-z0-9._/-]{0,127}:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")

BUSYBOX_DOCKERFILE = b'FROM scratch\nCOPY rootfs/ /\nCMD ["/bin/sh"]\n'

# What the lab makes once and keeps across test runs: each costs a build, a debootstrap or a 6.5 GB
# load to make again. Everything else on a node is a test's (a stack's build, a copy under a test
# tag): `clear_left_images` removes it when a session starts the node and the disk is short.
KEPT_REPOSITORIES = frozenset(
    {
        "lab-busybox",
        "lab-debian",
        "lab-ray",
        "lab-standin-mp",
        "lab-vllm-base",
        "lab-vllm-cpu",
        "lab-vllm-cpu-install",
        "lab-vllm-donor",
        "lab-vllm-graft-donor",
    }
)


def check_tag(tag: str) -> str:
    if not TAG_PATTERN.match(tag):
        raise LabError(f"lab: image tag {tag!r} is not of the form name:tag (lowercase name)")
    return tag


def image_id(node: LabNode, tag: str) -> str | None:
    """The image's ID on the node, or None when absent."""
    found = docker(node, "image", "inspect", "--format", "{{.Id}}", check_tag(tag), check=False)
    return found.out if found.returncode == 0 and found.out else None


def left_images(listing: str) -> list[str]:
    """From `docker image ls --format '{{.Repository}}:{{.Tag}}'`: the references a test left (not
    one of KEPT_REPOSITORIES, not untagged)."""
    refs = []
    for line in listing.splitlines():
        ref = line.strip()
        repository, _, tag = ref.rpartition(":")
        if ref and repository and tag != "<none>" and repository not in KEPT_REPOSITORIES:
            refs.append(ref)
    return refs


# Below this much free space under the lab's data root, a session clears what earlier runs left. Above
# it, their builds stay: a content-tagged build found again is not built again (minutes a run).
CLEAR_BELOW_BYTES = 12 << 30


def disk_short(free_bytes: int | None = None) -> bool:
    """Whether the lab's data root has less than CLEAR_BELOW_BYTES free (`free_bytes`: as measured)."""
    if free_bytes is None:
        found = os.statvfs(data_dir() if data_dir().exists() else "/")
        free_bytes = found.f_bavail * found.f_frsize
    return free_bytes < CLEAR_BELOW_BYTES


def clear_left_images(node: LabNode) -> list[str]:
    """Remove what earlier test runs left on a node no session used yet: every image a test tagged,
    then the dangling ones. Builds under a new content tag each run would otherwise fill the disk
    (about 1 GB a run on node-a) until NodeImage's disk preflight refuses a copy. An image a
    container uses stays (no force); what is removed is returned."""
    listing = docker(node, "image", "ls", "--format", "{{.Repository}}:{{.Tag}}", timeout=60).out
    removed = []
    for ref in left_images(listing):
        if docker(node, "image", "rm", ref, timeout=120, check=False).returncode == 0:
            removed.append(ref)
    docker(node, "image", "prune", "--force", timeout=300, check=False)
    return removed


def static_busybox() -> Path:
    """busybox-static's binary (a dynamic busybox would not run in a FROM scratch image)."""
    for candidate in BUSYBOX_PATHS:
        path = Path(candidate)
        if path.exists() and not elf_interpreter(path.read_bytes()[:4096]):
            return path
    raise LabError("lab: no static busybox: install the Debian package busybox-static (make setup does it)")


def elf_interpreter(head: bytes) -> bool:
    """True if the ELF header lists a PT_INTERP segment (a dynamically linked program)."""
    if head[:4] != b"\x7fELF" or head[4] != 2:  # 64-bit only; the lab runs on amd64/arm64
        return True
    order = "little" if head[5] == 1 else "big"
    phoff = int.from_bytes(head[0x20:0x28], order)
    phentsize = int.from_bytes(head[0x36:0x38], order)
    phnum = int.from_bytes(head[0x38:0x3A], order)
    for index in range(phnum):
        offset = phoff + index * phentsize
        if int.from_bytes(head[offset : offset + 4], order) == 3:  # PT_INTERP
            return True
    return False


def busybox_applets(busybox: Path) -> list[str]:
    done = subprocess.run([str(busybox), "--list"], capture_output=True, text=True, check=True)
    return sorted({name for name in done.stdout.split() if re.fullmatch(r"[A-Za-z0-9_.\[-]+", name)})


def busybox_context(busybox: Path, applets: list[str]) -> bytes:
    """A build context tar: Dockerfile plus rootfs/bin/busybox and a symlink per applet."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:

        def add(name: str, data: bytes | None = None, mode: int = 0o644, link: str | None = None) -> None:
            info = tarfile.TarInfo(name)
            info.mtime = FIXED_MTIME
            info.mode = mode
            if link is not None:
                info.type = tarfile.SYMTYPE
                info.linkname = link
                tar.addfile(info)
            elif data is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))

        add("Dockerfile", BUSYBOX_DOCKERFILE)
        for folder in ("rootfs", "rootfs/bin", "rootfs/tmp", "rootfs/etc"):
            add(folder, mode=0o1777 if folder.endswith("tmp") else 0o755)
        add("rootfs/bin/busybox", busybox.read_bytes(), mode=0o755)
        add("rootfs/etc/passwd", b"root:x:0:0:root:/root:/bin/sh\n")
        add("rootfs/etc/group", b"root:x:0:\n")
        for applet in applets:
            if applet != "busybox":
                add(f"rootfs/bin/{applet}", link="busybox", mode=0o777)
    return buffer.getvalue()


def busybox_image(node: LabNode, tag: str = BUSYBOX_TAG) -> str:
    """Build the busybox image on the node with `docker build` over SSH (skipped when present); its ID."""
    existing = image_id(node, tag)
    if existing:
        return existing
    busybox = static_busybox()
    context = busybox_context(busybox, busybox_applets(busybox))
    docker(node, "build", "--network", "host", "--tag", tag, "-", input=context, timeout=300)
    built = image_id(node, tag)
    if not built:
        raise LabError(f"lab: {node.name}: docker build reported success but {tag} is missing")
    return built


def debian_rootfs_tarball(suite: str = DEBIAN_SUITE) -> Path:
    """A cached minbase Debian root filesystem with python3 (made with debootstrap once, ~50 s)."""
    cache = cache_dir()
    tarball = cache / f"debian-{suite}-minbase.tar"
    if tarball.exists():
        return tarball
    with cache_lock(tarball.name):
        if tarball.exists():  # made by another process while this one waited
            return tarball
        return _debootstrap(suite, tarball)


def _debootstrap(suite: str, tarball: Path) -> Path:
    cache = tarball.parent
    debootstrap = find_binary("debootstrap")
    find_binary("tar")
    if os.geteuid() != 0:
        raise LabError("lab: must run as root (debootstrap needs it)")
    cache.mkdir(parents=True, exist_ok=True)
    # Named by suite too: `lab fetch` debootstraps two suites at once in one process.
    work = cache / f"rootfs-{suite}-{os.getpid()}"
    mirror = debian_mirror()
    argv = [
        debootstrap,
        "--variant=minbase",
        f"--include={','.join(DEBIAN_INCLUDE)}",
        suite,
        str(work),
        mirror,
    ]
    started = time.monotonic()
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=1200)
        if done.returncode != 0:
            log = work / "debootstrap" / "debootstrap.log"
            detail = log.read_text(errors="replace")[-2000:] if log.exists() else done.stderr[-2000:]
            raise LabError(f"lab: debootstrap {suite} from {mirror} failed:\n{detail}")
        partial = tarball.with_suffix(".tar.partial")
        subprocess.run(
            ["tar", "-C", str(work), "--numeric-owner", "-cf", str(partial), "."], check=True, timeout=600
        )
        partial.replace(tarball)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"lab: debootstrap {suite} made {tarball} in {time.monotonic() - started:.0f}s")
    return tarball


def debian_image(node: LabNode, tag: str = DEBIAN_TAG, suite: str = DEBIAN_SUITE) -> str:
    """`docker import` the cached Debian rootfs (of `suite`) on the node over SSH (skipped when
    present); its ID."""
    existing = image_id(node, tag)
    if existing:
        return existing
    tarball = debian_rootfs_tarball(suite)
    with open(tarball, "rb") as stream:
        change = 'CMD ["/bin/bash"]'
        docker(node, "import", "--change", change, "-", check_tag(tag), stdin=stream, timeout=600)
    imported = image_id(node, tag)
    if not imported:
        raise LabError(f"lab: {node.name}: docker import reported success but {tag} is missing")
    return imported


def save_image(node: LabNode, tag: str, saved: Path, stale: str, timeout: float = 600) -> None:
    """`docker save` of `tag` on the node into `saved` (whole or not at all); other tarballs matching
    `stale` beside it (images for inputs that no longer exist) are removed, with their .json records."""
    saved.parent.mkdir(parents=True, exist_ok=True)
    partial = saved.with_name(f"{saved.name}.{os.getpid()}.partial")
    with open(partial, "wb") as out:
        done = subprocess.run(
            ssh_argv(node, ["docker", "save", tag]), stdout=out, stderr=subprocess.PIPE, timeout=timeout
        )
    if done.returncode != 0:
        partial.unlink(missing_ok=True)
        raise LabError(
            f"lab: {node.name}: docker save {tag} failed: {done.stderr.decode(errors='replace')[-500:]}"
        )
    partial.replace(saved)
    for old in saved.parent.glob(stale):
        if old != saved:
            old.unlink(missing_ok=True)
            old.with_suffix(".json").unlink(missing_ok=True)


def cached_image(
    node: LabNode, tag: str, saved: Path, build: Callable[[], None], timeout: float = 600
) -> str:
    """The ID of image `tag` on the node: present, loaded from its tarball `saved`, or made by `build`
    (which leaves it on the node and saved)."""
    existing = image_id(node, tag)
    if existing:
        return existing
    started = time.monotonic()
    # Another test session (a private lab beside this one) making the same image now: wait for its
    # tarball, then load that.
    with cache_lock(f"image-{saved.stem}"):
        built = not saved.exists()
        if built:
            build()
    if not built:
        with open(saved, "rb") as stream:
            docker(node, "load", stdin=stream, timeout=timeout)
    how = f"built and saved to {saved}" if built else f"loaded from {saved}"
    found = image_id(node, tag)
    if not found:
        raise LabError(f"lab: {node.name}: {tag} is missing after it was {how}")
    print(f"lab: {node.name}: {tag} {how} in {time.monotonic() - started:.0f}s")
    return found
