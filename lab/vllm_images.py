"""Stand-ins for the hybrid build's base and donor images, built without a registry.

Each carries a real vLLM release tree (its `*.py` files only: no torch, no CUDA, small): the base on
the lab Debian image with a venv whose `python3` has pip (Debian's own python has no ensurepip), the
donor on busybox. Both are built with `docker build` over SSH, the context streamed as a tar, and
labelled with a hash of that context: a node that has the tag with the same label is left alone.
Also here: transformers' wheels, downloaded on this machine once so the hybrid build needs no index.
"""

from __future__ import annotations

import hashlib
import io
import re
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from components.config import ImageConfig, ImageStrategy
from lab.images import BUSYBOX_TAG, DEBIAN_TAG, FIXED_MTIME, busybox_image, check_tag, debian_image
from lab.layout import LabError, LabNode, cache_dir
from lab.ray_image import STANDIN_DIR, STANDIN_SOURCE, ray_image, vllm_entry_point
from lab.remote import docker

CONTENT_LABEL = "qwen35.lab.content"
BASE_VENV = "/opt/venv"
# The lab Debian image is bookworm (python 3.11); wheels fetched here must match it.
IMAGE_PYTHON = (3, 11)
VLLM_DIR = re.compile(r"^/[A-Za-z0-9_./-]*/vllm$")


def base_dockerfile(vllm_dir: str | None, debian: str) -> str:
    """Debian + a venv first on PATH (so the Dockerfile's default `python3` has pip) + the tree."""
    copy = f"COPY vllm/ {check_vllm_dir(vllm_dir)}/\n" if vllm_dir else ""
    return (
        f"FROM {debian}\n"
        f"RUN python3 -m venv {BASE_VENV} && {BASE_VENV}/bin/python3 -m pip --version\n"
        f"ENV PATH={BASE_VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n"
        f"{copy}"
        'CMD ["/bin/bash"]\n'
    )


def serving_base_dockerfile(vllm_dir: str | None, ray_tag: str) -> str:
    """The hybrid's base on the lab Ray image: Ray, the stand-in `vllm` CLI and its venv's `python3`
    (with pip) first on PATH, as the image has them, plus the tree. A hybrid built on it serves in the
    lab: its Ray containers start and `vllm serve` runs the stand-in, as the seed's base image does."""
    copy = f"COPY vllm/ {check_vllm_dir(vllm_dir)}/\n" if vllm_dir else ""
    return f"FROM {ray_tag}\n{copy}" + 'CMD ["/bin/bash"]\n'


def graft_donor_dockerfile(vllm_dir: str, debian: str) -> str:
    """The graft's donor: the base stand-in's venv with the tree importable by it (a .pth), no Ray, and
    the stand-in `vllm` CLI, so a graft built on it serves in the lab once the graft brings Ray."""
    parent = check_vllm_dir(vllm_dir).rsplit("/", 1)[0]
    return base_dockerfile(vllm_dir, debian) + (
        f"RUN python3 -c \"import site; open(site.getsitepackages()[0] + '/qwen35-vllm.pth', 'w')"
        f".write('{parent}\\n')\"\n"
        'RUN python3 -c "import importlib.util as u; '
        "assert u.find_spec('vllm') and not u.find_spec('ray')\"\n"
        f"COPY standin/standin_vllm.py {STANDIN_DIR}/standin_vllm.py\n"
        "COPY standin/vllm /usr/local/bin/vllm\n"
    )


def donor_dockerfile(vllm_dir: str, busybox: str) -> str:
    """busybox (a shell to look inside) + the donor tree; the hybrid build only copies from it."""
    return f'FROM {busybox}\nCOPY vllm/ {check_vllm_dir(vllm_dir)}/\nCMD ["/bin/sh"]\n'


def check_vllm_dir(vllm_dir: str | None) -> str:
    """The path lands in a Dockerfile: absolute, ending in /vllm, no spaces or shell characters."""
    if not vllm_dir or not VLLM_DIR.match(vllm_dir) or "/../" in vllm_dir:
        raise LabError(f"lab: {vllm_dir!r} is not an absolute path of a `vllm` package directory")
    return vllm_dir


def python_files(tree: Path) -> list[Path]:
    """The tree's `*.py` files (what the proof and the patcher read), in a stable order."""
    if not (tree / "__init__.py").is_file():
        raise LabError(f"lab: {tree} is not a vllm package directory (no __init__.py)")
    return sorted(p for p in tree.rglob("*.py") if "__pycache__" not in p.parts)


def standin_context(dockerfile: str, tree: Path | None, cli_python: str | None = None) -> bytes:
    """Build context tar: the Dockerfile and, under vllm/, the tree's `*.py`; same inputs, same bytes.
    `cli_python`: also the stand-in `vllm` CLI under standin/, run by that interpreter."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        add_file(tar, "Dockerfile", dockerfile.encode())
        if cli_python:
            add_file(tar, "standin/standin_vllm.py", STANDIN_SOURCE.read_bytes())
            add_file(tar, "standin/vllm", vllm_entry_point(cli_python).encode(), mode=0o755)
        for path in python_files(tree) if tree is not None else []:
            add_file(tar, f"vllm/{path.relative_to(tree).as_posix()}", path.read_bytes())
    return buffer.getvalue()


def folder_context(folder: Path) -> bytes:
    """A folder as a build context tar (fixed mtimes and owners, so reruns hit the build cache)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(p for p in folder.rglob("*") if p.is_file()):
            mode = 0o755 if path.stat().st_mode & 0o111 else 0o644
            add_file(tar, path.relative_to(folder).as_posix(), path.read_bytes(), mode)
    return buffer.getvalue()


def add_file(tar: tarfile.TarFile, name: str, data: bytes, mode: int = 0o644) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = len(data), FIXED_MTIME, mode
    tar.addfile(info, io.BytesIO(data))


def content_label(node: LabNode, tag: str) -> str | None:
    """The content label of `tag` on the node, or None when the image is absent."""
    found = docker(
        node,
        "image",
        "inspect",
        "--format",
        f'{{{{ index .Config.Labels "{CONTENT_LABEL}" }}}}',
        check_tag(tag),
        check=False,
    )
    return found.out if found.returncode == 0 else None


def build_standin(node: LabNode, tag: str, context: bytes, parent_id: str) -> str:
    """`docker build` the context on the node as `tag`, unless it is there with the same content
    (the context and the ID of the image it builds on)."""
    digest = hashlib.sha256(context + parent_id.encode()).hexdigest()[:16]
    if content_label(node, tag) == digest:
        return tag
    started = time.monotonic()
    built = docker(
        node,
        "build",
        "--network",
        "host",
        "--label",
        f"{CONTENT_LABEL}={digest}",
        "--tag",
        check_tag(tag),
        "-",
        input=context,
        timeout=600,
        check=False,
    )
    if built.returncode != 0:
        tail = "\n".join((built.out + "\n" + built.err).strip().splitlines()[-15:])
        raise LabError(f"lab: {node.name}: building stand-in {tag} failed (exit {built.returncode}):\n{tail}")
    if content_label(node, tag) != digest:
        raise LabError(f"lab: {node.name}: docker build reported success but {tag} lacks its content label")
    print(f"lab: {node.name}: built stand-in {tag} in {time.monotonic() - started:.0f}s")
    return tag


def base_standin(node: LabNode, tag: str, vllm_dir: str | None, tree: Path | None) -> str:
    """The base stand-in `tag` on the node: the lab Ray image + `tree` at `vllm_dir` (None: no tree)."""
    ray_tag, parent = ray_image(node)
    context = standin_context(serving_base_dockerfile(vllm_dir if tree else None, ray_tag), tree)
    return build_standin(node, tag, context, parent)


def donor_standin(node: LabNode, tag: str, vllm_dir: str, tree: Path) -> str:
    """The donor stand-in `tag` on the node: busybox + `tree` at `vllm_dir`."""
    parent = busybox_image(node)
    return build_standin(node, tag, standin_context(donor_dockerfile(vllm_dir, BUSYBOX_TAG), tree), parent)


# Where the graft's donor stand-in holds its vLLM (a graft finds it through the donor's python).
GRAFT_DONOR_VLLM_DIR = "/opt/vllm-donor/vllm"

# A Debian whose python differs from bookworm's 3.11 (trixie: 3.13), for a donor whose ABI is not the base's.
OTHER_SUITE = "trixie"
OTHER_PYTHON = (3, 13)
OTHER_GLIBC = (2, 41)


def graft_donor_standin(node: LabNode, tag: str, vllm_dir: str, tree: Path, suite: str | None = None) -> str:
    """The graft's donor stand-in `tag`: Debian (bookworm, or `suite`) + venv python + `tree` importable
    at `vllm_dir`, no Ray (as the seed's donor and NVIDIA's vLLM containers ship)."""
    debian = f"lab-debian:{suite}" if suite else DEBIAN_TAG
    parent = debian_image(node, debian, suite) if suite else debian_image(node)
    context = standin_context(
        graft_donor_dockerfile(vllm_dir, debian), tree, cli_python=f"{BASE_VENV}/bin/python3"
    )
    return build_standin(node, tag, context, parent)


def transformers_wheels(requirement: str) -> Path:
    """`requirement` and its dependencies as wheels, cached (one `pip download`, ~10 s, ~45 MB).

    With dependencies rather than `--no-deps`: the image then imports transformers for real and
    `pip check` sees a complete install, which is what the Sparks get from PyPI.
    """
    if sys.version_info[:2] != IMAGE_PYTHON:
        raise LabError(
            f"lab: this Python is {sys.version_info[0]}.{sys.version_info[1]} but the base stand-in runs "
            f"bookworm's {IMAGE_PYTHON[0]}.{IMAGE_PYTHON[1]}: the wheels would not install there"
        )
    name = re.sub(r"[^A-Za-z0-9.]+", "-", requirement).strip("-")
    target = cache_dir() / "wheels-transformers" / name
    marker = target / ".complete"
    if marker.exists():
        return target
    target.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "pip", "download", "--only-binary=:all:", requirement, "-d", str(target)]
    started = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-8:])
        raise LabError(f"lab: pip download {requirement} failed (exit {done.returncode}):\n{tail}")
    marker.write_text("\n".join(sorted(p.name for p in target.glob("*.whl"))) + "\n")
    print(f"lab: downloaded {requirement} wheels into {target} in {time.monotonic() - started:.0f}s")
    return target


def stage_wheels(requirement: str, dest: Path) -> Path:
    """`requirement`'s wheels in `dest` (patches/wheels/, ignored by git), where the hybrid build installs
    them from with no index; wheels of another requirement are removed (they would change the tag)."""
    wheels = transformers_wheels(requirement)
    dest.mkdir(parents=True, exist_ok=True)
    wanted = {p.name: p for p in wheels.glob("*.whl")}
    for stale in dest.iterdir():
        if stale.name not in wanted:
            stale.unlink()
    for name, source in wanted.items():
        if not (dest / name).exists():
            shutil.copyfile(source, dest / name)
    return dest


def lab_build_inputs(node: LabNode, image: ImageConfig, context: Path) -> None:
    """What a lab stack's hybrid or graft build needs on the head `node` before `pulumi up`: the base
    and donor stand-ins its image section names, and transformers' wheels in `context`/wheels/."""
    from tests.support.vllm_trees import BASE_VERSION, DONOR_VERSION, vllm_tree

    if image.strategy is ImageStrategy.HYBRID:
        base_standin(node, image.base_ref, image.base_vllm_dir, vllm_tree(BASE_VERSION))
        donor_standin(node, image.donor_ref, image.donor_vllm_dir, vllm_tree(DONOR_VERSION))
        stage_wheels(f"transformers{image.transformers}", context / "wheels")
    elif image.strategy is ImageStrategy.GRAFT:
        ray_tag, _ = ray_image(node)
        if image.base_ref != ray_tag:
            raise LabError(f"lab: a lab graft builds on the lab Ray image ({ray_tag}), not {image.base_ref}")
        graft_donor_standin(node, image.donor_ref, GRAFT_DONOR_VLLM_DIR, vllm_tree(DONOR_VERSION))
