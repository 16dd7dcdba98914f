"""The checkpoint's node programs run for real on this machine: the real Hub client against the
stand-in Hub on loopback (fetch), and inventory / send | receive between two cache dirs."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from components.checkpoint import programs
from components.checkpoint.plan import Manifest, manifest_from_inventory, plan_copy
from components.node_programs import hf_checkpoint, hub_fetch
from components.provider_kit.reports import last_json_object
from lab.standin_hub import StandinHub, generate_repo, load_repo
from tests.support.hub_fixture import hub_fixture

REPO = "lab/tiny-qwen35"
TOKEN = "hf_secret_token_value_123"


def run(argv, stdin: bytes = b"", env: dict | None = None) -> subprocess.CompletedProcess:
    environment = {**os.environ, **(env or {})}
    return subprocess.run(argv, input=stdin, capture_output=True, env=environment, timeout=120)


def fetch(cache: Path, hub: StandinHub, revision: str = "main", token: str = "", repo: str = REPO):
    argv = programs.fetch_argv(
        sys.executable, str(cache), repo, revision, [], [], str(cache / "progress.json")
    )
    done = run(argv, stdin=(token + "\n").encode(), env={"HF_ENDPOINT": hub.endpoint})
    return done, last_json_object(done.stdout.decode())


hub = hub_fixture(REPO, shards=3, shard_bytes=3 << 20)


@pytest.fixture(scope="module")
def fetched(hub, tmp_path_factory) -> Path:
    cache = tmp_path_factory.mktemp("head")
    done, report = fetch(cache, hub)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert report["revision"] == hub.repos[REPO].sha
    return cache


def inventory(cache: Path, revision: str, expect=None, full: bool = False) -> dict:
    done = run(programs.inventory_argv(sys.executable, str(cache), REPO, revision, expect, full))
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout)


def source_manifest(cache: Path) -> Manifest:
    return manifest_from_inventory(REPO, "main", inventory(cache, "main"), "head")


def copy(source: Path, destination: Path, manifest: Manifest, blobs, cut_at: int | None = None):
    sent = run(programs.send_argv(sys.executable, str(source), REPO, blobs)).stdout
    if cut_at is not None:
        sent = sent[:cut_at]
    receive = programs.receive_argv(
        sys.executable,
        str(destination),
        REPO,
        manifest.revision,
        manifest.as_state(),
        dict(manifest.refs),
        None,
    )
    done = run(receive, stdin=sent)
    return done, last_json_object(done.stdout.decode())


def test_fetch_writes_the_standard_cache_layout(hub, fetched):
    root = fetched / "hub" / "models--lab--tiny-qwen35"
    sha = hub.repos[REPO].sha
    assert (root / "refs" / "main").read_text() == sha
    shard = root / "snapshots" / sha / "model-00001-of-00003.safetensors"
    assert shard.is_symlink() and os.readlink(shard).startswith("../../blobs/")
    lfs = hub.repos[REPO].files["model-00001-of-00003.safetensors"].sha256
    assert os.path.basename(os.readlink(shard)) == lfs
    assert not (fetched / "progress.json").exists()  # removed at the end, as the transfer layer does


def test_fetch_progress_uses_the_transfer_layers_format(tmp_path):
    blobs = tmp_path / "blobs"
    blobs.mkdir()
    progress = hub_fetch.Progress(str(tmp_path / "p.json"), "fetch-org--model", "spark-1", str(blobs))
    progress.doc["bytes_total"] = 1000
    (blobs / "x.incomplete").write_bytes(b"y" * 250)
    sample = progress.sample()
    assert sample["bytes_done"] == 250 and sample["bytes_total"] == 1000 and sample["stage"] == "fetch"
    with open(hf_checkpoint.__file__.replace("hf_checkpoint.py", "transfer_source.py")) as handle:
        source = handle.read()
    for key in sample:  # the same keys `status` reads from a copy's progress file
        assert f'"{key}"' in source


def test_fetch_token_travels_as_a_header_never_in_output(hub, tmp_path):
    hub.require_token = TOKEN
    try:
        refused, report = fetch(tmp_path / "a", hub, token="hf_wrong_token_456")
        assert refused.returncode == hub_fetch.Exit.FETCH
        # A wrong token: the Hub's own reason, and the setting to fix (never the token itself).
        assert report["kind"] == "token", report
        for part in (REPO, "revision main", "401", "Invalid credentials", "qwen35-spark:hf_token"):
            assert part in report["error"], report["error"]
        assert b"hf_wrong_token_456" not in refused.stdout + refused.stderr
        # No token, on a repo that needs one: the same setting named.
        _, missing = fetch(tmp_path / "c", hub)
        assert missing["kind"] == "not_found" and "qwen35-spark:hf_token" in missing["error"], missing
        assert "401" in missing["error"] and "no token is configured" in missing["error"], missing
        accepted, report = fetch(tmp_path / "b", hub, token=TOKEN)
        assert accepted.returncode == 0, accepted.stdout
        assert TOKEN.encode() not in accepted.stdout + accepted.stderr
    finally:
        hub.require_token = None
    assert any(h.get("authorization") == f"Bearer {TOKEN}" for _m, _p, h in hub.requests)


def test_fetch_errors_name_repo_and_revision(hub, tmp_path):
    _, missing_repo = fetch(tmp_path, hub, repo="lab/no-such-model")
    assert missing_repo["kind"] == "not_found" and "lab/no-such-model" in missing_repo["error"]
    _, missing_rev = fetch(tmp_path, hub, revision="no-such-branch")
    assert missing_rev["kind"] == "revision"
    assert "no-such-branch" in missing_rev["error"] and REPO in missing_rev["error"]
    hub.fail_status = 404
    try:
        _, gone = fetch(tmp_path, hub)
    finally:
        hub.fail_status = None
    assert gone["kind"] == "not_found" and "404" in gone["error"]


def test_a_hub_that_does_not_answer_is_a_network_error_not_a_traceback(tmp_path):
    with socket.socket() as probe:  # a loopback port nothing listens on once this closes
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    argv = programs.fetch_argv(sys.executable, str(tmp_path), REPO, "main", [], [], None)
    done = run(argv, stdin=b"\n", env={"HF_ENDPOINT": f"http://127.0.0.1:{port}"})
    report = last_json_object(done.stdout.decode())
    assert done.returncode == hub_fetch.Exit.FETCH and report["kind"] == "network", done.stderr[-2000:]
    assert f"the Hub at http://127.0.0.1:{port} did not answer" in report["error"]
    assert REPO in report["error"] and "run pulumi up again" in report["error"]
    assert b"Traceback" not in done.stderr


def test_fetch_continues_a_cut_download(hub, tmp_path):
    hub.cut_after = 1 << 20  # each shard's first GET breaks after 1 MiB
    before = len(hub.requests)
    try:
        done, report = fetch(tmp_path, hub)
    finally:
        hub.cut_after = None
    assert done.returncode == 0, done.stdout + done.stderr
    shard_gets = [
        p for m, p, _h in hub.requests[before:] if m == "GET" and p.endswith("00001-of-00003.safetensors")
    ]
    assert len(shard_gets) >= 2  # cut once, then fetched again
    manifest = manifest_from_inventory(REPO, "main", inventory(tmp_path, "main"), "head")
    assert inventory(tmp_path, "main", manifest.as_state(), full=True)["digest"] == manifest.digest


def test_going_back_to_an_earlier_commit_downloads_nothing(tmp_path):
    """A rollback on the head: the earlier commit is still on the Hub and still in the cache, so the
    fetch only resolves it (no file is requested) and both snapshots stay."""
    first = generate_repo(tmp_path / "first", shards=2, shard_bytes=1 << 20)
    with StandinHub({REPO: first}) as hub:
        cache = tmp_path / "cache"
        old = fetch(cache, hub)[1]["revision"]
        second = load_repo(REPO, generate_repo(tmp_path / "second", shards=2, shard_bytes=1 << 20, seed=2))
        assert hub.push(second).sha == old
        assert fetch(cache, hub, revision=second.sha)[1]["revision"] == second.sha
        before = len(hub.requests)
        done, report = fetch(cache, hub, revision=old)
        assert done.returncode == 0 and report["revision"] == old, done.stdout + done.stderr
        assert not [p for _m, p, _h in hub.requests[before:] if "/resolve/" in p], hub.requests[before:]
        snapshots = cache / "hub" / "models--lab--tiny-qwen35" / "snapshots"
        assert {p.name for p in snapshots.iterdir()} == {old, second.sha}
        hub.earlier.clear()  # a Hub without that commit: the rollback is refused, naming it
        _, refused = fetch(cache, hub, revision=old)
        assert refused["kind"] == "revision" and old in refused["error"]


def test_copy_to_an_empty_node_is_verified_and_relative(fetched, tmp_path):
    manifest = source_manifest(fetched)
    plan = plan_copy(manifest, inventory(tmp_path, manifest.revision, manifest.as_state()))
    assert len(plan.blobs) == len(manifest.files) and plan.bytes == manifest.bytes
    done, report = copy(fetched, tmp_path, manifest, plan.blobs)
    assert done.returncode == 0, done.stdout + done.stderr
    assert report["digest"] == manifest.digest and report["received_bytes"] == manifest.bytes
    after = inventory(tmp_path, "main", manifest.as_state(), full=True)
    assert after["digest"] == manifest.digest and set(after["status"].values()) == {"ok"}
    link = Path(report["snapshot_path"]) / "config.json"
    assert os.readlink(link) == "../../blobs/" + dict((p, b) for p, b, _ in manifest.files)["config.json"]
    assert plan_copy(manifest, after).nothing_to_do


def test_a_cut_stream_leaves_nothing_complete_looking_and_the_rerun_sends_the_rest(fetched, tmp_path):
    manifest = source_manifest(fetched)
    blobs = plan_copy(manifest, inventory(tmp_path, manifest.revision, manifest.as_state())).blobs
    stream = run(programs.send_argv(sys.executable, str(fetched), REPO, blobs)).stdout
    cut = len(stream) // 2
    done, report = copy(fetched, tmp_path, manifest, blobs, cut_at=cut)
    assert done.returncode == hf_checkpoint.Exit.STREAM and "ended" in report["error"]
    blobs_dir = tmp_path / "hub" / "models--lab--tiny-qwen35" / "blobs"
    left = sorted(p.name for p in blobs_dir.iterdir())
    assert not [n for n in left if n.endswith(hf_checkpoint.PARTIAL_SUFFIX)]
    sizes = manifest.blob_sizes
    for name in left:  # every file under a final name is whole
        assert (blobs_dir / name).stat().st_size == sizes[name]
    assert not (tmp_path / "hub" / "models--lab--tiny-qwen35" / "snapshots").exists()
    second = plan_copy(manifest, inventory(tmp_path, manifest.revision, manifest.as_state()))
    assert set(second.blobs) == set(blobs) - set(left) and second.blobs
    done, report = copy(fetched, tmp_path, manifest, second.blobs)
    assert done.returncode == 0 and report["received_bytes"] == second.bytes < manifest.bytes


def test_a_flipped_byte_is_seen_by_a_full_check_and_only_that_file_is_resent(fetched, tmp_path):
    manifest = source_manifest(fetched)
    copy(fetched, tmp_path, manifest, sorted(manifest.blob_sizes))
    shard = next(b for p, b, _ in manifest.files if p.endswith("00002-of-00003.safetensors"))
    path = tmp_path / "hub" / "models--lab--tiny-qwen35" / "blobs" / shard
    data = bytearray(path.read_bytes())
    data[1000] ^= 0xFF
    path.write_bytes(bytes(data))
    assert plan_copy(manifest, inventory(tmp_path, manifest.revision, manifest.as_state())).nothing_to_do
    full = inventory(tmp_path, manifest.revision, manifest.as_state(), full=True)
    assert full["blobs"][shard] == "damaged" and full["digest"] is None
    plan = plan_copy(manifest, full)
    assert plan.blobs == (shard,)
    done, report = copy(fetched, tmp_path, manifest, plan.blobs)
    assert (
        done.returncode == 0
        and report["received"] == 1
        and report["received_bytes"] == manifest.blob_sizes[shard]
    )
    assert inventory(tmp_path, manifest.revision, manifest.as_state(), full=True)["digest"] == manifest.digest


def test_a_truncated_shard_shows_at_a_sizes_check(fetched, tmp_path):
    manifest = source_manifest(fetched)
    copy(fetched, tmp_path, manifest, sorted(manifest.blob_sizes))
    shard = next(b for p, b, _ in manifest.files if p.endswith("00003-of-00003.safetensors"))
    path = tmp_path / "hub" / "models--lab--tiny-qwen35" / "blobs" / shard
    os.truncate(path, 100)
    report = inventory(tmp_path, manifest.revision, manifest.as_state())
    assert report["blobs"][shard] == "truncated"
    assert plan_copy(manifest, report).blobs == (shard,)


def test_bytes_that_do_not_match_their_name_are_refused(fetched, tmp_path):
    manifest = source_manifest(fetched)
    shard = next(b for p, b, _ in manifest.files if p.endswith(".safetensors"))
    stream = run(programs.send_argv(sys.executable, str(fetched), REPO, [shard])).stdout
    header_end = stream.index(b"\n") + 1
    corrupted = stream[: header_end + 10] + bytes([stream[header_end + 10] ^ 1]) + stream[header_end + 11 :]
    receive = programs.receive_argv(
        sys.executable, str(tmp_path), REPO, manifest.revision, manifest.as_state(), {}, None
    )
    done = run(receive, stdin=corrupted)
    assert done.returncode == hf_checkpoint.Exit.VERIFY
    assert not (tmp_path / "hub" / "models--lab--tiny-qwen35" / "blobs" / shard).exists()


def test_shared_blob_store_symlinks_are_followed_and_materialised(fetched, tmp_path):
    manifest = source_manifest(fetched)
    source = tmp_path / "source"
    store = tmp_path / "shared-store"
    store.mkdir()
    blobs = source / "hub" / "models--lab--tiny-qwen35" / "blobs"
    blobs.mkdir(parents=True)
    for blob in manifest.blob_sizes:
        original = fetched / "hub" / "models--lab--tiny-qwen35" / "blobs" / blob
        (store / blob).write_bytes(original.read_bytes())
        (blobs / blob).symlink_to(store / blob)
    destination = tmp_path / "destination"
    done, report = copy(source, destination, manifest, sorted(manifest.blob_sizes))
    assert done.returncode == 0, done.stdout + done.stderr
    received = destination / "hub" / "models--lab--tiny-qwen35" / "blobs"
    assert all(not (received / b).is_symlink() for b in manifest.blob_sizes)
    # A destination whose blobs are shared-store symlinks counts them as present.
    held = inventory(source, manifest.revision, manifest.as_state())
    assert all(state == "ok" for state in held["blobs"].values())


@pytest.mark.parametrize(
    ("requested", "euid", "expected"),
    [
        ([4242, 4343], 0, (4242, 4343)),  # root gives the files to the cache's owner
        ([4242, 4343], 1000, None),  # anyone else's files are its own already; chown would be EPERM
        (None, 0, None),  # no owner asked for: the files stay whose the process is
        (["4242", "4343"], 0, (4242, 4343)),  # JSON from the provider, made numbers
    ],
)
def test_who_received_files_are_given_to(requested, euid, expected):
    assert hf_checkpoint.chown_target(requested, euid) == expected


def test_received_files_stay_the_receivers_or_go_to_the_cache_owner(fetched, tmp_path):
    """As any user: another owner asked for never fails the receive. Root's chown to the cache's
    owner is proven for real in tests/lab/test_checkpoint.py."""
    manifest = source_manifest(fetched)
    owner = (4242, 4343)
    expected = hf_checkpoint.chown_target(owner, os.geteuid()) or (os.geteuid(), os.getegid())
    receive = programs.receive_argv(
        sys.executable,
        str(tmp_path),
        REPO,
        manifest.revision,
        manifest.as_state(),
        dict(manifest.refs),
        owner,
    )
    sent = run(programs.send_argv(sys.executable, str(fetched), REPO, sorted(manifest.blob_sizes))).stdout
    done = run(receive, stdin=sent)
    assert done.returncode == 0, done.stdout + done.stderr
    root = tmp_path / "hub" / "models--lab--tiny-qwen35"
    snapshot = root / "snapshots" / manifest.revision
    paths = [root, root / "blobs", root / "refs" / "main", snapshot, *(root / "blobs").iterdir()]
    paths += list(snapshot.iterdir())
    for path in paths:
        stat = os.lstat(path)
        assert (stat.st_uid, stat.st_gid) == expected, path


def test_the_fetch_tells_the_operator_bytes_rate_and_eta_while_it_runs(hub, tmp_path, monkeypatch, capsys):
    """`pulumi up` shows a long Hub fetch live (a dynamic provider's stderr lines reach the operator):
    the provider relays the fetch's progress lines as `fetch REPO@REV hub -> NODE: … MB, MB/s, ETA`.
    The fetch runs here on this machine (ssh_argv replaced by the command itself), from a slow Hub."""
    from components.checkpoint import execute as provider
    from components.transfer import watch

    monkeypatch.setattr(watch, "SAY_EVERY_S", 0.3)
    monkeypatch.setattr(provider, "ssh_argv", lambda target, argv, *_, **__: list(argv))
    props = {
        "node": {"name": "spark-1", "host": "127.0.0.9", "user": "u", "known_hosts": "/kh"},
        "repo": REPO,
        "requested_revision": "main",
        "cache_dir": str(tmp_path / "cache"),
        "fetch": {"python": sys.executable, "endpoint": hub.endpoint},
        "hf_token": TOKEN,
    }
    hub.rate_bps, hub.require_token = 1 << 20, TOKEN  # 3 MiB shards, fetched in parallel: ~3 s
    try:
        revision = provider.fetch_on_head(props, None)
    finally:
        hub.rate_bps, hub.require_token = None, None
    assert revision == hub.repos[REPO].sha
    said = [line for line in capsys.readouterr().err.splitlines() if line.startswith("qwen35: fetch ")]
    total_mb = sum(f.size for f in hub.repos[REPO].files.values()) / 1e6
    where = "lab/tiny-qwen35@main hub -> spark-1: "
    assert any(where in line and f"of {total_mb:.0f} MB (" in line for line in said), said
    assert any("MB/s" in line for line in said) and not any(TOKEN in line for line in said)


def test_the_fetch_is_packed_with_its_libraries_and_keeps_site_packages(tmp_path):
    """hub_fetch imports `wire` and needs the Hub client from site packages: shipped, not isolated."""
    argv = programs.fetch_argv(sys.executable, str(tmp_path), REPO, "main", [], [], None)
    assert argv[1] == "-c" and "-I" not in argv[:3] and "-S" not in argv[:3]
    # Bad arguments on purpose: the program itself answers (no import error), without a download.
    done = subprocess.run([*argv[:3], "{}"], input=b"\n", capture_output=True, cwd=tmp_path, timeout=60)
    assert done.returncode == hub_fetch.Exit.BAD_INPUT, done.stderr
    assert json.loads(done.stdout)["error"].startswith("bad arguments")


def test_a_removal_clears_the_hub_clients_files_and_only_folders_left_empty():
    files, folders = hf_checkpoint.leftovers("models--org--m", "a" * 40, ["b2", "b1"])
    assert files == [
        f"models--org--m/trees/{'a' * 40}.json",
        ".locks/models--org--m/b1.lock",
        ".locks/models--org--m/b2.lock",
    ]
    # Deepest first, the repo's folder last; never the hub dir, `.locks` or the cache root.
    assert folders == [
        ".locks/models--org--m",
        "models--org--m/trees",
        "models--org--m/snapshots",
        "models--org--m/blobs",
        "models--org--m/refs",
        "models--org--m",
    ]


def tree(cache: Path) -> set[str]:
    return {str(path.relative_to(cache)) for path in cache.rglob("*")}


def test_removing_the_fetched_revision_leaves_the_cache_as_the_fetch_found_it(hub, fetched, tmp_path):
    cache = tmp_path / "cache"
    shutil.copytree(fetched, cache, symlinks=True)
    # What the real Hub client leaves besides the snapshot: its locks and its tree listing.
    assert any((cache / "hub" / ".locks" / "models--lab--tiny-qwen35").iterdir())
    assert (cache / "hub" / "models--lab--tiny-qwen35" / "trees" / f"{hub.repos[REPO].sha}.json").exists()
    done = run(programs.remove_argv(sys.executable, str(cache), REPO, hub.repos[REPO].sha))
    assert done.returncode == 0, done.stdout + done.stderr
    # The Hub cache's own (shared by every repo, left to it): the hub dir, `.locks`, its CACHEDIR.TAG.
    assert tree(cache) == {"hub", "hub/.locks", "hub/CACHEDIR.TAG"}


def test_a_removal_keeps_what_others_placed_in_the_cache(hub, fetched, tmp_path):
    cache = tmp_path / "cache"
    shutil.copytree(fetched, cache, symlinks=True)
    root = cache / "hub" / "models--lab--tiny-qwen35"
    (root / "snapshots" / ("f" * 40)).mkdir()
    (root / "snapshots" / ("f" * 40) / "notes.txt").write_text("another revision, fetched by hand")
    (root / "refs" / "pr").mkdir()
    (root / "refs" / "pr" / "1").write_text("f" * 40)
    (cache / "hub" / ".locks" / "models--lab--tiny-qwen35" / "other.lock").touch()
    (cache / "hub" / "models--other--repo").mkdir()
    done = run(programs.remove_argv(sys.executable, str(cache), REPO, hub.repos[REPO].sha))
    assert done.returncode == 0, done.stdout + done.stderr
    assert tree(cache) == {
        "hub",
        "hub/.locks",
        "hub/CACHEDIR.TAG",
        "hub/.locks/models--lab--tiny-qwen35",
        "hub/.locks/models--lab--tiny-qwen35/other.lock",
        "hub/models--other--repo",
        "hub/models--lab--tiny-qwen35",
        "hub/models--lab--tiny-qwen35/refs",
        "hub/models--lab--tiny-qwen35/refs/pr",
        "hub/models--lab--tiny-qwen35/refs/pr/1",
        "hub/models--lab--tiny-qwen35/snapshots",
        f"hub/models--lab--tiny-qwen35/snapshots/{'f' * 40}",
        f"hub/models--lab--tiny-qwen35/snapshots/{'f' * 40}/notes.txt",
    }
