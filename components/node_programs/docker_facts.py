"""What a node's Docker holds, for NodeImage (runs ON A NODE; standard library only).

    docker_facts SPEC    SPEC (JSON): ref, history, inventory, info_format, image_format

Prints one JSON report: `info` (`docker info` in info_format), `image` (`docker image inspect` of
ref in image_format, "" when absent), and as asked: `history` (ref's layer sizes), `images` (every
image's inspect line), `free` (bytes available under Docker's root), `blobs` (the layer blobs of a
containerd store's content store: dockerd's own containerd under its root, or the system's;
`blobs_listed` false and `blobs_unlisted` saying why when none could be read), and
`python` (the system python3, not a version manager's shim). The docker commands that do not
depend on each other run at once.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from enum import IntEnum


class Exit(IntEnum):
    OK = 0
    DOCKER_UNAVAILABLE = 3  # `docker info` failed: its stderr is in the report
    INVENTORY_FAILED = 4
    USAGE = 5


CONTENT_BLOBS = os.path.join("io.containerd.content.v1.content", "blobs", "sha256")
SYSTEM_CONTAINERD_ROOT = "/var/lib/containerd"


def start(*args: str) -> subprocess.Popen:
    return subprocess.Popen(
        ["docker", *args], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )


def finish(proc: subprocess.Popen) -> tuple[int, str, str]:
    out, err = proc.communicate()
    return proc.returncode, out.decode(errors="replace"), err.decode(errors="replace")


def content_blobs(docker_root: str) -> tuple[list[str], list[str]]:
    """The blobs of dockerd's own containerd content store (under its root) and the system's, and why
    a store could not be listed (none listed: every layer is sent)."""
    found: set[str] = set()
    listed, why = False, []
    for root in (os.path.join(docker_root, "containerd", "daemon"), SYSTEM_CONTAINERD_ROOT):
        folder = os.path.join(root, CONTENT_BLOBS)
        try:
            found.update(os.listdir(folder))
            listed = True
        except FileNotFoundError:
            continue
        except OSError as exc:  # not readable by this user (a non-root SSH user): those layers are sent
            why.append(f"{folder}: {exc.strerror or exc}")
    return sorted(found), [] if listed else (
        why or [f"no content store under {docker_root} or {SYSTEM_CONTAINERD_ROOT}"]
    )


def facts(spec: dict) -> tuple[Exit, dict]:
    ref = spec["ref"]
    info = start("info", "--format", spec["info_format"])
    image = start("image", "inspect", "--format", spec["image_format"], ref)
    history = (
        start("history", "--no-trunc", "--human=false", "--format", "{{.Size}}", ref)
        if spec.get("history")
        else None
    )
    listing = start("image", "ls", "-a", "-q", "--no-trunc") if spec.get("inventory") else None
    status, info_out, info_err = finish(info)
    report: dict = {"info": info_out.strip(), "image": "", "python": "python3"}
    if status:
        for proc in (image, history, listing):
            if proc is not None:
                finish(proc)
        report["stderr"] = info_err.strip()[-2000:]
        return Exit.DOCKER_UNAVAILABLE, report
    found, image_out, _ = finish(image)
    report["image"] = image_out.strip() if found == 0 else ""
    if history is not None:
        report["history"] = finish(history)[1]
    # The system interpreter on the default PATH, not a version manager's shim.
    report["python"] = shutil.which("python3", path=os.defpath) or "python3"
    if listing is not None:
        status, ids, err = finish(listing)
        if status:
            report["stderr"] = err.strip()[-2000:]
            return Exit.INVENTORY_FAILED, report
        unique = sorted(set(ids.split()))
        lines = ""
        if unique:
            status, lines, err = finish(start("image", "inspect", "--format", spec["image_format"], *unique))
            if status:
                report["stderr"] = err.strip()[-2000:]
                return Exit.INVENTORY_FAILED, report
        report["images"] = lines
        root = info_out.strip().split("\t")[1] if "\t" in info_out else "/var/lib/docker"
        stats = os.statvfs(root)
        report["free"] = stats.f_bavail * stats.f_frsize
        if "io.containerd.snapshotter" in info_out:
            report["blobs"], unlisted = content_blobs(root)
            report["blobs_listed"] = not unlisted
            if unlisted:
                report["blobs_unlisted"] = unlisted
    return Exit.OK, report


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        sys.stderr.write("usage: docker_facts SPEC\n")
        return Exit.USAGE
    status, report = facts(json.loads(argv[0]))
    report["exit"] = int(status)
    sys.stdout.write(json.dumps(report) + "\n")
    sys.stdout.flush()
    return int(status)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
