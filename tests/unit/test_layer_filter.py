"""The layer filter (`node_programs/layer_filter.py`) and its store export (`layer_export.py`), on
synthetic `docker save` streams of both layouts and a synthetic classic layer store."""

from __future__ import annotations

import base64
import gzip
import hashlib
import io
import json
import subprocess
import sys
import tarfile

import pytest

from components.node_image.programs import filter_argv, filter_spec
from components.node_programs import layer_filter as t
from components.node_programs.wire import REPORT_MARKER as REPORT
from components.node_programs.wire import chain_ids


def digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def layer_tar(content: bytes) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        info = tarfile.TarInfo("file")
        info.size = len(content)
        tar.addfile(info, io.BytesIO(content))
    return buffer.getvalue()


LAYERS = [layer_tar(bytes([i]) * (20_000 * (i + 1))) for i in range(3)]
DIFF_IDS = [digest(layer) for layer in LAYERS]


def make_tar(entries: list[tuple[str, bytes]]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in entries:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def v1_json(index: int, parent: str | None) -> tuple[str, bytes]:
    """A v1 `json` and its folder ID the way Docker < 25 computes them."""
    fields = {"created": '"1970-01-01T00:00:00Z"', "container_config": '{"Env":null}'}
    hashed = dict(fields, layer_id=json.dumps(chain_ids(DIFF_IDS)[index]))
    if parent:
        hashed["parent"] = json.dumps("sha256:" + parent)
    text = "{" + ",".join(f'"{k}":{hashed[k]}' for k in sorted(hashed)) + "}"
    own = hashlib.sha256(text.encode()).hexdigest()
    stored = {"id": json.dumps(own), **({"parent": json.dumps(parent)} if parent else {}), **fields}
    stored["os"] = '"linux"'
    return own, ("{" + ",".join(f'"{k}":{v}' for k, v in stored.items()) + "}").encode()


def legacy_save() -> bytes:
    entries, parent, paths = [], None, []
    folders = []
    for index, layer in enumerate(LAYERS):
        own, data = v1_json(index, parent)
        folders.append((own, data, layer))
        paths.append(f"{own}/layer.tar")
        parent = own
    for own, data, layer in sorted(folders):  # Docker writes folders in name order, not layer order
        entries += [(f"{own}/VERSION", b"1.0"), (f"{own}/json", data), (f"{own}/layer.tar", layer)]
    manifest = [{"Config": "c.json", "RepoTags": ["app:1"], "Layers": paths}]
    entries += [("manifest.json", json.dumps(manifest).encode()), ("repositories", b'{"app":{"1":"x"}}')]
    return make_tar(entries)


def oci_save() -> bytes:
    entries = [(f"blobs/sha256/{d.split(':')[1]}", layer) for d, layer in zip(DIFF_IDS, LAYERS, strict=True)]
    index = {"manifests": [{"annotations": {"io.containerd.image.name": "docker.io/library/app:1",
                                              "org.opencontainers.image.ref.name": "1"}}]}  # fmt: skip
    manifest = [{"Config": "blobs/sha256/c", "RepoTags": ["app:1"], "Layers": []}]
    entries += [("index.json", json.dumps(index).encode()), ("manifest.json", json.dumps(manifest).encode())]
    entries += [("oci-layout", b'{"imageLayoutVersion":"1.0.0"}')]
    return make_tar(entries)


def run_filter(
    stream: bytes, keep_from: int, compress: str = "none"
) -> tuple[dict[str, bytes], t.StreamCounter]:
    spec = filter_spec(DIFF_IDS, keep_from, "app:qwen35-tmp-1", compress)
    out, counter = io.BytesIO(), t.StreamCounter()
    t.filter_stream(spec, io.BytesIO(stream), out, counter)
    data = out.getvalue()
    mode = "r:gz" if compress == "gzip" else "r:"
    with tarfile.open(fileobj=io.BytesIO(data), mode=mode) as tar:
        files = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}
    return files, counter


@pytest.mark.parametrize("keep_from", [0, 1, 2, 3])
def test_oci_layout_leaves_out_the_bottom_layers(keep_from):
    files, counter = run_filter(oci_save(), keep_from)
    blobs = {name for name in files if name.startswith("blobs/")}
    assert blobs == {f"blobs/sha256/{d.split(':')[1]}" for d in DIFF_IDS[keep_from:]}
    assert counter.layout == "oci" and counter.layers_left_out == keep_from
    assert counter.layer_bytes == sum(len(layer) for layer in LAYERS[keep_from:])
    assert json.loads(files["manifest.json"])[0]["RepoTags"] == ["app:qwen35-tmp-1"]
    notes = json.loads(files["index.json"])["manifests"][0]["annotations"]
    assert notes == {"io.containerd.image.name": "docker.io/library/app:qwen35-tmp-1",
                     "org.opencontainers.image.ref.name": "qwen35-tmp-1"}  # fmt: skip


@pytest.mark.parametrize("keep_from", [0, 2, 3])
def test_legacy_layout_matches_folders_to_layers_by_v1_id(keep_from):
    files, counter = run_filter(legacy_save(), keep_from)
    sent = {files[name] for name in files if name.endswith("/layer.tar")}
    assert sent == set(LAYERS[keep_from:])
    assert counter.layout == "legacy" and counter.unmatched == 0
    assert json.loads(files["repositories"]) == {"app": {"qwen35-tmp-1": "x"}}


def test_legacy_depth_is_only_trusted_when_the_hash_matches():
    own, data = v1_json(1, "ab" * 32)
    assert t.legacy_layer_depth(data.decode(), chain_ids(DIFF_IDS)) == 1
    tampered = data.decode().replace(own, "0" * 64)
    assert t.legacy_layer_depth(tampered, chain_ids(DIFF_IDS)) is None
    assert t.legacy_layer_depth(data.decode(), chain_ids(DIFF_IDS[::-1])) is None


def test_split_json_object_keeps_raw_values():
    raw = t.split_json_object('{"a":{"b":[1,"x,}"]},"c":"q\\"}","d":null}')
    assert raw == {"a": '{"b":[1,"x,}"]}', "c": '"q\\"}"', "d": "null"}


def test_gzip_output_is_a_valid_stream():
    files, counter = run_filter(oci_save(), 1, compress="gzip")
    assert len(files) > 2 and counter.written < counter.read


def test_truncated_stream_fails():
    with pytest.raises(EOFError):
        run_filter(oci_save()[:30_000], 0)


def test_shipped_script_runs_standalone_with_the_standard_library():
    argv = filter_argv(filter_spec(DIFF_IDS, 2, "app:qwen35-tmp-1"))
    assert argv[:4] == ["python3", "-I", "-S", "-c"] and "\n" not in argv[4]
    done = subprocess.run([sys.executable, *argv[1:]], input=oci_save(), capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr
    reports = [line for line in done.stderr.decode().splitlines() if line.startswith(REPORT + " ")]
    summary = json.loads(reports[-1].split(" ", 1)[1])
    assert summary["layers_left_out"] == 2 and summary["written"] == len(done.stdout)


def fake_layer_store(tmp_path) -> tuple[str, str]:
    """A classic overlay2 layer store holding LAYERS: tar-split records plus unpacked files."""
    import gzip

    root = tmp_path / "docker"
    config = json.dumps({"rootfs": {"type": "layers", "diff_ids": DIFF_IDS}}).encode()
    image_hex = hashlib.sha256(config).hexdigest()
    content = root / "image" / "overlay2" / "imagedb" / "content" / "sha256"
    content.mkdir(parents=True)
    (content / image_hex).write_bytes(config)
    for index, (layer, chain) in enumerate(zip(LAYERS, chain_ids(DIFF_IDS), strict=True)):
        folder = root / "image" / "overlay2" / "layerdb" / "sha256" / chain.split(":")[1]
        folder.mkdir(parents=True)
        (folder / "diff").write_text(DIFF_IDS[index])
        (folder / "cache-id").write_text(f"cache{index}")
        unpacked = root / "overlay2" / f"cache{index}" / "diff"
        unpacked.mkdir(parents=True)
        entries, position = [], 0
        with tarfile.open(fileobj=io.BytesIO(layer)) as tar:
            for member in tar.getmembers():
                if member.isfile() and member.size:
                    segment = layer[position : member.offset_data]
                    entries.append({"type": 2, "payload": base64.b64encode(segment).decode()})
                    entries.append({"type": 1, "name": member.name, "size": member.size})
                    (unpacked / member.name).write_bytes(tar.extractfile(member).read())
                    position = member.offset_data + member.size
        entries.append({"type": 2, "payload": base64.b64encode(layer[position:]).decode()})
        with gzip.open(folder / "tar-split.json.gz", "wt") as split:
            split.write("\n".join(json.dumps(entry) for entry in entries) + "\n")
    return str(root), "sha256:" + image_hex


def test_layer_store_export_rebuilds_exact_layers(tmp_path):
    root, image_id = fake_layer_store(tmp_path)
    export = {"root": root, "driver": "overlay2", "image_id": image_id}
    spec = filter_spec(DIFF_IDS, 1, "app:qwen35-tmp-1", export=export)
    out, counter = io.BytesIO(), t.StreamCounter()
    t.export_stream(spec, out, counter)
    with tarfile.open(fileobj=io.BytesIO(out.getvalue())) as tar:
        files = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}
    manifest = json.loads(files["manifest.json"])[0]
    assert manifest["RepoTags"] == ["app:qwen35-tmp-1"] and len(manifest["Layers"]) == 3
    sent = [files[path] for path in manifest["Layers"] if path in files]
    assert [digest(layer) for layer in sent] == DIFF_IDS[1:]  # same bytes, same diff IDs
    assert digest(files[manifest["Config"]]) == image_id
    assert counter.layers_sent == 2 and counter.layers_left_out == 1 and counter.layout == "export"


def test_layer_store_export_refuses_before_writing_anything(tmp_path):
    root, image_id = fake_layer_store(tmp_path)
    export = {"root": root, "driver": "overlay2", "image_id": image_id}
    spec = filter_spec(DIFF_IDS, 0, "app:qwen35-tmp-1", export=export)
    (tmp_path / "docker" / "overlay2" / "cache2" / "diff" / "file").unlink()
    (tmp_path / "docker" / "overlay2" / "cache2" / "diff").rmdir()
    out = io.BytesIO()
    with pytest.raises(t.ExportUnavailable, match="layer 2"):
        t.export_stream(spec, out, t.StreamCounter())
    assert out.getvalue() == b""


def test_layer_store_export_as_an_oci_layout_names_every_blob_by_digest(tmp_path):
    """For a containerd destination: blobs by digest (a layer's is its diff ID), a manifest listing
    every layer with its size, the layers left out absent (the content store has them)."""
    root, image_id = fake_layer_store(tmp_path)
    export = {"root": root, "driver": "overlay2", "image_id": image_id, "layout": "oci"}
    spec = filter_spec(DIFF_IDS, 0, "app:qwen35-tmp-1", export=export, leave_out=[DIFF_IDS[0], DIFF_IDS[2]])
    out, counter = io.BytesIO(), t.StreamCounter()
    t.export_stream(spec, out, counter)
    with tarfile.open(fileobj=io.BytesIO(out.getvalue())) as tar:
        files = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}
    for name, data in files.items():  # every blob's name is its digest
        if name.startswith("blobs/sha256/"):
            assert digest(data) == "sha256:" + name.rsplit("/", 1)[1]
    index = json.loads(files["index.json"])
    (entry,) = index["manifests"]
    assert entry["annotations"]["io.containerd.image.name"] == "docker.io/library/app:qwen35-tmp-1"
    manifest = json.loads(files["blobs/sha256/" + entry["digest"].split(":")[1]])
    assert manifest["config"]["digest"] == image_id
    assert [(layer["digest"], layer["size"]) for layer in manifest["layers"]] == [
        (d, len(layer)) for d, layer in zip(DIFF_IDS, LAYERS, strict=True)
    ]
    sent = [
        name
        for name in files
        if name.startswith("blobs/") and name.split("/")[-1] in {d[7:] for d in DIFF_IDS}
    ]
    assert sent == ["blobs/sha256/" + DIFF_IDS[1][7:]]  # only the layer not left out
    assert counter.layers_sent == 1 and counter.layers_left_out == 2 and counter.layout == "export-oci"
    assert json.loads(files["manifest.json"])[0]["RepoTags"] == ["app:qwen35-tmp-1"]


@pytest.mark.parametrize("layout", ["docker", "oci"])
def test_layer_store_export_compressed_is_the_same_archive(tmp_path, layout):
    root, image_id = fake_layer_store(tmp_path)
    export = {"root": root, "driver": "overlay2", "image_id": image_id, "layout": layout}
    archives = []
    for compression in ("none", "gzip"):
        spec = filter_spec(DIFF_IDS, 1, "app:qwen35-tmp-1", compression, export=export)
        out, counter = io.BytesIO(), t.StreamCounter()
        t.export_stream(spec, out, counter)
        assert counter.written == len(out.getvalue()) and counter.layers_sent == 2
        archives.append((out.getvalue(), counter.read))
    (plain, plain_read), (packed, packed_read) = archives
    assert gzip.decompress(packed) == plain and packed_read == plain_read == len(plain)
