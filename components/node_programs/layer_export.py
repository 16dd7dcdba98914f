"""The store export of a NodeImage copy (a library of `layer_filter`, run ON THE SOURCE; standard
library only), and the archive output both of its modes write through.

With SPEC.export, no `docker save` runs: the layers to send are read from a classic overlay2 layer
store as `docker save` itself reads them (each layer's tar reassembled from its tar-split record and
its unpacked files, so the same bytes and the same diff ID), after checking that every one of them
can be read, before any byte is written. The archive is a `docker load` archive, or (SPEC.export.
layout "oci", for a containerd destination) an OCI image layout naming every blob by its digest.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import os
import zlib

from components.node_programs import wire


class StreamCounter:
    """Bytes read and written, shared with the watchdog thread."""

    def __init__(self):
        self.read = 0
        self.written = 0
        self.layer_bytes = 0
        self.layers_sent = 0
        self.layers_left_out = 0
        self.bytes_left_out = 0
        self.layout = ""
        self.unmatched = 0


def regular_file_header(name: str, size: int, mtime: int) -> bytes:
    """A ustar header for a rewritten small file (names here are short: manifest.json …)."""
    header = bytearray(512)
    header[0 : len(name)] = name.encode()
    header[100:108] = b"0000644\0"
    header[108:116] = b"0000000\0"
    header[116:124] = b"0000000\0"
    if size < 8**11:
        header[124:136] = f"{size:011o}\0".encode()
    else:  # GNU base-256: layers of 8 GiB and more
        header[124:136] = b"\x80" + size.to_bytes(11, "big")
    header[136:148] = f"{mtime:011o}\0".encode()
    header[156:157] = b"0"
    header[257:265] = b"ustar\x0000"
    header[148:156] = b" " * 8
    header[148:156] = f"{sum(header):06o}\0 ".encode()
    return bytes(header)


class ArchiveOut:
    """An archive's output: counts what reaches the sink (`written`) and, for an export that makes the
    archive itself, the archive's bytes (`read`; a filter's reader counts those), gzip-compressed when
    asked; `close()` writes the compressor's tail and flushes."""

    def __init__(self, sink, counter: StreamCounter, compress: str | None, counts_archive: bool = True):
        self.sink, self.counter, self.counts_archive = sink, counter, counts_archive
        self.compressor = zlib.compressobj(1, zlib.DEFLATED, 31) if compress == "gzip" else None

    def __call__(self, data: bytes) -> None:
        if self.counts_archive:
            self.counter.read += len(data)
        if self.compressor is not None:
            data = self.compressor.compress(data)
        if data:
            self.sink.write(data)
            self.counter.written += len(data)

    def close(self) -> None:
        if self.compressor is not None:
            tail = self.compressor.flush()
            self.sink.write(tail)
            self.counter.written += len(tail)
        self.sink.flush()


class ExportUnavailable(Exception):
    """The source's layer store cannot be read directly; `docker save` has to do."""


def tar_split_entries(path: str):
    """The entries of a layer's tar-split.json.gz: raw tar segments, and files by name and size.

    Docker keeps these so it can reproduce the exact bytes (so the same diff ID) of a layer's tar
    from the unpacked layer; `docker save` does the same.
    """
    with gzip.open(path, "rt") as stream:
        for line in stream:
            if line.strip():
                yield json.loads(line)


def layer_tar_size(split_path: str) -> int:
    """Length of the tar that `tar_split_entries` reassembles into."""
    total = 0
    for entry in tar_split_entries(split_path):
        if entry["type"] == 2:
            total += len(base64.b64decode(entry.get("payload") or ""))
        elif entry["type"] == 1:
            total += int(entry.get("size") or 0)
    return total


def write_layer_tar(split_path: str, diff_dir: str, write, chunk_size: int = 1 << 20) -> None:
    """Reassemble a layer's tar from its tar-split and its unpacked files, passing bytes to `write`."""
    top = os.path.realpath(diff_dir)
    for entry in tar_split_entries(split_path):
        if entry["type"] == 2:
            write(base64.b64decode(entry.get("payload") or ""))
            continue
        size = int(entry.get("size") or 0)
        if entry["type"] != 1 or not size:
            continue
        raw = entry.get("name_raw")
        name = base64.b64decode(raw).decode("utf-8", "surrogateescape") if raw else entry["name"]
        path = os.path.normpath(os.path.join(top, name.lstrip("/")))
        if not path.startswith(top + os.sep):
            raise ValueError(f"tar-split names a file outside the layer: {name!r}")
        with open(path, "rb") as handle:
            left = size
            while left:
                data = handle.read(min(left, chunk_size))
                if not data:
                    raise ValueError(f"{name!r} in the layer is shorter than its tar-split says")
                write(data)
                left -= len(data)


def export_plan(spec: dict) -> tuple[bytes, list[tuple[int, str, str, int]], list[int]]:
    """Check, before any byte is written, that every layer to send can be read from the layer store.

    Returns the image config, (index, tar-split path, unpacked dir, tar size) per layer to send, and
    (for the OCI layout, whose manifest lists every layer's size) every layer's tar size.
    """
    export = spec["export"]
    layers, keep_from = list(spec["layers"]), int(spec.get("keep_from", 0))
    skip = set(spec.get("leave_out") or layers[:keep_from])
    oci = export.get("layout") == "oci"
    sizes: list[int] = []
    base = os.path.join(export["root"], "image", export["driver"])
    image_hex = export["image_id"].split(":", 1)[1]
    try:
        with open(os.path.join(base, "imagedb", "content", "sha256", image_hex), "rb") as handle:
            config = handle.read()
        if hashlib.sha256(config).hexdigest() != image_hex:
            raise ExportUnavailable("the image config does not match its ID")
        plan = []
        for index, chain in enumerate(wire.chain_ids(layers)):
            folder = os.path.join(base, "layerdb", "sha256", chain.split(":", 1)[1])
            if layers[index] in skip:
                if oci:
                    sizes.append(layer_tar_size(os.path.join(folder, "tar-split.json.gz")))
                continue
            with open(os.path.join(folder, "diff")) as handle:
                if handle.read().strip() != layers[index]:
                    raise ExportUnavailable(f"layer {index} in the store is not {layers[index]}")
            with open(os.path.join(folder, "cache-id")) as handle:
                cache_id = handle.read().strip()
            split = os.path.join(folder, "tar-split.json.gz")
            unpacked = os.path.join(export["root"], export["driver"], cache_id, "diff")
            if not os.path.isdir(unpacked):
                raise ExportUnavailable(f"layer {index}: {unpacked} is missing")
            plan.append((index, split, unpacked, layer_tar_size(split)))
            sizes.append(plan[-1][3])
    except OSError as exc:
        raise ExportUnavailable(f"{type(exc).__name__}: {exc}") from exc
    return config, plan, sizes


def export_stream(spec: dict, sink, counter: StreamCounter) -> None:
    """Write a docker-load archive holding only the layers to send, read from the layer store."""
    config, plan, sizes = export_plan(spec)
    write = ArchiveOut(sink, counter, spec.get("compress"))
    if spec["export"].get("layout") == "oci":
        return export_oci(spec, config, plan, sizes, write)

    def add(name: str, size: int) -> None:
        write(regular_file_header(name, size, 0))

    counter.layout = "export"
    counter.layers_left_out = len(spec["layers"]) - len(plan)
    image_hex = spec["export"]["image_id"].split(":", 1)[1]
    add(f"{image_hex}.json", len(config))
    write(config + bytes(-len(config) % 512))
    for index, split, unpacked, size in plan:
        add(f"layers/{index}.tar", size)
        write_layer_tar(split, unpacked, write)
        write(bytes(-size % 512))
        counter.layers_sent += 1
        counter.layer_bytes += size
    paths = [f"layers/{index}.tar" for index in range(len(spec["layers"]))]
    manifest = json.dumps([{"Config": f"{image_hex}.json", "RepoTags": [spec["new_tag"]], "Layers": paths}])
    add("manifest.json", len(manifest))
    write(manifest.encode() + bytes(-len(manifest) % 512) + bytes(1024))
    write.close()


OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"


def export_oci(spec: dict, config: bytes, plan: list, sizes: list[int], write: ArchiveOut) -> None:
    """The same layers as an OCI image layout: every blob named by its digest (a layer's is its diff
    ID), so a containerd image store takes the blobs left out from its content store."""
    counter = write.counter

    def add(name: str, data: bytes) -> None:
        write(regular_file_header(name, len(data), 0) + data + bytes(-len(data) % 512))

    def blob(digest: str) -> str:
        return "blobs/sha256/" + digest.split(":", 1)[1]

    layers = list(spec["layers"])
    config_digest = "sha256:" + hashlib.sha256(config).hexdigest()
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": config_digest,
                "size": len(config),
            },
            "layers": [
                {"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": digest, "size": size}
                for digest, size in zip(layers, sizes, strict=True)
            ],
        },
        separators=(",", ":"),
    ).encode()
    manifest_digest = "sha256:" + hashlib.sha256(manifest).hexdigest()
    new_tag = spec["new_tag"]
    index = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [
            {
                "mediaType": OCI_MANIFEST,
                "digest": manifest_digest,
                "size": len(manifest),
                "annotations": {
                    "io.containerd.image.name": wire.full_reference(new_tag),
                    "org.opencontainers.image.ref.name": new_tag.rsplit(":", 1)[1],
                },
            }
        ],
    }
    counter.layout = "export-oci"
    counter.layers_left_out = len(layers) - len(plan)
    add("oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
    add(blob(config_digest), config)
    for position, split, unpacked, size in plan:
        write(regular_file_header(blob(layers[position]), size, 0))
        write_layer_tar(split, unpacked, write)
        write(bytes(-size % 512))
        counter.layers_sent += 1
        counter.layer_bytes += size
    add(blob(manifest_digest), manifest)
    add("index.json", json.dumps(index, separators=(",", ":")).encode())
    docker_manifest = [
        {"Config": blob(config_digest), "RepoTags": [new_tag], "Layers": [blob(d) for d in layers]}
    ]
    add("manifest.json", json.dumps(docker_manifest, separators=(",", ":")).encode())
    write(bytes(1024))
    write.close()
