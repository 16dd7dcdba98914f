"""The lab Ray image, built without a registry: Debian rootfs + Python + Ray + the stand-in `vllm`.

Slow parts are cached under `${QWEN35_CACHE:-~/.cache/qwen35-spark}/lab/`: Ray's wheels (downloaded
on this machine once, so the build itself needs no network and no proxy CA) and the built image as a
`docker save` tarball. The tag is a hash of everything that goes into the image, so a node that has the
tag has exactly this image; a node that lacks it loads the cached tarball over SSH, and only when that
is missing too is the image built (on the first node asked), then saved for every other node.
"""

from __future__ import annotations

import hashlib
import io
import platform
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from lab.images import (
    DEBIAN_TAG,
    FIXED_MTIME,
    cached_image,
    debian_image,
    debian_rootfs_tarball,
    save_image,
)
from lab.layout import LabError, LabNode, cache_dir, cache_lock
from lab.remote import docker

RAY_VERSION = "2.60.0"
RAY_REQUIREMENT = f"ray[default]=={RAY_VERSION}"
IMAGE_NAME = "lab-ray"
# The Debian rootfs is bookworm: its python3 is 3.11 and its glibc 2.36. Wheels downloaded here must
# install there, so this machine's Python must be the same minor version and glibc no newer.
IMAGE_PYTHON = (3, 11)
IMAGE_GLIBC = (2, 36)
STANDIN_SOURCE = Path(__file__).with_name("standin_vllm.py")
VENV = "/opt/ray"
STANDIN_DIR = "/opt/vllm-standin"
# Marks the throw-away install stage, so it can be pruned once the image is saved (it holds the wheels).
INSTALL_STAGE_LABEL = "qwen35.lab-ray-install-stage"


def vllm_entry_point(python: str) -> str:
    """/usr/local/bin/vllm: runs the stand-in with `python` (the lab Ray image's venv, which has `ray`)."""
    return f"""#!{python}
# Lab stand-in for vLLM (a test double). Source: lab/standin_vllm.py in qwen35-spark.
import sys

sys.path.insert(0, "{STANDIN_DIR}")
from standin_vllm import main

sys.exit(main())
"""


VLLM_ENTRY_POINT = vllm_entry_point(f"{VENV}/bin/python3")


def dockerfile(base: str = DEBIAN_TAG) -> str:
    """Two stages, so the wheels never stay in a layer: install into a venv, copy only the venv."""
    return f"""\
FROM {base} AS install
LABEL {INSTALL_STAGE_LABEL}=1
COPY wheels/ /wheels/
RUN python3 -m venv {VENV} \\
 && PIP_DISABLE_PIP_VERSION_CHECK=1 {VENV}/bin/pip install --no-cache-dir --no-index \\
      --find-links /wheels "{RAY_REQUIREMENT}" \\
 && {VENV}/bin/ray --version

FROM {base}
COPY --from=install {VENV} {VENV}
COPY standin/standin_vllm.py {STANDIN_DIR}/standin_vllm.py
COPY standin/vllm /usr/local/bin/vllm
ENV PATH={VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
LABEL qwen35.lab="ray {RAY_VERSION} + stand-in vllm (test double)"
RUN ray --version && vllm serve --help >/dev/null
CMD ["/bin/bash"]
"""


def wheels_dir() -> Path:
    return (
        cache_dir()
        / "wheels"
        / f"ray-{RAY_VERSION}-cp{IMAGE_PYTHON[0]}{IMAGE_PYTHON[1]}-{platform.machine()}"
    )


def check_host_python(version: tuple[int, int], glibc: tuple[int, ...]) -> None:
    """Wheels for the image are downloaded by this machine's pip: it must match the image's Python."""
    if version != IMAGE_PYTHON:
        raise LabError(
            f"lab: this Python is {version[0]}.{version[1]} but the lab Ray image runs bookworm's "
            f"{IMAGE_PYTHON[0]}.{IMAGE_PYTHON[1]}: its wheels would not match; run the tests with a "
            f"Python {IMAGE_PYTHON[0]}.{IMAGE_PYTHON[1]} venv"
        )
    if glibc and glibc > IMAGE_GLIBC:
        raise LabError(
            f"lab: this machine's glibc {'.'.join(map(str, glibc))} is newer than bookworm's "
            f"{'.'.join(map(str, IMAGE_GLIBC))}: pip could pick wheels the image cannot load"
        )


def _glibc() -> tuple[int, ...]:
    name, version = platform.libc_ver()
    return tuple(int(p) for p in version.split(".") if p.isdigit()) if name == "glibc" else ()


def ensure_wheels() -> Path:
    """Ray and its dependencies as wheels in the cache (one `pip download`, ~15 s, ~110 MB)."""
    target = wheels_dir()
    if (target / ".complete").exists():
        return target
    with cache_lock(target.name):
        if (target / ".complete").exists():  # made by another process while this one waited
            return target
        return _download_wheels(target)


def _download_wheels(target: Path) -> Path:
    check_host_python(sys.version_info[:2], _glibc())
    partial = target.with_name(target.name + ".partial")
    partial.mkdir(parents=True, exist_ok=True)
    argv = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--only-binary=:all:",
        RAY_REQUIREMENT,
        "-d",
        str(partial),
    ]
    started = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-8:])
        raise LabError(f"lab: pip download {RAY_REQUIREMENT} failed (exit {done.returncode}):\n{tail}")
    (partial / ".complete").write_text("\n".join(sorted(p.name for p in partial.glob("*.whl"))) + "\n")
    if target.exists():
        raise LabError(f"lab: {target} exists without .complete: remove it and run again")
    partial.rename(target)
    print(f"lab: downloaded {RAY_REQUIREMENT} wheels into {target} in {time.monotonic() - started:.0f}s")
    return target


def wheels_for(python: tuple[int, int], glibc: tuple[int, int]) -> Path:
    """Ray's wheels for another CPython (the lab's trixie donor: 3.13), cached: `pip download` with that
    interpreter's tags, every manylinux its glibc accepts (~10 s, ~110 MB)."""
    machine = platform.machine()
    tag = f"cp{python[0]}{python[1]}"
    target = cache_dir() / "wheels" / f"ray-{RAY_VERSION}-{tag}-{machine}"
    if (target / ".complete").exists():
        return target
    with cache_lock(target.name):
        if not (target / ".complete").exists():
            _download_for(target, python, machine, glibc)
    return target


def _download_for(target: Path, python: tuple[int, int], machine: str, glibc: tuple[int, int]) -> None:
    tag = f"cp{python[0]}{python[1]}"
    platforms = [f"manylinux_2_{minor}_{machine}" for minor in range(17, glibc[1] + 1)]
    argv = [sys.executable, "-m", "pip", "download", "--only-binary=:all:", "--implementation", "cp",
            "--python-version", f"{python[0]}.{python[1]}", "--abi", tag, "--abi", "abi3", "--abi", "none",
            *(f"--platform={p}" for p in [*platforms, f"manylinux2014_{machine}", "any"]),
            RAY_REQUIREMENT, "-d", str(target)]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-8:])
        raise LabError(
            f"lab: pip download {RAY_REQUIREMENT} for {tag} failed (exit {done.returncode}):\n{tail}"
        )
    (target / ".complete").write_text("\n".join(sorted(p.name for p in target.glob("*.whl"))) + "\n")


def build_context(wheels: Path, standin_source: bytes) -> bytes:
    """The build context tar (Dockerfile, wheels, stand-in), byte-identical for identical inputs."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:

        def add(name: str, data: bytes, mode: int = 0o644) -> None:
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), FIXED_MTIME, mode
            tar.addfile(info, io.BytesIO(data))

        add("Dockerfile", dockerfile().encode())
        add("standin/standin_vllm.py", standin_source)
        add("standin/vllm", VLLM_ENTRY_POINT.encode(), mode=0o755)
        for wheel in sorted(wheels.glob("*.whl")):
            add(f"wheels/{wheel.name}", wheel.read_bytes())
    return buffer.getvalue()


def image_tag(context: bytes, base_identity: str) -> str:
    """`lab-ray:<hash>` of the build context and the base rootfs it builds on."""
    digest = hashlib.sha256(context)
    digest.update(base_identity.encode())
    return f"{IMAGE_NAME}:{digest.hexdigest()[:16]}"


def rootfs_identity(tarball: Path) -> str:
    """Name, size and mtime of the cached rootfs: a re-made rootfs gives a new image tag."""
    stat = tarball.stat()
    return f"{tarball.name}:{stat.st_size}:{int(stat.st_mtime)}"


def saved_image(tag: str) -> Path:
    return cache_dir() / "images" / f"{tag.replace(':', '-')}.tar"


def ray_image(node: LabNode) -> tuple[str, str]:
    """(tag, image ID) of the lab Ray image on `node`: present, loaded from the cache, or built."""
    context = build_context(ensure_wheels(), STANDIN_SOURCE.read_bytes())
    tag = image_tag(context, rootfs_identity(debian_rootfs_tarball()))
    saved = saved_image(tag)

    def build() -> None:
        debian_image(node)
        built = docker(
            node, "build", "--network", "host", "--tag", tag, "-", input=context, timeout=900, check=False
        )
        if built.returncode != 0:
            tail = "\n".join(built.err.splitlines()[-15:] or built.out.splitlines()[-15:])
            raise LabError(f"lab: {node.name}: building {tag} failed (exit {built.returncode}):\n{tail}")
        save_image(node, tag, saved, f"{IMAGE_NAME}-*.tar")
        docker(node, "image", "prune", "--force", "--filter", f"label={INSTALL_STAGE_LABEL}", check=False)

    return tag, cached_image(node, tag, saved, build)


def ray_images(nodes: list[LabNode]) -> dict[str, str]:
    """node name -> image ID of the lab Ray image, on every node (built at most once)."""
    return {node.name: ray_image(node)[1] for node in nodes}
