"""The layer filter of a NodeImage copy (runs ON THE SOURCE; standard library only).

    layer_filter SPEC    stdin: a `docker save` tar (either layout); stdout: the stream for `docker load`
    layer_filter SPEC    with SPEC.export: no stdin; the layers to send read from a classic overlay2
                         layer store (what `docker save` itself does), so no `docker save` runs: the
                         library `layer_export`, which also holds the archive output both modes use

It reads a `docker save` stream of either layout (OCI since Docker 25: `blobs/sha256/<diff id>`;
before: `<v1 id>/layer.tar`), leaves out the layers the destination already has (SPEC.keep_from
bottom layers), renames the image to the temporary tag SPEC.new_tag and optionally gzips the output.
Its one-line JSON report (layers sent and left out, bytes, layout) goes to stderr as
`qwen35-report {...}` (`wire.REPORT_MARKER`): stdout is the stream. Stall and deadline are the
transfer's watch's job.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from collections.abc import Sequence
from enum import IntEnum

from components.node_programs import wire
from components.node_programs.layer_export import (
    ArchiveOut,
    ExportUnavailable,
    StreamCounter,
    export_stream,
    regular_file_header,
)


class Exit(IntEnum):
    """Exit status (the report line on stderr says more)."""

    OK = 0
    STREAM_ERROR = 1  # the save stream ended early or could not be parsed
    EXPORT_UNAVAILABLE = 3  # the layer store cannot be read: `docker save` has to do
    USAGE = 4


def split_json_object(text: str) -> dict[str, str]:
    """Top-level keys of a compact JSON object mapped to their raw value text (byte-exact)."""
    result: dict[str, str] = {}
    i, n = 1, len(text)
    if not text.startswith("{"):
        raise ValueError("not a JSON object")
    while i < n:
        while i < n and text[i] in " \t\r\n,":
            i += 1
        if i >= n or text[i] == "}":
            break
        key_end = _json_string_end(text, i)
        key = json.loads(text[i:key_end])
        i = key_end
        while text[i] in " \t\r\n:":
            i += 1
        start, depth = i, 0
        while i < n:
            char = text[i]
            if char == '"':
                i = _json_string_end(text, i)
                continue
            if char in "{[":
                depth += 1
            elif char in "}]":
                if depth == 0:
                    break
                depth -= 1
            elif char == "," and depth == 0:
                break
            i += 1
        result[key] = text[start:i].strip()
    return result


def _json_string_end(text: str, start: int) -> int:
    i = start + 1
    while text[i] != '"':
        i += 2 if text[i] == "\\" else 1
    return i + 1


def legacy_layer_depth(v1_json: str, chains: Sequence[str]) -> int | None:
    """Which layer (index into `chains`) a `<v1 id>/json` of an old-layout save describes, or None.

    Docker before 25 names each layer folder by a v1 ID: sha256 of the folder's json without `id`,
    with `parent` as a digest, plus `layer_id` (the chain ID); lower layers were hashed before `os`
    was set. The answer is only trusted when the recomputed hash equals the folder's own ID.
    """
    raw = split_json_object(v1_json)
    own = json.loads(raw.pop("id", '""'))
    if "parent" in raw:
        raw["parent"] = json.dumps("sha256:" + json.loads(raw["parent"]))
    for drop_os in (True, False):
        fields = dict(raw)
        if drop_os:
            fields.pop("os", None)
        for depth, chain in enumerate(chains):
            fields["layer_id"] = json.dumps(chain)
            text = "{" + ",".join(f"{json.dumps(k)}:{fields[k]}" for k in sorted(fields)) + "}"
            if hashlib.sha256(text.encode()).hexdigest() == own:
                return depth
    return None


def retag_metadata(name: str, data: bytes, new_tag: str) -> bytes:
    """manifest.json / index.json / repositories with every image name replaced by `new_tag`."""
    doc = json.loads(data)
    repo, tag = new_tag.rsplit(":", 1)
    if name == "manifest.json":
        for item in doc:
            item["RepoTags"] = [new_tag]
    elif name == "index.json":
        for entry in doc.get("manifests", []):
            notes = entry.get("annotations") or {}
            if "io.containerd.image.name" in notes:
                notes["io.containerd.image.name"] = wire.full_reference(new_tag)
            if "org.opencontainers.image.ref.name" in notes:
                notes["org.opencontainers.image.ref.name"] = tag
    elif name == "repositories":
        targets = [v for tags in doc.values() for v in tags.values()]
        doc = {repo: {tag: targets[0]}} if targets else {}
    return json.dumps(doc, separators=(",", ":")).encode()


def tar_header_fields(header: bytes) -> tuple[str, bytes, int, str]:
    """(name, typeflag, size, linkname) of one 512-byte tar header (ustar, GNU base-256 sizes)."""
    field = header[124:136]
    if field[0] & 0x80:
        size = int.from_bytes(field[1:], "big")
    else:
        size = int(field.split(b"\0", 1)[0].strip() or b"0", 8)
    name = header[0:100].split(b"\0", 1)[0]
    if header[257:262] == b"ustar":
        prefix = header[345:500].split(b"\0", 1)[0]
        if prefix:
            name = prefix + b"/" + name
    link = header[157:257].split(b"\0", 1)[0]
    return (
        name.decode("utf-8", "surrogateescape"),
        header[156:157],
        size,
        link.decode("utf-8", "surrogateescape"),
    )


def pax_records(data: bytes) -> dict[str, str]:
    """The key=value records of a PAX extended header."""
    records, i = {}, 0
    while i < len(data):
        space = data.index(b" ", i)
        length = int(data[i:space])
        key, _, value = data[space + 1 : i + length - 1].partition(b"=")
        records[key.decode()] = value.decode("utf-8", "surrogateescape")
        i += length
    return records


REGULAR = (b"0", b"\0")  # tar type flags of a regular file
_BLOB = re.compile(r"blobs/sha256/([0-9a-f]{64})")  # an OCI layout's blob (a layer's: its diff ID)
_LEGACY = re.compile(r"([0-9a-f]{64})/(json|layer\.tar)")  # the legacy layout's per-layer files
_METADATA = ("manifest.json", "index.json", "repositories")  # what names the image: retagged
CHUNK = 1 << 20


class TarEntry:
    """One member of a tar stream: its header block, the extended headers before it (pax, GNU long
    names: `meta`), and its path, type, size and link target with those applied."""

    def __init__(self, header: bytes, meta: list[bytes], name: str, typ: bytes, size: int, link: str):
        self.header, self.meta, self.typ, self.size, self.link = header, meta, typ, size, link
        self.path = name[2:] if name.startswith("./") else name
        self.padded = (size + 511) // 512 * 512  # its data as stored: whole 512-byte blocks

    @property
    def mtime(self) -> int:
        return int(self.header[136:148].split(b"\0", 1)[0].strip() or b"0", 8)


class TarReader:
    """Reads a tar stream entry by entry (`next_entry`, then that entry's data), counting bytes in
    `counter.read`. A global pax header goes to `passthrough` as it is met: it belongs to the
    archive, whatever becomes of the entries after it."""

    def __init__(self, source, counter: StreamCounter, passthrough):
        self.source, self.counter, self.passthrough = source, counter, passthrough

    def read_exact(self, count: int) -> bytes:
        data = self.source.read(count)
        while len(data) < count:
            more = self.source.read(count - len(data))
            if not more:
                raise EOFError(f"the save stream ended early ({self.counter.read + len(data)} bytes read)")
            data += more
        self.counter.read += len(data)
        return data

    def discard(self, count: int) -> None:
        while count:
            count -= len(self.read_exact(min(count, CHUNK)))

    def chunks(self, count: int):
        """The next `count` bytes, a chunk at a time."""
        while count:
            data = self.read_exact(min(count, CHUNK))
            yield data
            count -= len(data)

    def rest(self):
        """Whatever follows the end marker (Docker pads archives to a record boundary)."""
        while True:
            data = self.source.read(CHUNK)
            if not data:
                return
            self.counter.read += len(data)
            yield data

    def next_entry(self) -> TarEntry | None:
        """The next entry, its data still to read; None at the end marker."""
        meta: list[bytes] = []
        overrides: dict[str, str] = {}
        while True:
            header = self.source.read(512)
            if len(header) < 512:
                raise EOFError("the save stream ended without a tar end marker")
            self.counter.read += 512
            if header == bytes(512):
                return None
            name, typ, size, link = tar_header_fields(header)
            if typ not in (b"x", b"L", b"K", b"g"):
                size = int(overrides.get("size", size))
                name, link = overrides.get("path", name), overrides.get("linkpath", link)
                return TarEntry(header, meta, name, typ, size, link)
            size = int(overrides.get("size", size)) if typ == b"x" else size
            data = self.read_exact((size + 511) // 512 * 512)
            if typ == b"g":
                self.passthrough(header + data)
                continue
            meta.append(header + data)
            if typ == b"x":
                overrides.update(pax_records(data[:size]))
            else:
                text = data[:size].split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
                overrides["path" if typ == b"L" else "linkpath"] = text


LEAVE_OUT, RETAG, V1_JSON, SEND = "leave out", "retag", "v1 json", "send"


class LayerChoice:
    """Which entries of a save stream to leave out, from the spec and what the stream showed so far
    (each legacy layer's depth, from its v1 json; the paths already left out)."""

    def __init__(self, spec: dict, counter: StreamCounter):
        self.layers = list(spec["layers"])
        keep_from = int(spec.get("keep_from", 0))
        # Left out: the given diff IDs (a containerd store holding their blobs), else the bottom
        # `keep_from` layers (a classic store holding them as a chain).
        self.skip = set(spec.get("leave_out") or self.layers[:keep_from])
        self.all_layers = set(self.layers)
        self.chains = wire.chain_ids(self.layers)
        self.v1_depth: dict[str, int | None] = {}
        self.left_out_paths: set[str] = set()
        self.counter = counter

    def decide(self, entry: TarEntry) -> tuple[str, bool]:
        """What to do with `entry` (LEAVE_OUT, RETAG, V1_JSON or SEND) and whether it is a layer;
        notes the stream's layout on the way."""
        path, regular = entry.path, entry.typ in REGULAR
        blob, legacy = _BLOB.fullmatch(path), _LEGACY.fullmatch(path)
        if blob:
            self.counter.layout = "oci"
        elif legacy and not self.counter.layout:
            self.counter.layout = "legacy"
        is_layer = leave_out = False
        if blob and regular and "sha256:" + blob.group(1) in self.all_layers:
            is_layer, leave_out = True, "sha256:" + blob.group(1) in self.skip
        elif legacy and legacy.group(2) == "layer.tar":
            if regular:
                depth = self.v1_depth.get(legacy.group(1))
                is_layer = True
                leave_out = depth is not None and self.layers[depth] in self.skip
                if depth is None and self.skip:
                    self.counter.unmatched += 1
            elif entry.typ in (b"1", b"2"):
                # Newer saves may link the old path to the blob: drop the link with its target.
                target = os.path.normpath(os.path.join(os.path.dirname(path), entry.link))
                leave_out = target in self.left_out_paths
        if leave_out:
            self.left_out_paths.add(path)
            return LEAVE_OUT, is_layer
        if path in _METADATA and regular:
            return RETAG, False
        if legacy and legacy.group(2) == "json" and regular:
            return V1_JSON, False
        return SEND, is_layer

    def note_v1_json(self, entry: TarEntry, data: bytes) -> None:
        """A legacy layer's v1 json names its depth (by chain ID): its layer.tar comes later."""
        layer_id = _LEGACY.fullmatch(entry.path).group(1)
        try:
            self.v1_depth[layer_id] = legacy_layer_depth(data[: entry.size].decode(), self.chains)
        except (ValueError, IndexError, UnicodeDecodeError):
            self.v1_depth[layer_id] = None


def filter_stream(spec: dict, source, sink, counter: StreamCounter) -> None:
    """Copy a `docker save` tar from `source` to `sink` (file objects), leaving out present layers.

    `spec`: layers (diff IDs, bottom first), keep_from (how many bottom layers to leave out),
    new_tag (temporary name:tag for the load), compress ("none" | "gzip").
    """
    out = ArchiveOut(sink, counter, spec.get("compress"), counts_archive=False)
    tar = TarReader(source, counter, out)
    choice = LayerChoice(spec, counter)
    while True:
        entry = tar.next_entry()
        if entry is None:
            break
        action, is_layer = choice.decide(entry)
        if action == LEAVE_OUT:
            tar.discard(entry.padded)
            if is_layer:
                counter.layers_left_out += 1
                counter.bytes_left_out += entry.size
            continue
        if action == RETAG:
            data = retag_metadata(entry.path, tar.read_exact(entry.padded)[: entry.size], spec["new_tag"])
            out(regular_file_header(entry.path, len(data), entry.mtime) + data + bytes(-len(data) % 512))
            continue
        for block in (*entry.meta, entry.header):
            out(block)
        if action == V1_JSON:
            data = tar.read_exact(entry.padded)
            out(data)
            choice.note_v1_json(entry, data)
            continue
        if is_layer:
            counter.layers_sent += 1
            counter.layer_bytes += entry.size
        for data in tar.chunks(entry.padded):
            out(data)
    out(bytes(1024))  # the end marker
    for data in tar.rest():
        out(data)
    out.close()


def main(argv: list[str]) -> int:
    """stdin = docker save (unless exporting), stdout = the stream for docker load."""
    if len(argv) != 1:
        sys.stderr.write("usage: layer_filter SPEC\n")
        return Exit.USAGE
    spec = json.loads(argv[0])
    counter = StreamCounter()
    try:
        if spec.get("export"):
            export_stream(spec, sys.stdout.buffer, counter)
        else:
            filter_stream(spec, sys.stdin.buffer, sys.stdout.buffer, counter)
    except ExportUnavailable as exc:
        sys.stderr.write(f"export-unavailable: {exc}\n")
        sys.stderr.write(
            f"{wire.REPORT_MARKER} "
            + json.dumps({**vars(counter), "error": f"export-unavailable: {exc}"})
            + "\n"
        )
        return Exit.EXPORT_UNAVAILABLE
    except (EOFError, ValueError, OSError) as exc:
        sys.stderr.write(f"{type(exc).__name__}: {exc}\n")
        sys.stderr.write(
            f"{wire.REPORT_MARKER} "
            + json.dumps({**vars(counter), "error": f"{type(exc).__name__}: {exc}"})
            + "\n"
        )
        return Exit.STREAM_ERROR
    sys.stderr.write(f"{wire.REPORT_MARKER} " + json.dumps(vars(counter)) + "\n")
    sys.stderr.flush()
    return Exit.OK


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
