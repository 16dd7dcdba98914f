"""What a node's Docker holds, for NodeImage (runs ON A NODE; standard library only).

    docker_facts SPEC    SPEC (JSON): ref, history, inventory, info_format, image_format

Prints one JSON report: `info` (`docker info` in info_format), `image` (`docker image inspect` of
ref in image_format, "" when absent), and as asked: `history` (ref's layer sizes), `images` (every
image's inspect line), `free` (bytes available under Docker's root), `blobs` (the layer blobs of a
containerd store's content store: dockerd's own containerd under its root, or the system's;
`blobs_listed` false and `blobs_unlisted` saying why when none could be read), and
`python` (the system python3, not a version manager's shim).

They come from the Engine API where the CLI would ask the same daemon over a plain unix socket
(`engine_api`: a few ms, where each CLI command is a process start), else from the CLI, whose
commands that do not depend on each other run at once (the inventory waits for `docker info`: the
store's kind and root decide where it is read). `facts_from` says which: "engine api" or "docker";
an API that failed midway leaves `api_error` and the CLI answers everything.

The inventory (`images`) of a classic store is read from the store's own files where this user can
read them: its image configs (`image/<driver>/imagedb`) and its layers' sizes (`layerdb`), the same
lines `docker image inspect` prints, in a few milliseconds where the CLI asks the daemon once per
image (0.2 s for 300 images). Elsewhere (a containerd store, files this user cannot read) the
Engine API answers it where it answered the rest, else the CLI. `inventory_from` says which:
"store files", "engine api" or "docker".
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from enum import IntEnum

from components.node_programs import engine_api
from components.node_programs.wire import INFO_FORMAT, INSPECT_FORMAT, chain_ids, image_store


class Exit(IntEnum):
    OK = 0
    DOCKER_UNAVAILABLE = 3  # `docker info` failed: its stderr is in the report
    INVENTORY_FAILED = 4
    USAGE = 5


CONTENT_STORE = "io.containerd.content.v1.content"
CONTENT_BLOBS = os.path.join(CONTENT_STORE, "blobs", "sha256")
SYSTEM_CONTAINERD_ROOT = "/var/lib/containerd"
DIGEST_HEX = re.compile(r"[0-9a-f]{64}")  # an image's name in imagedb (its config's digest)
API_TIMEOUT_S = 30.0  # a daemon that does not answer a few-kB request in this time: ask the CLI


def start(*args: str):
    import subprocess  # (only the CLI's path pays for the import)

    return subprocess.Popen(
        ["docker", *args], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )


def finish(proc) -> tuple[int, str, str]:
    out, err = proc.communicate()
    return proc.returncode, out.decode(errors="replace"), err.decode(errors="replace")


def content_blobs(docker_root: str) -> tuple[list[str], list[str]]:
    """The blobs of dockerd's own containerd content store (under its root) and the system's, and why
    a store could not be listed (none listed: every layer is sent). A content store without a blob
    folder yet (a fresh node: containerd makes it with the first blob) is listed, and empty."""
    found: set[str] = set()
    listed, why = False, []
    for root in (os.path.join(docker_root, "containerd", "daemon"), SYSTEM_CONTAINERD_ROOT):
        folder = os.path.join(root, CONTENT_BLOBS)
        try:
            found.update(os.listdir(folder))
            listed = True
        except FileNotFoundError:
            try:
                os.listdir(os.path.join(root, CONTENT_STORE))
                listed = True  # readable, and it holds no blob yet
            except FileNotFoundError:
                continue
            except OSError as exc:
                why.append(f"{folder}: {exc.strerror or exc}")
        except OSError as exc:  # not readable by this user (a non-root SSH user): those layers are sent
            why.append(f"{folder}: {exc.strerror or exc}")
    return sorted(found), [] if listed else (
        why or [f"no content store under {docker_root} or {SYSTEM_CONTAINERD_ROOT}"]
    )


def read_classic_store(root: str, driver: str) -> str | None:
    """Every image's inventory line (INSPECT_FORMAT) from a classic store's files, sorted by ID: its
    config's layer list, and its size (what the daemon reports: the sizes of its layers); None when
    the store cannot be read (another user's, another layout), and the CLI asks the daemon instead.
    An image or layer that goes while this reads (deleted meanwhile) is left out: its layers are
    then sent rather than reused, never the reverse."""
    store = os.path.join(root, "image", driver)
    configs = os.path.join(store, "imagedb", "content", "sha256")
    layers = os.path.join(store, "layerdb", "sha256")
    try:
        names = os.listdir(configs)
        os.listdir(layers)
    except OSError:
        return None
    lines = []
    for name in sorted(names):
        if not DIGEST_HEX.fullmatch(name):
            continue  # not an image: a config being written (Docker writes a temporary file first)
        try:
            with open(os.path.join(configs, name), "rb") as config:
                rootfs = json.loads(config.read()).get("rootfs") or {}
            diff_ids = rootfs.get("diff_ids") or []
            size = 0
            for chain in chain_ids(diff_ids):
                with open(os.path.join(layers, chain.removeprefix("sha256:"), "size")) as found:
                    size += int(found.read().strip())
        except FileNotFoundError:
            continue
        except (OSError, ValueError, AttributeError):
            return None  # a file this program does not understand: the daemon answers instead
        layer_list = json.dumps(diff_ids or None, separators=(",", ":"))
        lines.append(f"{json.dumps('sha256:' + name)}\t{layer_list}\t{size}\n")
    return "".join(lines)


def docker_inventory(image_format: str) -> tuple[str | None, str]:
    """Every image's inspect line, from the daemon (one request per image); None and the error when
    the listing or the inspection failed."""
    status, ids, err = finish(start("image", "ls", "-a", "-q", "--no-trunc"))
    if status:
        return None, err
    unique = sorted(set(ids.split()))
    if not unique:
        return "", ""
    status, lines, err = finish(start("image", "inspect", "--format", image_format, *unique))
    return (None, err) if status else (lines, "")


def drain(*procs) -> None:
    for proc in procs:
        if proc is not None:
            finish(proc)


def api_inventory(engine: str) -> str:
    """Every image's inspect line (INSPECT_FORMAT) from the Engine API: the list, then one request per
    image (a few ms each), where the CLI would start two processes. An image removed meanwhile is
    left out: its layers are then sent rather than reused."""
    status, listed = engine_api.get_json(engine, "/images/json?all=1", API_TIMEOUT_S)
    if status != 200:
        raise engine_api.EngineError(f"GET /images/json: status {status}")
    lines = []
    for image_id in sorted({str(image["Id"]) for image in listed}):
        status, found = engine_api.get_json(
            engine, f"/images/{engine_api.quote(image_id)}/json", API_TIMEOUT_S
        )
        if status == 404:
            continue
        if status != 200:
            raise engine_api.EngineError(f"GET /images/…/json: status {status}")
        lines.append(engine_api.image_line(found) + "\n")
    return "".join(lines)


def inventory(spec: dict, info_out: str, report: dict, engine: str | None = None) -> bool:
    """Fill in `images`, `free` and a containerd store's `blobs`; False when the images could not be
    listed (the daemon's error in `stderr`). From a classic store's files where they can be read,
    else from the Engine API on `engine` (when the other facts came from it), else from the CLI."""
    fields = info_out.strip().split("\t")
    root = fields[1] if len(fields) > 1 else "/var/lib/docker"
    containerd = image_store(fields[0]) == "containerd"
    lines = None
    if not containerd and len(fields) > 3 and fields[3] and spec["image_format"] == INSPECT_FORMAT:
        lines = read_classic_store(root, fields[3])
    report["inventory_from"] = "docker" if lines is None else "store files"
    if lines is None and engine and spec["image_format"] == INSPECT_FORMAT:
        try:
            lines = api_inventory(engine)
            report["inventory_from"] = "engine api"
        except engine_api.FAILED as exc:
            report["api_error"] = f"inventory: {type(exc).__name__}: {exc}"[:300]
    if lines is None:
        lines, err = docker_inventory(spec["image_format"])
        if lines is None:
            report["stderr"] = err.strip()[-2000:]
            return False
    report["images"] = lines
    stats = os.statvfs(root)
    report["free"] = stats.f_bavail * stats.f_frsize
    if containerd:
        report["blobs"], unlisted = content_blobs(root)
        report["blobs_listed"] = not unlisted
        if unlisted:
            report["blobs_unlisted"] = unlisted
    return True


def facts(spec: dict) -> tuple[Exit, dict]:
    """The report: the daemon, the image and its history from the Engine API where the CLI would ask
    the same daemon (a few ms, where each CLI command is a process start); should the API fail at
    any of them, all of them from the CLI."""
    engine = engine_api.engine_socket()
    if not engine or (spec["info_format"], spec["image_format"]) != (INFO_FORMAT, INSPECT_FORMAT):
        return cli_facts(spec)
    try:
        info_out, image_out, history_out = api_answers(engine, spec)
    except engine_api.FAILED as exc:
        status, report = cli_facts(spec)
        report["api_error"] = f"{type(exc).__name__}: {exc}"[:300]
        return status, report
    report: dict = {"info": info_out, "image": image_out, "python": "python3", "facts_from": "engine api"}
    if spec.get("inventory") and not inventory(spec, info_out, report, engine):
        return Exit.INVENTORY_FAILED, report
    if history_out is not None:
        report["history"] = history_out
    report["python"] = system_python()
    return Exit.OK, report


def api_answers(engine: str, spec: dict) -> tuple[str, str, str | None]:
    """The lines `docker info`, `docker image inspect` and `docker history` would print (the image's
    and its history "" when absent; the history None when not asked for)."""
    ref = engine_api.quote(spec["ref"])
    status, info = engine_api.get_json(engine, "/info", API_TIMEOUT_S)
    if status != 200:
        raise engine_api.EngineError(f"GET /info: status {status}")
    info_out = engine_api.info_line(info)
    status, found = engine_api.get_json(engine, f"/images/{ref}/json", API_TIMEOUT_S)
    if status not in (200, 404):
        raise engine_api.EngineError(f"GET /images/…/json: status {status}")
    image_out = engine_api.image_line(found) if status == 200 else ""
    if not spec.get("history"):
        return info_out, image_out, None
    status, layers = engine_api.get_json(engine, f"/images/{ref}/history", API_TIMEOUT_S)
    if status not in (200, 404):
        raise engine_api.EngineError(f"GET /images/…/history: status {status}")
    # one size per line, newest layer first, as `docker history` prints them; absent: nothing
    return info_out, image_out, "".join(f"{layer['Size']}\n" for layer in layers) if status == 200 else ""


def cli_facts(spec: dict) -> tuple[Exit, dict]:
    ref = spec["ref"]
    info = start("info", "--format", spec["info_format"])
    image = start("image", "inspect", "--format", spec["image_format"], ref)
    history = (
        start("history", "--no-trunc", "--human=false", "--format", "{{.Size}}", ref)
        if spec.get("history")
        else None
    )
    status, info_out, info_err = finish(info)
    report: dict = {"info": info_out.strip(), "image": "", "python": "python3", "facts_from": "docker"}
    if status:
        drain(image, history)
        report["stderr"] = info_err.strip()[-2000:]
        return Exit.DOCKER_UNAVAILABLE, report
    # The inventory while the image and its history are inspected.
    if spec.get("inventory") and not inventory(spec, info_out, report):
        drain(image, history)
        return Exit.INVENTORY_FAILED, report
    found, image_out, _ = finish(image)
    report["image"] = image_out.strip() if found == 0 else ""
    if history is not None:
        report["history"] = finish(history)[1]
    report["python"] = system_python()
    return Exit.OK, report


def system_python() -> str:
    """The system interpreter on the default PATH, not a version manager's shim."""
    return shutil.which("python3", path=os.defpath) or "python3"


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
