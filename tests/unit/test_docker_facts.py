"""`node_programs/docker_facts.py`: a node's facts in one program, from the Engine API, the CLI or a
classic store's files, and their report parsed (`node_image/facts.py`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from components.node_image import Daemon, ImageInfo, Node
from tests.support.standin_engine import StandinEngine

L1, L2 = "sha256:" + "1" * 64, "sha256:" + "2" * 64
# The destination whose facts are parsed (its access details are not used).
NODE_B = {"name": "b", "host": "h2", "port": 22, "user": "ops", "identity_file": "/k", "known_hosts": "/kh"}


FACTS_DOCKER = """#!{python}
import json, os, sys
args = sys.argv[1:]
if os.environ.get("FAKE_DOCKER_LOG"):
    with open(os.environ["FAKE_DOCKER_LOG"], "a") as log:
        log.write(json.dumps(args[:2]) + "\\n")
if args[0] == "info":
    status = '[["driver-type","io.containerd.snapshotter.v1"]]'
    print(status + '\\t' + os.environ["FAKE_ROOT"] + '\\t29.0.0\\toverlayfs')
elif args[:2] == ["image", "inspect"] and args[-1] == "app:1":
    print('"sha256:ab"\\t["{l1}","{l2}"]\\t123')
elif args[:2] == ["image", "inspect"]:
    print("\\n".join('"' + ref + '"\\t["{l1}"]\\t5' for ref in args[4:]))
elif args[0] == "history":
    print("0\\n100\\n23")
elif args[:2] == ["image", "ls"] and os.environ.get("FAKE_LS_FAILS"):
    sys.stderr.write("permission denied\\n")
    sys.exit(1)
elif args[:2] == ["image", "ls"]:
    print("sha256:b\\nsha256:a\\nsha256:b")
else:
    sys.exit(1)
"""


@pytest.mark.parametrize("engine", ["cli", "api", "api failing midway"])
def test_facts_of_a_node_in_one_program(tmp_path, monkeypatch, engine):
    """The same facts whether the Engine API answers (where DOCKER_HOST is a plain unix socket) or
    the CLI does; an API that fails midway leaves every answer to the CLI and says why."""
    import subprocess
    import sys

    from components.node_image.facts import parse_facts
    from components.node_image.programs import facts_argv

    docker = tmp_path / "bin" / "docker"
    docker.parent.mkdir()
    docker.write_text(FACTS_DOCKER.format(python=sys.executable, l1=L1, l2=L2))
    docker.chmod(0o755)
    root = tmp_path / "docker-root"
    blobs = root / "containerd" / "daemon" / "io.containerd.content.v1.content" / "blobs" / "sha256"
    blobs.mkdir(parents=True)
    (blobs / L1.split(":")[1]).write_bytes(b"")
    log = tmp_path / "calls"
    monkeypatch.setenv("PATH", f"{docker.parent}:/usr/bin:/bin")
    monkeypatch.setenv("FAKE_ROOT", str(root))
    monkeypatch.setenv("FAKE_DOCKER_LOG", str(log))
    api = None
    if engine != "cli":
        api = StandinEngine(
            tmp_path, "app:1", {"Id": "sha256:ab", "RootFS": {"Layers": [L1, L2]}, "Size": 123}
        )
        status = [["driver-type", "io.containerd.snapshotter.v1"]]
        api.info = {
            "DriverStatus": status,
            "DockerRootDir": str(root),
            "ServerVersion": "29.0.0",
            "Driver": "overlayfs",
        }
        api.histories["app:1"] = [{"Size": 0}, {"Size": 100}, {"Size": 23}]
        api.listed = {  # what the fake CLI lists and inspects too
            "sha256:a": {"Id": "sha256:a", "RootFS": {"Layers": [L1]}, "Size": 100},
            "sha256:b": {"Id": "sha256:b", "RootFS": {"Layers": [L1, L2]}, "Size": 123},
        }
        if engine == "api failing midway":
            api.broken.add("/images/app:1/history")
        monkeypatch.setenv("DOCKER_HOST", f"unix://{api.path}")
    argv = facts_argv("app:1", history=True, inventory=True)
    argv[0] = sys.executable
    try:
        done = subprocess.run(argv, capture_output=True, timeout=60)
    finally:
        if api is not None:
            api.close()
    assert done.returncode == 0, done.stderr
    facts = parse_facts(Node.from_dict("d", NODE_B), "app:1", done.stdout.decode(), True, True, True)
    assert facts.daemon == Daemon("containerd", str(root), "29.0.0", "overlayfs")
    assert facts.image == ImageInfo("sha256:ab", (L1, L2), 123) and facts.history.split() == [
        "0",
        "100",
        "23",
    ]
    assert [i.image_id for i in facts.images] == ["sha256:a", "sha256:b"]  # each image once
    assert facts.blobs == frozenset({L1}) and facts.free > 0 and facts.python.endswith("python3")
    report = json.loads(done.stdout.decode().splitlines()[-1])
    calls = {tuple(json.loads(line)) for line in log.read_text().splitlines()} if log.exists() else set()
    inventory = {("image", "ls"), ("image", "inspect")}  # a containerd store's: asked of the daemon
    if engine == "api":
        # No `docker` process at all: the inventory too is the API's (its list, then each image).
        assert report["facts_from"] == "engine api" and report["inventory_from"] == "engine api"
        assert calls == set(), calls
        assert api.requests == [
            "GET /info",
            "GET /images/app:1/json",
            "GET /images/app:1/history",
            "GET /images/json?all=1",
            "GET /images/sha256:a/json",
            "GET /images/sha256:b/json",
        ]
    else:
        asked = inventory | {("info", "--format"), ("history", "--no-trunc")}
        assert report["facts_from"] == "docker" and calls == asked, calls
        assert ("status 500" in report["api_error"]) if api else ("api_error" in report)  # (no socket)


def test_an_inventory_that_fails_after_the_api_answered_is_not_asked_again(tmp_path, monkeypatch):
    """Only the API's own requests fall back to the CLI: an inventory the daemon refuses is the
    report's failure, said once (not every fact asked again of the CLI)."""
    import subprocess
    import sys

    from components.node_image.programs import facts_argv

    docker = tmp_path / "bin" / "docker"
    docker.parent.mkdir()
    docker.write_text(FACTS_DOCKER.format(python=sys.executable, l1=L1, l2=L2))
    docker.chmod(0o755)
    log = tmp_path / "calls"
    for name, value in (("PATH", f"{docker.parent}:/usr/bin:/bin"), ("FAKE_DOCKER_LOG", str(log))):
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("FAKE_LS_FAILS", "1")
    api = StandinEngine(tmp_path, "app:1", {"Id": "sha256:ab", "RootFS": {"Layers": [L1]}, "Size": 1})
    status = [["driver-type", "io.containerd.snapshotter.v1"]]
    api.info = {"DriverStatus": status, "DockerRootDir": str(tmp_path), "ServerVersion": "29", "Driver": "x"}
    api.broken.add("/images/json?all=1")  # the API's inventory fails: the CLI's is tried, once
    monkeypatch.setenv("DOCKER_HOST", f"unix://{api.path}")
    argv = facts_argv("app:1", inventory=True)
    argv[0] = sys.executable
    try:
        done = subprocess.run(argv, capture_output=True, timeout=60)
    finally:
        api.close()
    report = json.loads(done.stdout.decode().splitlines()[-1])
    assert done.returncode == 4 and report["facts_from"] == "engine api"
    assert report["api_error"].startswith("inventory: EngineError: GET /images/json: status 500")
    assert "permission denied" in report["stderr"]
    assert [json.loads(line) for line in log.read_text().splitlines()] == [["image", "ls"]]


CLASSIC_DOCKER = """#!{python}
import os, sys
args = sys.argv[1:]
if args[0] == "info":
    print('[["Backing Filesystem","extfs"]]\\t' + os.environ["FAKE_ROOT"] + '\\t26.1.5\\toverlay2')
elif args[:2] == ["image", "inspect"] and args[-1] == "app:1":
    print('"sha256:ab"\\t["{l1}"]\\t3')
elif args[:2] == ["image", "ls"] and os.environ.get("FAKE_LS"):
    print("sha256:" + "f" * 64)
elif args[:2] == ["image", "inspect"] and os.environ.get("FAKE_LS"):
    print('"sha256:' + "f" * 64 + '"\\t["{l1}"]\\t9')
else:
    sys.exit(1)  # asked of the daemon: the store's files were meant to answer
"""


def classic_store(root: Path, images: dict[str, list[str]], sizes: dict[str, int]) -> None:
    """A classic overlay2 store's files: image configs by ID, layer sizes by chain ID."""
    from components.node_programs.wire import chain_ids

    configs = root / "image" / "overlay2" / "imagedb" / "content" / "sha256"
    layers = root / "image" / "overlay2" / "layerdb" / "sha256"
    configs.mkdir(parents=True)
    layers.mkdir(parents=True)
    for hex_id, diff_ids in images.items():
        (configs / hex_id).write_text(json.dumps({"rootfs": {"type": "layers", "diff_ids": diff_ids}}))
        for diff_id, chain in zip(diff_ids, chain_ids(diff_ids), strict=True):
            (layers / chain.removeprefix("sha256:")).mkdir(exist_ok=True)
            (layers / chain.removeprefix("sha256:") / "size").write_text(str(sizes[diff_id]))


def classic_facts(tmp_path, monkeypatch, root: Path) -> dict:
    import subprocess
    import sys

    from components.node_image.programs import facts_argv

    docker = tmp_path / "bin" / "docker"
    docker.parent.mkdir(exist_ok=True)
    docker.write_text(CLASSIC_DOCKER.format(python=sys.executable, l1=L1))
    docker.chmod(0o755)
    monkeypatch.setenv("PATH", f"{docker.parent}:/usr/bin:/bin")
    monkeypatch.setenv("FAKE_ROOT", str(root))
    argv = facts_argv("app:1", inventory=True)
    argv[0] = sys.executable
    done = subprocess.run(argv, capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.decode().splitlines()[-1])


def test_a_classic_stores_inventory_is_read_from_its_files(tmp_path, monkeypatch):
    from components.node_image.facts import parse_images

    root = tmp_path / "docker-root"
    a, b, empty = "a" * 64, "b" * 64, "e" * 64
    classic_store(root, {a: [L1], b: [L1, L2], empty: []}, {L1: 100, L2: 23})
    report = classic_facts(tmp_path, monkeypatch, root)
    assert report["inventory_from"] == "store files"
    assert parse_images(report["images"]) == [  # sizes as the daemon reports them: its layers' sum
        ImageInfo(f"sha256:{a}", (L1,), 100),
        ImageInfo(f"sha256:{b}", (L1, L2), 123),
        ImageInfo(f"sha256:{empty}", (), 0),
    ]


def test_an_image_whose_layer_went_meanwhile_and_a_config_being_written_are_left_out(tmp_path, monkeypatch):
    from components.node_image.facts import parse_images
    from components.node_programs.wire import chain_ids

    root = tmp_path / "docker-root"
    a, b = "a" * 64, "b" * 64
    classic_store(root, {a: [L1], b: [L1, L2]}, {L1: 100, L2: 23})
    configs = root / "image" / "overlay2" / "imagedb" / "content" / "sha256"
    (configs / ".tmp-config123").write_text('{"rootfs": {"diff_ids": []}}')  # being written by Docker
    top = chain_ids([L1, L2])[1].removeprefix("sha256:")
    (root / "image" / "overlay2" / "layerdb" / "sha256" / top / "size").unlink()  # deleted while read
    report = classic_facts(tmp_path, monkeypatch, root)
    assert [i.image_id for i in parse_images(report["images"])] == [f"sha256:{a}"]


@pytest.mark.parametrize("damage", ["no store", "unreadable config"])
def test_a_store_whose_files_cannot_be_read_is_asked_of_the_daemon(tmp_path, monkeypatch, damage):
    from components.node_image.facts import parse_images

    root = tmp_path / "docker-root"
    if damage == "unreadable config":
        classic_store(root, {"a" * 64: [L1]}, {L1: 100})
        (root / "image" / "overlay2" / "imagedb" / "content" / "sha256" / ("a" * 64)).write_text("{not json")
    else:
        root.mkdir()
    monkeypatch.setenv("FAKE_LS", "1")
    report = classic_facts(tmp_path, monkeypatch, root)
    assert report["inventory_from"] == "docker"
    assert parse_images(report["images"]) == [ImageInfo("sha256:" + "f" * 64, (L1,), 9)]


def test_an_unreadable_content_store_is_reported_not_silently_sent_in_full(tmp_path, monkeypatch):
    import subprocess
    import sys

    from components.node_image.facts import parse_facts
    from components.node_image.programs import facts_argv

    docker = tmp_path / "bin" / "docker"
    docker.parent.mkdir()
    docker.write_text(FACTS_DOCKER.format(python=sys.executable, l1=L1, l2=L2))
    docker.chmod(0o755)
    root = tmp_path / "docker-root"
    content = root / "containerd" / "daemon" / "io.containerd.content.v1.content" / "blobs"
    content.mkdir(parents=True)
    (content / "sha256").write_bytes(b"")  # cannot be listed (as for a user without read access)
    monkeypatch.setenv("PATH", f"{docker.parent}:/usr/bin:/bin")
    monkeypatch.setenv("FAKE_ROOT", str(root))
    argv = facts_argv("app:1", history=False, inventory=True)
    argv[0] = sys.executable
    done = subprocess.run(argv, capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.decode().splitlines()[-1])["blobs_listed"] is False
    facts = parse_facts(Node.from_dict("d", NODE_B), "app:1", done.stdout.decode(), False, True, True)
    assert facts.blobs == frozenset() and str(content / "sha256") in facts.blobs_unlisted[0]


def _content_store(root, layout: str) -> None:
    content = root / "containerd" / "daemon" / "io.containerd.content.v1.content"
    if layout in ("fresh", "held"):
        (content / "ingest").mkdir(parents=True)  # what a fresh dockerd's containerd makes first
    if layout == "held":
        (content / "blobs" / "sha256").mkdir(parents=True)
        (content / "blobs" / "sha256" / ("a" * 64)).write_bytes(b"layer")


# (layout under the docker root, blobs listed, listed at all): an empty store is listed, and empty.
CONTENT_STORES = [
    ("held", ["a" * 64], True),
    ("fresh", [], True),  # a fresh node: the content store is there, no blob yet
    ("absent", [], False),  # no content store where dockerd's containerd keeps it: cannot be read
]


@pytest.mark.parametrize(("layout", "blobs", "listed"), CONTENT_STORES, ids=[c[0] for c in CONTENT_STORES])
def test_content_blobs_tells_an_empty_store_from_an_unreadable_one(
    tmp_path, monkeypatch, layout, blobs, listed
):
    from components.node_programs import docker_facts

    monkeypatch.setattr(docker_facts, "SYSTEM_CONTAINERD_ROOT", str(tmp_path / "no-system-containerd"))
    _content_store(tmp_path, layout)
    found, why = docker_facts.content_blobs(str(tmp_path))
    assert found == blobs and (not why) == listed, why


def test_content_blobs_names_a_store_it_may_not_read(tmp_path, monkeypatch):
    from components.node_programs import docker_facts

    monkeypatch.setattr(docker_facts, "SYSTEM_CONTAINERD_ROOT", str(tmp_path / "no-system-containerd"))
    _content_store(tmp_path, "held")
    real = docker_facts.os.listdir

    def refused(path):
        if "io.containerd.content.v1.content" in str(path):
            raise PermissionError(13, "Permission denied")
        return real(path)

    monkeypatch.setattr(docker_facts.os, "listdir", refused)
    found, why = docker_facts.content_blobs(str(tmp_path))
    assert found == [] and why and "Permission denied" in why[0], why
