"""patches/graft_cluster.py's decisions as tables: copy Ray only where both Pythons share an ABI; the
base's system NCCL (what the Spark community image links its pip NCCL to) lands at its own path and the
donor's pip NCCL is pointed at it. The whole export/apply runs for real in the lab build."""

from __future__ import annotations

import os

import pytest

from tests.support.patch_modules import load_patch_module

graft = load_patch_module("graft_cluster")

BASE = {"cache_tag": "cpython-312", "soabi": "cpython-312-aarch64-linux-gnu", "machine": "aarch64",
        "libc": "glibc", "glibc": "2.39"}  # fmt: skip


@pytest.mark.parametrize(
    ("donor", "way", "named"),
    [
        ({}, "copy", "both Pythons are cpython-312"),
        ({"glibc": "2.41"}, "copy", "aarch64"),
        (
            {"cache_tag": "cpython-311", "soabi": "cpython-311-aarch64-linux-gnu"},
            "install",
            "cache_tag cpython-312 vs cpython-311",
        ),
        ({"machine": "x86_64"}, "install", "machine aarch64 vs x86_64"),
        ({"glibc": "2.35"}, "install", "glibc 2.35 is older than the base's 2.39"),
        ({"libc": ""}, "install", "libc glibc vs "),
    ],
    ids=["same", "newer-glibc", "other-python", "other-machine", "older-glibc", "not-glibc"],
)
def test_ray_is_copied_only_where_the_base_s_compiled_files_load(donor, way, named):
    decided, why = graft.abi_decision(BASE, {**BASE, **donor})
    assert decided == way and named in why, why


def test_the_system_nccl_the_base_links_to_is_carried_and_the_donor_s_pip_nccl_points_at_it(
    tmp_path, monkeypatch
):
    # The base as the Spark community image makes it: pip's libnccl.so.2 -> /usr/lib/<arch>/libnccl.so.2
    # -> libnccl.so.2.28.9 (a build from source); the donor has the pip wheel's own library.
    system = tmp_path / "base-root" / "usr" / "lib" / "aarch64-linux-gnu"
    system.mkdir(parents=True)
    (system / "libnccl.so.2.28.9").write_bytes(b"system build")
    (system / "libnccl.so.2").symlink_to("libnccl.so.2.28.9")
    base_site = tmp_path / "base-site"
    (base_site / "nvidia" / "nccl" / "lib").mkdir(parents=True)
    (base_site / graft.PIP_NCCL).symlink_to(system / "libnccl.so.2")
    monkeypatch.setattr(graft.sys, "path", [str(base_site)])
    out = tmp_path / "out"
    exported = graft.export_nccl(str(out))
    assert exported["mode"] == "system" and "carried" in exported["summary"], exported
    # In the donor, the same absolute path does not exist yet.
    for name in ("libnccl.so.2", "libnccl.so.2.28.9"):
        (system / name).unlink()
    donor_site = tmp_path / "donor-site"
    (donor_site / "nvidia" / "nccl" / "lib").mkdir(parents=True)
    (donor_site / graft.PIP_NCCL).write_bytes(b"pip build")
    monkeypatch.setattr(graft.sys, "path", [str(donor_site)])
    said = graft.apply_nccl(str(out), exported)
    assert (system / "libnccl.so.2").resolve().read_bytes() == b"system build"
    pip_lib = donor_site / graft.PIP_NCCL
    assert os.readlink(pip_lib) == str(system / "libnccl.so.2") and pip_lib.read_bytes() == b"system build"
    assert (donor_site / (graft.PIP_NCCL + ".pip")).read_bytes() == b"pip build"
    assert "now links to it" in said


@pytest.mark.parametrize(("link", "mode"), [(False, "pip"), (None, "none")])
def test_a_base_on_the_pip_nccl_carries_nothing_and_says_so(tmp_path, monkeypatch, link, mode):
    site = tmp_path / "site"
    (site / "nvidia" / "nccl" / "lib").mkdir(parents=True)
    if link is False:
        (site / graft.PIP_NCCL).write_bytes(b"pip build")
    monkeypatch.setattr(graft.sys, "path", [str(site)])
    exported = graft.export_nccl(str(tmp_path / "out"))
    assert exported["mode"] == mode and "nothing to carry" in exported["summary"]
    assert graft.apply_nccl(str(tmp_path / "out"), exported) == exported["summary"]
