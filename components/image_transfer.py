"""The pure parts of copying an image between nodes: layer identity, and the save-stream filter.

The filter runs ON THE SOURCE NODE inside `docker save IMG | <filter> | ssh dest docker load`. It is
written here as ordinary, tested Python (standard library only) and shipped to the node as one
`python3 -I -S -c` line (`filter_argv`). It reads a `docker save` tar stream of either layout (OCI since
Docker 25: `blobs/sha256/<diff id>`; before: `<v1 id>/layer.tar`), leaves out the layers the
destination already has, renames the image to a temporary tag, counts bytes, and kills the pipe
when no byte moved for `stall_s` seconds or the deadline passed.
"""

from __future__ import annotations

import base64
import functools
import gzip
import hashlib
import inspect
import json
import os
import re
import signal
import sys
import threading
import time
import zlib
from collections.abc import Iterable, Sequence

from components.remote import bash_argv, shell_join

# Markers the filter writes on stderr; the orchestrator parses them (`parse_filter_stderr`).
PROGRESS = "qwen35-progress"
SUMMARY = "qwen35-summary"
FAILURE = "qwen35-error"
PIPESTATUS = "qwen35-pipestatus"
# Markers the destination's load-verify-promote step writes on stderr (see node_image).
LOADED = "qwen35-loaded"
PROMOTED = "qwen35-promoted"
PREFLIGHT = "qwen35-preflight"  # the pipeline's first step: its exit status, before any stage starts
FILTER_EXIT_STALL = 124


# ---- layer identity (used on both sides) -----------------------------------------------------------


def chain_ids(layers: Sequence[str]) -> list[str]:
    """Chain IDs of a layer list (diff IDs, bottom first): what a classic store keys layers by."""
    chains: list[str] = []
    for diff_id in layers:
        if not chains:
            chains.append(diff_id)
        else:
            chains.append("sha256:" + hashlib.sha256(f"{chains[-1]} {diff_id}".encode()).hexdigest())
    return chains


def present_chains(images_layers: Iterable[Sequence[str]]) -> set[str]:
    """Every chain ID a classic daemon holds, from the layer lists of all its images."""
    found: set[str] = set()
    for layers in images_layers:
        found.update(chain_ids(list(layers)))
    return found


def present_prefix(layers: Sequence[str], chains_on_destination: set[str]) -> int:
    """How many bottom layers the destination already has as a chain (docker load skips those)."""
    count = 0
    for index, chain in enumerate(chain_ids(layers)):
        if chain not in chains_on_destination:
            break
        count = index + 1
    return count


def split_reference(reference: str) -> tuple[str, str]:
    """'name:tag' -> ('name', 'tag'); a registry port ('host:5000/x:1') is not mistaken for a tag."""
    name, sep, tag = reference.rpartition(":")
    if not sep or "/" in tag or not name:
        raise ValueError(f"{reference!r} is not of the form name:tag")
    return name, tag


def familiar_reference(reference: str) -> str:
    """'docker.io/library/x:1' -> 'x:1' (how `docker image inspect` and RepoTags show names)."""
    for prefix in ("docker.io/library/", "docker.io/"):
        if reference.startswith(prefix):
            return reference[len(prefix) :]
    return reference


def full_reference(reference: str) -> str:
    """'x:1' -> 'docker.io/library/x:1' (how containerd annotates names in index.json)."""
    first, slash, _ = reference.partition("/")
    if slash and ("." in first or ":" in first or first == "localhost"):
        return reference
    return ("docker.io/" if slash else "docker.io/library/") + reference


# ---- the filter: shipped to the source node, standard library only ---------------------------------


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
                notes["io.containerd.image.name"] = full_reference(new_tag)
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


def filter_stream(spec: dict, source, sink, counter: StreamCounter) -> None:
    """Copy a `docker save` tar from `source` to `sink` (file objects), leaving out present layers.

    `spec`: layers (diff IDs, bottom first), keep_from (how many bottom layers to leave out),
    new_tag (temporary name:tag for the load), compress ("none" | "gzip").
    """
    layers = list(spec["layers"])
    keep_from = int(spec.get("keep_from", 0))
    skip = set(layers[:keep_from])
    all_layers = set(layers)
    chains = chain_ids(layers)
    v1_depth: dict[str, int | None] = {}
    left_out_paths: set[str] = set()
    compressor = zlib.compressobj(1, zlib.DEFLATED, 31) if spec.get("compress") == "gzip" else None
    chunk_size = 1 << 20

    def read_exact(count: int) -> bytes:
        data = source.read(count)
        while len(data) < count:
            more = source.read(count - len(data))
            if not more:
                raise EOFError(f"the save stream ended early ({counter.read + len(data)} bytes read)")
            data += more
        counter.read += len(data)
        return data

    def write(data: bytes) -> None:
        if compressor is not None:
            data = compressor.compress(data)
        if data:
            sink.write(data)
            counter.written += len(data)

    def discard(count: int) -> None:
        while count:
            count -= len(read_exact(min(count, chunk_size)))

    def copy(count: int) -> None:
        while count:
            data = read_exact(min(count, chunk_size))
            write(data)
            count -= len(data)

    pending: list[bytes] = []
    overrides: dict[str, str] = {}
    while True:
        header = source.read(512)
        if len(header) < 512:
            raise EOFError("the save stream ended without a tar end marker")
        counter.read += 512
        if header == bytes(512):
            write(header + bytes(512))
            break
        name, typ, size, link = tar_header_fields(header)
        if typ in (b"x", b"L", b"K", b"g"):
            size = int(overrides.get("size", size)) if typ == b"x" else size
            data = read_exact((size + 511) // 512 * 512)
            if typ == b"g":
                write(header + data)
                continue
            pending.append(header + data)
            if typ == b"x":
                overrides.update(pax_records(data[:size]))
            elif typ == b"L":
                overrides["path"] = data[:size].split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
            else:
                overrides["linkpath"] = data[:size].split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
            continue
        name = overrides.get("path", name)
        link = overrides.get("linkpath", link)
        size = int(overrides.get("size", size))
        padded = (size + 511) // 512 * 512
        meta, pending, overrides = pending, [], {}
        path = name[2:] if name.startswith("./") else name
        blob = re.fullmatch(r"blobs/sha256/([0-9a-f]{64})", path)
        legacy = re.fullmatch(r"([0-9a-f]{64})/(json|layer\.tar)", path)
        if blob:
            counter.layout = "oci"
        elif legacy and not counter.layout:
            counter.layout = "legacy"
        digest = "sha256:" + blob.group(1) if blob else ""
        leave_out = False
        is_layer = False
        if blob and typ in (b"0", b"\0") and digest in all_layers:
            is_layer, leave_out = True, digest in skip
        elif legacy and legacy.group(2) == "layer.tar":
            if typ in (b"0", b"\0"):
                depth = v1_depth.get(legacy.group(1))
                is_layer = True
                leave_out = depth is not None and depth < keep_from
                if depth is None and keep_from:
                    counter.unmatched += 1
            elif typ in (b"1", b"2"):
                # Newer saves may link the old path to the blob: drop the link with its target.
                target = os.path.normpath(os.path.join(os.path.dirname(path), link))
                leave_out = target in left_out_paths
        if leave_out:
            discard(padded)
            left_out_paths.add(path)
            if is_layer:
                counter.layers_left_out += 1
                counter.bytes_left_out += size
            continue
        if path in ("manifest.json", "index.json", "repositories") and typ in (b"0", b"\0"):
            data = retag_metadata(path, read_exact(padded)[:size], spec["new_tag"])
            mtime = int(header[136:148].split(b"\0", 1)[0].strip() or b"0", 8)
            write(regular_file_header(path, len(data), mtime) + data + bytes(-len(data) % 512))
            continue
        for block in meta:
            write(block)
        write(header)
        if legacy and legacy.group(2) == "json" and typ in (b"0", b"\0"):
            data = read_exact(padded)
            write(data)
            try:
                v1_depth[legacy.group(1)] = legacy_layer_depth(data[:size].decode(), chains)
            except (ValueError, IndexError, UnicodeDecodeError):
                v1_depth[legacy.group(1)] = None
            continue
        if is_layer:
            counter.layers_sent += 1
            counter.layer_bytes += size
        copy(padded)
    # Docker pads archives to a record boundary; pass whatever follows the end marker.
    while True:
        rest = source.read(chunk_size)
        if not rest:
            break
        counter.read += len(rest)
        write(rest)
    if compressor is not None:
        tail = compressor.flush()
        sink.write(tail)
        counter.written += len(tail)
    sink.flush()


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


def export_plan(spec: dict) -> tuple[bytes, list[tuple[int, str, str, int]]]:
    """Check, before any byte is written, that every layer to send can be read from the layer store.

    Returns the image config and (index, tar-split path, unpacked dir, tar size) per layer to send.
    """
    export = spec["export"]
    layers, keep_from = list(spec["layers"]), int(spec.get("keep_from", 0))
    base = os.path.join(export["root"], "image", export["driver"])
    image_hex = export["image_id"].split(":", 1)[1]
    try:
        with open(os.path.join(base, "imagedb", "content", "sha256", image_hex), "rb") as handle:
            config = handle.read()
        if hashlib.sha256(config).hexdigest() != image_hex:
            raise ExportUnavailable("the image config does not match its ID")
        plan = []
        for index, chain in enumerate(chain_ids(layers)):
            if index < keep_from:
                continue
            folder = os.path.join(base, "layerdb", "sha256", chain.split(":", 1)[1])
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
    except OSError as exc:
        raise ExportUnavailable(f"{type(exc).__name__}: {exc}") from exc
    return config, plan


def export_stream(spec: dict, sink, counter: StreamCounter) -> None:
    """Write a docker-load archive holding only the layers to send, read from the layer store."""
    config, plan = export_plan(spec)
    compressor = zlib.compressobj(1, zlib.DEFLATED, 31) if spec.get("compress") == "gzip" else None

    def write(data: bytes) -> None:
        counter.read += len(data)
        if compressor is not None:
            data = compressor.compress(data)
        if data:
            sink.write(data)
            counter.written += len(data)

    def add(name: str, size: int) -> None:
        write(regular_file_header(name, size, 0))

    counter.layout = "export"
    counter.layers_left_out = int(spec.get("keep_from", 0))
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
    if compressor is not None:
        tail = compressor.flush()
        sink.write(tail)
        counter.written += len(tail)
    sink.flush()


def watch_stream(
    counter: StreamCounter,
    stall_s: float,
    deadline_s: float,
    interval_s: float,
    err,
    kill_group: bool = False,
) -> None:
    """Report progress on `err`; end the process when no byte moved for stall_s, or at the deadline.

    With kill_group (the pipeline runs under `set -m`, in its own process group), the whole pipeline
    goes: `docker save` and the ssh to the destination would otherwise wait on a dead link.
    """
    started = last_change = time.monotonic()
    seen = (-1, -1)
    while True:
        time.sleep(interval_s)
        now = time.monotonic()
        current = (counter.read, counter.written)
        if current != seen:
            seen, last_change = current, now
            err.write(f"qwen35-progress in={current[0]} out={current[1]}\n")
            err.flush()
        problem = ""
        if now - last_change > stall_s:
            problem = f"stalled: no data moved for {stall_s:g} s (read {current[0]}, sent {current[1]} bytes)"
        elif now - started > deadline_s:
            problem = f"deadline of {deadline_s:g} s passed (read {current[0]}, sent {current[1]} bytes)"
        if problem:
            err.write(f"qwen35-error {problem}\n")
            err.flush()
            if kill_group:
                os.killpg(os.getpgrp(), signal.SIGTERM)
            os._exit(124)


def filter_main(spec_json: str) -> int:
    """Entry point on the source node: stdin = docker save, stdout = the stream for docker load."""
    spec = json.loads(spec_json)
    counter = StreamCounter()
    watchdog = threading.Thread(
        target=watch_stream,
        args=(
            counter,
            float(spec["stall_s"]),
            float(spec["deadline_s"]),
            float(spec["interval_s"]),
            sys.stderr,
            bool(spec.get("kill_group")),
        ),
        daemon=True,
    )
    watchdog.start()
    try:
        if spec.get("export"):
            export_stream(spec, sys.stdout.buffer, counter)
        else:
            filter_stream(spec, sys.stdin.buffer, sys.stdout.buffer, counter)
    except ExportUnavailable as exc:
        sys.stderr.write(f"qwen35-error export-unavailable: {exc}\n")
        return 3
    except (EOFError, ValueError, OSError) as exc:
        sys.stderr.write(f"qwen35-error {type(exc).__name__}: {exc}\n")
        return 1
    summary = {key: value for key, value in vars(counter).items()}
    sys.stderr.write("qwen35-summary " + json.dumps(summary) + "\n")
    sys.stderr.flush()
    return 0


# The functions the shipped script consists of, in dependency order.
_FILTER_PARTS = (
    chain_ids,
    full_reference,
    split_json_object,
    _json_string_end,
    legacy_layer_depth,
    retag_metadata,
    tar_header_fields,
    pax_records,
    regular_file_header,
    StreamCounter,
    filter_stream,
    ExportUnavailable,
    tar_split_entries,
    layer_tar_size,
    write_layer_tar,
    export_plan,
    export_stream,
    watch_stream,
    filter_main,
)


def filter_script() -> str:
    """The filter as one standalone Python program (standard library only)."""
    parts = [
        "from __future__ import annotations",
        "import base64, gzip, hashlib, json, os, re, signal, sys, threading, time, zlib",
    ]
    parts += [inspect.getsource(part) for part in _FILTER_PARTS]
    parts.append("sys.exit(filter_main(sys.argv[1]))")
    return "\n\n".join(parts) + "\n"


@functools.cache
def _filter_loader() -> str:
    """The packed filter (made once per process: reading the sources and compressing cost ~30 ms)."""
    packed = base64.b64encode(zlib.compress(filter_script().encode(), 9)).decode()
    return f"import base64,zlib;exec(zlib.decompress(base64.b64decode('{packed}')))"


def filter_argv(spec: dict, python: str = "python3") -> list[str]:
    """`python3 -I -S -c <one line> <spec>`: the script travels in the command itself, no file is
    copied. Standard library only, so isolated (-I: no PYTHON* variables, no user site) and without
    site-packages (-S): nothing installed on the node can change it."""
    spec_json = json.dumps(spec, separators=(",", ":"), sort_keys=True)
    return [python, "-I", "-S", "-c", _filter_loader(), spec_json]


def filter_spec(
    layers: Sequence[str],
    keep_from: int,
    new_tag: str,
    stall_s: float,
    deadline_s: float,
    compress: str = "none",
    interval_s: float = 1.0,
    kill_group: bool = True,
    export: dict | None = None,
) -> dict:
    """What the filter needs to know; plain JSON."""
    if compress not in ("none", "gzip"):
        raise ValueError(f"compression {compress!r}: use 'none' or 'gzip'")
    return {
        "layers": list(layers),
        "keep_from": keep_from,
        "new_tag": new_tag,
        "stall_s": stall_s,
        "deadline_s": deadline_s,
        "compress": compress,
        "interval_s": interval_s,
        "kill_group": kill_group,
        "export": export,
    }


def copy_pipeline(
    image: str,
    spec: dict,
    ssh_to_destination: Sequence[str],
    python: str = "python3",
    then: Sequence[str] | None = None,
    first: Sequence[str] | None = None,
) -> list[str]:
    """The argv run on the source: `docker save | filter | ssh dest docker load`, every stage checked.

    Every stage is an argument list joined by `shell_join`; bash's PIPESTATUS is reported on stderr so
    a failure names the stage that failed. `first` runs before any stage (the connection to the
    destination): its status is reported on stderr (`PREFLIGHT`), and when it fails nothing else
    runs, so nothing is sent. `then` starts once every stage succeeded, in the background (its status
    and output ignored): cleanup that would otherwise cost another SSH session, or a wait.
    """
    stages = [["docker", "save", image], filter_argv(spec, python), list(ssh_to_destination)]
    if spec.get("export"):  # the filter reads the layer store itself: no `docker save`
        stages = stages[1:]
    before = ""
    if first:
        before = (
            f'{shell_join(first)} </dev/null || {{ s=$?; echo "{PREFLIGHT} $s" >&2; exit "$s"; }}; '
            f'echo "{PREFLIGHT} 0" >&2; '
        )
    script = (
        before
        # -m: the pipeline gets its own process group, which the filter's watchdog may end whole.
        + "set -m; set -o pipefail; "
        + " | ".join(shell_join(stage) for stage in stages)
        + f'; status=("${{PIPESTATUS[@]}}"); echo "{PIPESTATUS} ${{status[*]}}" >&2;'
        + ' for s in "${status[@]}"; do [ "$s" = 0 ] || exit "$s"; done;'
        # In the background, detached from the session's pipes: the session ends without waiting.
        + (f" {{ {shell_join(then)}; }} </dev/null >/dev/null 2>&1 &" if then else "")
        + " exit 0"
    )
    return bash_argv(script)


def parse_filter_stderr(text: str) -> dict:
    """The filter's and the pipeline's reports from stderr: summary, error, pipestatus, other lines."""
    report: dict = {
        "summary": None,
        "error": "",
        "pipestatus": [],
        "progress": None,
        "loaded": "",
        "promoted": False,
        "preflight": None,  # the first step's exit status, None when there was none
        "other": [],
    }
    for line in text.splitlines():
        if line.startswith(SUMMARY + " "):
            report["summary"] = json.loads(line[len(SUMMARY) + 1 :])
        elif line.startswith(FAILURE + " "):
            report["error"] = line[len(FAILURE) + 1 :]
        elif line.startswith(PIPESTATUS + " "):
            report["pipestatus"] = [int(s) for s in line.split()[1:] if s.isdigit()]
        elif line.startswith(PROGRESS + " "):
            report["progress"] = dict(kv.split("=", 1) for kv in line.split()[1:])
        elif line.startswith(LOADED + " "):
            report["loaded"] = line[len(LOADED) + 1 :]
        elif line == PROMOTED:
            report["promoted"] = True
        elif line.startswith(PREFLIGHT + " ") and line.split()[1:2] and line.split()[1].isdigit():
            report["preflight"] = int(line.split()[1])
        elif line.strip():
            report["other"].append(line)
    return report


STAGES = ("docker save (source)", "save filter (source)", "ssh + docker load (destination)")
EXPORT_STAGES = ("layer export (source)", "ssh + docker load (destination)")


def failed_stage(pipestatus: Sequence[int], export: bool = False) -> str:
    """The exit status of every pipeline stage when one failed, for the error message."""
    if not any(pipestatus):
        return ""
    stages = EXPORT_STAGES if export else STAGES
    return ", ".join(f"{stage} exited {status}" for stage, status in zip(stages, pipestatus, strict=False))
