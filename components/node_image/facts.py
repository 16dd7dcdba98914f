"""Facts: what a node's Docker holds, as values, and the pure functions that parse the node programs'
reports into them (the commands are in `programs.py`, run by `execute.py`)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from components.node_image.inputs import Node
from components.node_programs.wire import INFO_FORMAT as INFO_FORMAT  # (re-exported)
from components.node_programs.wire import INSPECT_FORMAT as INSPECT_FORMAT  # (re-exported)
from components.node_programs.wire import image_store
from components.provider_kit.reports import last_json_object

# `docker info`'s line (INFO_FORMAT): the store's kind, Docker's root, version and storage driver.
# One image per line (INSPECT_FORMAT): its ID, its layer list, its size.


@dataclass(frozen=True)
class Daemon:
    """What a node's Docker daemon is: its image store, data root and version."""

    store: str  # "classic" | "containerd"
    root_dir: str
    version: str
    driver: str = ""  # storage driver, e.g. overlay2


@dataclass(frozen=True)
class ImageInfo:
    """One image as `docker image inspect` shows it."""

    image_id: str
    layers: tuple[str, ...]
    size: int = 0


@dataclass
class Facts:
    """What one round trip to a node found (see `DockerOn.facts`)."""

    node: Node
    ref: str
    daemon: Daemon
    image: ImageInfo | None  # the image `ref` names there, None when absent
    history: str = ""  # `docker history` sizes of `ref` (asked of the source)
    images: list[ImageInfo] = field(default_factory=list)  # every image there (asked of the destination)
    free: int = 0  # bytes free under Docker's root (asked of the destination)
    python: str = "python3"
    blobs: frozenset[str] = frozenset()  # layer blobs in a containerd content store, by diff ID
    blobs_unlisted: tuple[str, ...] = ()  # why a containerd content store could not be listed


def same_image(a: ImageInfo, a_store: str, b: ImageInfo, b_store: str) -> bool:
    """Identity: the image ID within one store kind, the layer list across store kinds."""
    if a_store == b_store:
        return a.image_id == b.image_id
    return a.layers == b.layers


def parse_daemon(text: str) -> Daemon:
    status, root, version, *driver = text.strip().split("\t")
    return Daemon(
        store=image_store(status), root_dir=root, version=version, driver=driver[0] if driver else ""
    )


def parse_images(text: str) -> list[ImageInfo]:
    images = []
    for line in text.splitlines():
        if line.strip():
            image_id, layers, size = line.split("\t")
            images.append(ImageInfo(json.loads(image_id), tuple(json.loads(layers) or ()), int(size or 0)))
    return images


def parse_df_available(text: str) -> int:
    """Available bytes from `df -P -B1 PATH` (last line, fourth column)."""
    return int(text.strip().splitlines()[-1].split()[3])


def parse_layer_sizes(text: str, layer_count: int) -> list[int] | None:
    """Per-layer sizes (bottom first) from `docker history` sizes, when they line up with the layers."""
    sizes = [int(s) for s in text.split() if s.isdigit()]
    nonzero = [s for s in reversed(sizes) if s > 0]
    return nonzero if len(nonzero) == layer_count else None


def parse_blobs(text: str) -> frozenset[str]:
    """Digests of the blobs a containerd content store holds (its blob files, named by hex digest)."""
    names = (line.strip().removeprefix("sha256:") for line in text.splitlines())
    return frozenset(f"sha256:{name}" for name in names if re.fullmatch(r"[0-9a-f]{64}", name))


def parse_facts(node: Node, ref: str, text: str, history: bool, inventory: bool, python: bool) -> Facts:
    """The Facts in `docker_facts`' report (ValueError when it printed none)."""
    report = last_json_object(text)
    if report is None:
        raise ValueError(f"docker_facts printed no report: {text.strip()[-200:]!r}")
    found = parse_images(report.get("image") or "")
    facts = Facts(node, ref, parse_daemon(report["info"]), found[0] if found else None)
    facts.history = report.get("history") or ""
    facts.python = report.get("python") or "python3"
    if inventory:
        facts.images, facts.free = parse_images(report.get("images") or ""), int(report.get("free") or 0)
        facts.blobs = parse_blobs("\n".join(report.get("blobs") or []))
        facts.blobs_unlisted = tuple(str(why) for why in report.get("blobs_unlisted") or [])
    return facts


def facts_stderr(stdout: str, stderr: str) -> str:
    """What went wrong in a failed `docker_facts`: the stderr its report carries, else the session's."""
    return str((last_json_object(stdout) or {}).get("stderr") or stderr)


def parse_tag_report(stdout: str) -> dict:
    """`image_tag`'s report (its last stdout line); {} when there is none."""
    return last_json_object(stdout) or {}
