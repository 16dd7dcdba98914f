"""The argv a NodeImage runs on a node: its node programs (`components/node_programs/`: docker_facts,
image_tag, layer_filter) and the plain Docker commands. Pure: building them touches no node."""

from __future__ import annotations

import json
from collections.abc import Sequence

from components.image_ref import split_tagged
from components.node_image.facts import INFO_FORMAT, INSPECT_FORMAT, Daemon, ImageInfo
from components.node_programs import program_argv

# The tag a copy loads under until it is verified (`<name>:qwen35-tmp-<random>`).
TMP_TAG_PREFIX = "qwen35-tmp-"


def temporary_tag(ref: str, token: str) -> str:
    """The tag a copy of `ref` loads under until it is verified (`token`: random, per copy)."""
    name, _ = split_tagged(ref)
    return f"{name}:{TMP_TAG_PREFIX}{token}"


def _spec(value: dict, sort_keys: bool = False) -> str:
    """A program's SPEC argument: compact JSON."""
    return json.dumps(value, separators=(",", ":"), sort_keys=sort_keys)


def facts_argv(ref: str, history: bool = False, inventory: bool = False, python: bool = False) -> list[str]:
    """One command for a node's facts (`node_programs/docker_facts.py`): the daemon and image `ref`,
    optionally its layer sizes and the node's inventory (every image's layers, free bytes under
    Docker's root, a containerd store's layer blobs); always the node's system python3 (`python` is
    kept for callers: it costs nothing more)."""
    spec = {
        "ref": ref,
        "history": history,
        "inventory": inventory,
        "info_format": INFO_FORMAT,
        "image_format": INSPECT_FORMAT,
    }
    return program_argv("docker_facts", [_spec(spec)])


def tag_argv(mode: str, spec: dict, python: str = "python3") -> list[str]:
    """`image_tag MODE SPEC` (retag, join, leave, drop): the tag and its record of holders."""
    return program_argv("image_tag", [mode, _spec(spec)], python)


def load_argv(
    tmp_ref: str, ref: str, wanted: ImageInfo, same_store: bool, python: str = "python3", claim: str = ""
) -> list[str]:
    """The destination's end of the copy (`node_programs/image_tag.py load`): `docker load`, then tag
    `ref` only if the image loaded under `tmp_ref` is the wanted one, drop `tmp_ref`, record `claim`
    as the tag's holder. Identity as in `same_image`: the image ID within one store kind, the layer
    list across."""
    spec = {
        "tmp_ref": tmp_ref,
        "ref": ref,
        "compare": "id" if same_store else "layers",
        "want": wanted.image_id if same_store else list(wanted.layers),
        "inspect_format": INSPECT_FORMAT,
        "claim": claim,
    }
    return tag_argv("load", spec, python)


def filter_spec(
    layers: Sequence[str],
    keep_from: int,
    new_tag: str,
    compress: str = "none",
    export: dict | None = None,
    leave_out: Sequence[str] = (),
) -> dict:
    """What the layer filter needs to know; plain JSON."""
    if compress not in ("none", "gzip"):
        raise ValueError(f"compression {compress!r}: use 'none' or 'gzip'")
    return {
        "layers": list(layers),
        "keep_from": keep_from,
        "leave_out": list(leave_out),
        "new_tag": new_tag,
        "compress": compress,
        "export": export,
    }


def export_spec(source: Daemon, image_id: str, destination_store: str) -> dict:
    """The filter's `export`: read the image's layers straight from the source's classic layer store."""
    return {
        "root": source.root_dir,
        "driver": source.driver,
        "image_id": image_id,
        # a containerd store takes left-out blobs from its content store only by digest
        "layout": "oci" if destination_store == "containerd" else "docker",
    }


def filter_argv(spec: dict, python: str = "python3") -> list[str]:
    """The layer filter as run on the source: the program travels in the command itself."""
    return program_argv("layer_filter", [_spec(spec, sort_keys=True)], python)


def save_argv(ref: str) -> list[str]:
    """`docker save`: the image as a tar on stdout (the filter's input)."""
    return ["docker", "save", ref]


def inspect_argv(ref: str, formatted: bool = True) -> list[str]:
    """`docker image inspect` of one image: one INSPECT_FORMAT line (else Docker's JSON)."""
    return ["docker", "image", "inspect", *(["--format", INSPECT_FORMAT] if formatted else []), ref]


def untag_argv(ref: str) -> list[str]:
    return ["docker", "image", "rm", ref]
