"""Checkpoint against the real lab: node-a (head) fetches from the stand-in Hub with the real
`huggingface_hub` client over SSH, then node-a streams to node-b over SSH, verified while received.

Provider methods are called directly. Each node has its own HF cache dir (under the lab's data dir);
every test starts from empty caches on both nodes.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

import lab
from components.checkpoint import CheckpointError, CheckpointProvider
from components.node_programs import hf_checkpoint
from lab.layout import data_dir
from lab.standin_hub import StandinHub
from tests.support.hub_fixture import hub_fixture
from tests.support.lab_nodes import node_dict

PROVIDER = CheckpointProvider()
REPO = "lab/tiny-qwen35"
REPO_DIR = "models--lab--tiny-qwen35"
TOKEN = "hf_lab_token_for_tests_789"
SHARD = 24 << 20


def cache_dir(node: lab.LabNode) -> Path:
    return data_dir() / "hf-cache" / node.name


hub = hub_fixture(REPO, shards=3, shard_bytes=SHARD)


@pytest.fixture
def caches(node_a, node_b):
    for node in (node_a, node_b):
        shutil.rmtree(cache_dir(node), ignore_errors=True)
        cache_dir(node).mkdir(parents=True)
    yield
    for node in (node_a, node_b):
        shutil.rmtree(cache_dir(node), ignore_errors=True)


def head_props(node: lab.LabNode, hub: StandinHub | None, **overrides) -> dict:
    return {
        "node": node_dict(node),
        "repo": REPO,
        "requested_revision": "main",
        "cache_dir": str(cache_dir(node)),
        "source": None,
        "source_mode": "hub",
        "refresh": "sizes",
        "keep": True,
        "reserve": 0,
        # The head's Python with huggingface_hub (this machine's venv: lab nodes share its filesystem).
        "fetch": {
            "python": sys.executable,
            "endpoint": hub.endpoint if hub else None,
            "progress": str(cache_dir(node) / "progress.json"),
        },
        "tuning": {},
        "hf_token": None,
        **overrides,
    }


def worker_props(node: lab.LabNode, source: lab.LabNode, head_outs: dict, **overrides) -> dict:
    return {
        **head_props(node, None),
        "source": node_dict(source),
        "source_cache_dir": str(cache_dir(source)),
        "source_revision": head_outs["revision"],
        "source_manifest": head_outs["manifest"],
        "source_refs": head_outs["refs"],
        "manifest_digest": head_outs["digest"],
        "fetch": {},
        **overrides,
    }


def blob_path(node: lab.LabNode, outs: dict, suffix: str) -> Path:
    blob = next(b for p, b, _s in outs["manifest"] if p.endswith(suffix))
    return cache_dir(node) / "hub" / REPO_DIR / "blobs" / blob


def test_fetch_on_the_head_then_copy_verified_to_the_worker(hub, caches, node_a, node_b):
    head = PROVIDER.create(head_props(node_a, hub)).outs
    assert head["revision"] == hub.repos[REPO].sha and head["files"] == 8
    assert head["snapshot_path"] == f"{cache_dir(node_a)}/hub/{REPO_DIR}/snapshots/{head['revision']}"
    worker = PROVIDER.create(worker_props(node_b, node_a, head)).outs
    assert worker["digest"] == head["digest"] and worker["revision"] == head["revision"]
    assert head["bytes"] <= worker["bytes_sent"] <= head["bytes"] * 1.01 and worker["files_sent"] == 8
    snapshot = Path(worker["snapshot_path"])
    assert (snapshot / "config.json").read_text() == (Path(head["snapshot_path"]) / "config.json").read_text()
    assert os.readlink(snapshot / "model-00001-of-00003.safetensors").startswith("../../blobs/")
    assert (cache_dir(node_b) / "hub" / REPO_DIR / "refs" / "main").read_text() == head["revision"]
    # Unchanged: nothing sent, and refresh sees nothing wrong.
    again = PROVIDER.create(worker_props(node_b, node_a, head)).outs
    assert again["bytes_sent"] == 0
    assert PROVIDER.read("x", again).outs["problems"] == {}
    assert not PROVIDER.diff("x", again, worker_props(node_b, node_a, head)).changes


def test_a_flipped_byte_shows_at_a_full_refresh_and_only_that_shard_is_sent(hub, caches, node_a, node_b):
    head = PROVIDER.create(head_props(node_a, hub)).outs
    worker = PROVIDER.create(worker_props(node_b, node_a, head, refresh="full")).outs
    shard = blob_path(node_b, worker, "00002-of-00003.safetensors")
    with open(shard, "r+b") as handle:
        handle.seek(12345)
        byte = handle.read(1)
        handle.seek(12345)
        handle.write(bytes([byte[0] ^ 0xFF]))
    refreshed = PROVIDER.read("x", worker).outs
    assert refreshed["problems"] == {"model-00002-of-00003.safetensors": "damaged"}
    news = worker_props(node_b, node_a, head, refresh="full")
    diff = PROVIDER.diff("x", refreshed, news)
    assert diff.changes and not diff.replaces
    repaired = PROVIDER.update("x", refreshed, news).outs
    assert repaired["files_sent"] == 1 and SHARD <= repaired["bytes_sent"] <= SHARD * 1.01
    assert PROVIDER.read("x", repaired).outs["problems"] == {}


def test_a_truncated_shard_shows_at_a_sizes_refresh(hub, caches, node_a, node_b):
    head = PROVIDER.create(head_props(node_a, hub)).outs
    worker = PROVIDER.create(worker_props(node_b, node_a, head)).outs
    os.truncate(blob_path(node_b, worker, "00003-of-00003.safetensors"), 1000)
    refreshed = PROVIDER.read("x", worker).outs
    assert refreshed["problems"] == {"model-00003-of-00003.safetensors": "truncated"}
    repaired = PROVIDER.update("x", refreshed, worker_props(node_b, node_a, head)).outs
    assert repaired["files_sent"] == 1 and SHARD <= repaired["bytes_sent"] <= SHARD * 1.01


def test_disk_preflight_refuses_before_any_byte(hub, caches, node_a, node_b):
    head = PROVIDER.create(head_props(node_a, hub)).outs
    with pytest.raises(CheckpointError) as failure:
        PROVIDER.create(worker_props(node_b, node_a, head, reserve=1 << 60))
    message = str(failure.value)
    assert "node-b" in message and "not enough disk in" in message and "GiB free" in message
    assert "nothing was sent" in message
    assert not (cache_dir(node_b) / "hub" / REPO_DIR / "blobs").exists()


# The source's SSH connection to the destination: a master in the peer's private folder, either
# backgrounded by ControlPersist (OpenSSH renames it `ssh: <control path> [mux]`) or started as
# `ssh -o ControlMaster=yes … -f -N` (a retry's two-step connection).
PEER_MASTER = re.compile(
    rb"^ssh: /tmp/qni-[0-9a-f]+/m \[mux\]|^ssh\0.*\0ControlMaster=yes\0.*\0ControlPath=/tmp/qni-[0-9a-f]+/m\0"
)


def _kill_link_when_partial(node: lab.LabNode, stop: threading.Event, killed: list[int]) -> None:
    """Kill the source's SSH connection to the destination (the master every byte travels
    through) once a shard is partly written there: the link is cut as a failing fabric would cut it."""
    blobs = cache_dir(node) / "hub" / REPO_DIR / "blobs"
    while not stop.is_set():
        partials = list(blobs.glob(f"*{hf_checkpoint.PARTIAL_SUFFIX}")) if blobs.exists() else []
        if any(p.exists() and p.stat().st_size > (4 << 20) for p in partials):
            for pid in os.listdir("/proc"):
                if not pid.isdigit():
                    continue
                try:
                    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
                except OSError:
                    continue
                if PEER_MASTER.search(cmdline):
                    os.kill(int(pid), signal.SIGKILL)
                    killed.append(int(pid))
            if killed:
                return
        time.sleep(0.005)


def test_ssh_cut_mid_shard_leaves_nothing_complete_looking_and_the_rerun_sends_the_rest(
    hub, caches, node_a, node_b
):
    head = PROVIDER.create(head_props(node_a, hub)).outs
    stop, killed = threading.Event(), []
    watcher = threading.Thread(target=_kill_link_when_partial, args=(node_b, stop, killed), daemon=True)
    watcher.start()
    try:
        with pytest.raises(CheckpointError) as failure:
            PROVIDER.create(worker_props(node_b, node_a, head))
    finally:
        stop.set()
        watcher.join(5)
    assert killed, "the test never saw a partial shard to cut, or no connection to the destination to kill"
    message = str(failure.value)
    assert "from node-a to node-b failed: the SSH connection from node-a to node-b failed" in message
    blobs = cache_dir(node_b) / "hub" / REPO_DIR / "blobs"
    sizes = {b: s for _p, b, s in head["manifest"]}
    time.sleep(0.5)  # the receiving program removes its partial file when its stdin ends
    left = sorted(p.name for p in blobs.iterdir())
    assert not [n for n in left if n.endswith(hf_checkpoint.PARTIAL_SUFFIX)]
    assert all((blobs / n).stat().st_size == sizes[n] for n in left)
    assert not (cache_dir(node_b) / "hub" / REPO_DIR / "snapshots").exists()
    rerun = PROVIDER.create(worker_props(node_b, node_a, head)).outs
    missing = head["bytes"] - sum(sizes[n] for n in left)
    assert rerun["files_sent"] == len(sizes) - len(left) and missing <= rerun["bytes_sent"] <= missing * 1.01
    assert rerun["digest"] == head["digest"]


def test_hub_errors_name_repo_and_revision_never_the_token(hub, caches, node_a):
    hub.require_token = TOKEN
    try:
        with pytest.raises(CheckpointError) as refused:
            PROVIDER.create(head_props(node_a, hub, hf_token="hf_wrong_token_000"))
        accepted = PROVIDER.create(head_props(node_a, hub, hf_token=TOKEN)).outs
    finally:
        hub.require_token = None
    message = str(refused.value)
    assert REPO in message and "revision main" in message and "401" in message
    assert "Invalid credentials" in message and "qwen35-spark:hf_token" in message, message
    assert "hf_wrong_token_000" not in message
    assert accepted["revision"] == hub.repos[REPO].sha
    with pytest.raises(CheckpointError) as missing:
        PROVIDER.create(head_props(node_a, hub, requested_revision="no-such-branch"))
    assert "no-such-branch" in str(missing.value) and "no such revision" in str(missing.value)
    hub.fail_status = 404
    try:
        with pytest.raises(CheckpointError) as gone:
            PROVIDER.create(head_props(node_a, hub, repo="lab/gone-model"))
    finally:
        hub.fail_status = None
    assert "lab/gone-model" in str(gone.value) and "404" in str(gone.value)


def test_a_moved_branch_shows_at_refresh_and_changes_nothing(hub, caches, node_a):
    head = PROVIDER.create(head_props(node_a, hub)).outs
    assert head["upstream_revision"] == head["revision"]
    moved = "f" * 40
    hub.repos[REPO].branches["main"] = moved
    try:
        refreshed = PROVIDER.read("x", head).outs
    finally:
        hub.repos[REPO].branches["main"] = hub.repos[REPO].sha
    # The newer commit shows; the recorded one (what every node holds and serves) does not move.
    assert refreshed["upstream_revision"] == moved and refreshed["revision"] == head["revision"]
    assert refreshed["problems"] == {}
    assert not PROVIDER.diff("x", refreshed, head_props(node_a, hub)).changes


def test_received_files_belong_to_the_cache_owner(hub, caches, node_a, node_b):
    """The worker's receive runs as root and gives every file and folder it makes to the owner of the
    cache dir (containers may run as that user), not to root."""
    if os.geteuid() != 0:
        pytest.fail("the lab tier runs as root (make labtest): it proves the chown", pytrace=False)
    owner = (4242, 4343)
    os.chown(cache_dir(node_b), *owner)
    head = PROVIDER.create(head_props(node_a, hub)).outs
    worker = PROVIDER.create(worker_props(node_b, node_a, head)).outs
    root = cache_dir(node_b) / "hub" / REPO_DIR
    snapshot = Path(worker["snapshot_path"])
    paths = [cache_dir(node_b) / "hub", root, root / "blobs", root / "refs" / "main", snapshot]
    paths += [*(root / "blobs").iterdir(), *snapshot.iterdir()]
    assert len(paths) > 5 + 8
    for path in paths:
        stat = os.lstat(path)
        assert (stat.st_uid, stat.st_gid) == owner, path


def cache_tree(node: lab.LabNode) -> set[str]:
    return {str(path.relative_to(cache_dir(node))) for path in cache_dir(node).rglob("*")}


def test_a_destroy_without_keep_leaves_each_cache_as_it_found_it(hub, caches, node_a, node_b):
    """keep_on_destroy: false takes the files and the folders the checkpoint made (on the head also the
    Hub client's locks and tree listing), and keeps what someone else placed in the repo's folder."""
    head = PROVIDER.create(head_props(node_a, hub, keep=False)).outs
    worker = PROVIDER.create(worker_props(node_b, node_a, head, keep=False)).outs
    locks = cache_dir(node_a) / "hub" / ".locks" / REPO_DIR
    assert any(locks.iterdir()), "the real Hub client left no locks: this test proves nothing"
    assert (cache_dir(node_a) / "hub" / REPO_DIR / "trees" / f"{head['revision']}.json").exists()
    placed = cache_dir(node_b) / "hub" / REPO_DIR / "README.operator"
    placed.write_text("placed by hand, not by the checkpoint")
    PROVIDER.delete("node-b", worker)
    PROVIDER.delete("node-a", head)
    # What the Hub cache itself holds for every repo (the hub dir, `.locks`, CACHEDIR.TAG) stays.
    assert cache_tree(node_a) == {"hub", "hub/.locks", "hub/CACHEDIR.TAG"}
    assert cache_tree(node_b) == {"hub", f"hub/{REPO_DIR}", f"hub/{REPO_DIR}/README.operator"}
