"""The Hub fetch with the `huggingface_hub` a real deployment image carries.

Without `model.fetch_python`, the head fetches the checkpoint in a short-lived container of the
deployment's image, whose Hub client is the one vLLM's release pinned (0.36.x for vLLM 0.14.0 and
0.17.1), not this project's (2.x). Here `hub_fetch.py` runs, exactly as the provider sends it
(`programs.fetch_argv`), under the Python of vLLM 0.17.1 installed from PyPI, against the stand-in Hub
on loopback; the result is read back with the node program that inventories caches
(`hf_checkpoint.py`), the one that decides what the worker copies get.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from components.checkpoint import programs
from components.node_programs import hf_checkpoint
from components.provider_kit.reports import last_json_object
from lab.standin_hub import StandinHub
from tests.support.hub_fixture import hub_fixture

pytestmark = pytest.mark.release

REPO = "release/tiny-qwen35"
TOKEN = "hf_release_token_4567"


def hub_version(python: Path) -> str:
    done = subprocess.run(
        [str(python), "-c", "import huggingface_hub as h; print(h.__version__)"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def fetch(python: Path, cache: Path, hub: StandinHub, token: str = "", **args) -> dict:
    argv = programs.fetch_argv(
        str(python),
        str(cache),
        args.pop("repo", REPO),
        args.pop("revision", "main"),
        args.pop("allow", []),
        args.pop("ignore", []),
        args.pop("progress", None),
        args.pop("resolve_only", False),
    )
    env = {**os.environ, "HF_ENDPOINT": hub.endpoint, "HF_HOME": str(cache / "hf-home")}
    env.pop("HF_TOKEN", None)
    done = subprocess.run(argv, input=f"{token}\n", capture_output=True, text=True, env=env, timeout=300)
    report = last_json_object(done.stdout)
    assert report is not None, f"no report (exit {done.returncode}):\n{done.stderr[-2000:]}"
    if token:
        assert token not in done.stdout + done.stderr, "the token was printed"
    return report


hub = hub_fixture(REPO, shards=2, shard_bytes=3 << 20)


def test_the_releases_hub_client_fetches_into_the_layout_the_copies_read(prebuilt, hub, tmp_path):
    version = hub_version(prebuilt)
    assert version.split(".")[0] == "0", (
        f"vLLM 0.17.1's huggingface_hub is {version}: update this test's text"
    )
    hub.require_token = TOKEN
    try:
        report = fetch(prebuilt, tmp_path, hub, token=TOKEN, progress=str(tmp_path / "progress.json"))
    finally:
        hub.require_token = None
    sha = hub.repos[REPO].sha
    assert report.get("revision") == sha, report
    root = tmp_path / "hub" / programs.repo_dir_name(REPO)
    assert (root / "refs" / "main").read_text() == sha
    held = hf_checkpoint.inventory({"hub": str(tmp_path / "hub"), "repo_dir": root.name, "revision": "main"})
    assert held["revision"] == sha and len(held["files"]) == len(hub.repos[REPO].files)
    # Every snapshot entry is a relative link into blobs/, named by its hash, and the hash holds.
    checked = hf_checkpoint.inventory(
        {
            "hub": str(tmp_path / "hub"),
            "repo_dir": root.name,
            "revision": sha,
            "expect": held["files"],
            "hash": True,
        }
    )
    assert set(checked["status"].values()) == {"ok"}, checked["status"]
    assert checked["digest"] == held["digest"]
    for path, _blob, _size in held["files"]:
        assert os.readlink(root / "snapshots" / sha / path).startswith("../"), path
    assert not (tmp_path / "progress.json").exists()  # removed at the end


def test_the_releases_hub_client_resolves_and_names_refusals_without_the_token(prebuilt, hub, tmp_path):
    sha = hub.repos[REPO].sha
    assert fetch(prebuilt, tmp_path, hub, resolve_only=True) == {"revision": sha}
    assert not (tmp_path / "hub" / programs.repo_dir_name(REPO) / "blobs").exists()  # resolved only
    missing = fetch(prebuilt, tmp_path, hub, revision="no-such-branch")
    assert missing.get("kind") == "revision" and "no-such-branch" in missing["error"], missing
    hub.require_token = TOKEN
    try:
        refused = fetch(prebuilt, tmp_path, hub, token="hf_wrong_token_000")
    finally:
        hub.require_token = None
    assert refused.get("kind") == "token" and "401" in refused["error"], refused
    assert "qwen35-spark:hf_token" in refused["error"], refused
    assert "hf_wrong_token_000" not in json.dumps(refused)
    hub.fail_status = 404
    try:
        gone = fetch(prebuilt, tmp_path, hub, repo="release/gone-model")
    finally:
        hub.fail_status = None
    assert gone.get("kind") == "not_found" and "release/gone-model" in gone["error"], gone
