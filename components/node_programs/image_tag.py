"""NodeImage's side on the DESTINATION node (standard library only): load-verify-promote, and the
record of which NodeImage resources hold a tag.

    image_tag load SPEC    stdin: a docker-load archive; land it on SPEC.tmp_ref, tag SPEC.ref only if
                           the loaded image is the wanted one (SPEC.compare "id": its ID; "layers": its
                           layer list, across image-store kinds), record SPEC.claim as the tag's
                           holder, drop tmp_ref (failing that only warns: the real tag is verified)
    image_tag retag SPEC   tag SPEC.image_id as SPEC.ref (an image already there) and record the claim
    image_tag join SPEC    the tag is already there: add SPEC.claim to its holders, but only if a
                           NodeImage placed it (a record exists) and it still points at that image;
                           with no holder recorded, SPEC.claim only waits (see leave)
    image_tag leave SPEC   drop SPEC.claim; the last holder leaving removes the tag, and only while it
                           points at the image that was placed. SPEC.legacy_placed_id: a resource from
                           before the records (no claim) removes a tag it placed when no record exists, and
                           hands it over to the claims waiting on it when newer ones joined
                           (a leftover: removed with node_image/execute.py's `legacy`).
                           SPEC.keep > 0: the last holder leaving while another image of the
                           repository is held here (a replacement) keeps the tag as a previous image
                           (rollback is then a retag, not a copy); of the repository's previous
                           images only the SPEC.keep newest stay tagged, older ones are removed; with
                           none held any more (a destroy) the tag and every previous image go.
                           SPEC.placed_id: the image this claim placed or verified; when the tag now
                           points elsewhere (a build under the same tag placed its successor) and
                           nothing tags that image and no container uses it, it is removed too
    image_tag drop SPEC    only that: SPEC.placed_id removed when SPEC.ref points elsewhere, nothing
                           tags it and nothing uses it (the head's copy of a build, which no claim
                           placed: the build under the same tag displaced it)

Why a record on the node: Pulumi replaces a resource by creating the new one, then deleting the old
one. Both stand for the same tag; the record lets the old one's delete see that the tag is still held.
Records live in ~/.qwen35/tags/, one JSON file per tag, changed under a lock. Every mode prints one
JSON report on stdout.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import subprocess
import sys
import time
from enum import IntEnum

from components.node_programs import engine_api
from components.node_programs.engine_api import engine_socket, quote
from components.node_programs.wire import INSPECT_FORMAT, TAG_RECORDS, split_tag


class Exit(IntEnum):
    """Exit status, one per outcome (255 is ssh's own: the link failed)."""

    OK = 0
    LOAD_FAILED = 2
    INSPECT_FAILED = 3
    MISMATCH = 4
    TAG_FAILED = 5
    USAGE = 6


OUTCOMES = {
    Exit.OK: "ok",
    Exit.LOAD_FAILED: "docker load failed on the destination",
    Exit.INSPECT_FAILED: "the loaded image could not be inspected on the destination",
    Exit.MISMATCH: "the loaded image does not match the source",
    Exit.TAG_FAILED: "docker tag / docker image rm failed on the destination",
    Exit.USAGE: "usage: image_tag load|retag|join|leave|drop SPEC",
}


def docker(*args: str, stdin=subprocess.DEVNULL) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", *args], stdin=stdin, capture_output=True)


# ---- after the load: inspect, tag, untag ------------------------------------------------------------
# Each `docker` command costs a CLI start (tens of ms); where the daemon's socket is known, the Engine
# API does the same in a few ms. It is used only once it has found the temporary tag just loaded (a
# name no other image has: the same daemon); anything else, the CLI.


class Cli:
    def inspect(self, ref: str, fmt: str) -> tuple[int, str, bytes]:
        done = docker("image", "inspect", "--format", fmt, ref)
        return done.returncode, done.stdout.decode().strip(), done.stderr

    def tag(self, source: str, ref: str) -> tuple[int, bytes]:
        done = docker("tag", source, ref)
        return done.returncode, done.stderr

    def untag(self, ref: str) -> tuple[int, bytes]:
        done = docker("image", "rm", ref)
        return done.returncode, done.stderr


class Api:
    def __init__(self, path: str):
        self.path = path

    def inspect(self, ref: str, fmt: str) -> tuple[int, str, bytes]:
        status, body = engine_api.call(self.path, "GET", f"/images/{quote(ref)}/json")
        if status != 200:
            return 1, "", body
        return 0, engine_api.image_line(json.loads(body)), b""

    def tag(self, source: str, ref: str) -> tuple[int, bytes]:
        repo, tag = split_tag(ref)
        query = f"repo={quote(repo, '')}&tag={quote(tag, '')}"
        status, body = engine_api.call(self.path, "POST", f"/images/{quote(source)}/tag?{query}")
        return (0, b"") if status in (200, 201) else (1, body)

    def untag(self, ref: str) -> tuple[int, bytes]:
        status, body = engine_api.call(self.path, "DELETE", f"/images/{quote(ref)}")
        return (0, b"") if status == 200 else (1, body)


def engine_for(tmp_ref: str, fmt: str) -> tuple[Cli | Api, tuple[int, str, bytes] | None]:
    """The API where it finds `tmp_ref` (just loaded, by the CLI), with that inspection; else the CLI."""
    path = engine_socket()
    if path is None or fmt != INSPECT_FORMAT:
        return Cli(), None
    api = Api(path)
    with contextlib.suppress(*engine_api.FAILED):
        found = api.inspect(tmp_ref, fmt)
        if found[0] == 0:
            return api, found
    return Cli(), None


def tail(data: bytes, lines: int = 6) -> str:
    return "\n".join(data.decode(errors="replace").strip().splitlines()[-lines:])


def image_id(ref: str) -> str | None:
    found = docker("image", "inspect", "--format", "{{.Id}}", ref)
    return found.stdout.decode().strip() if found.returncode == 0 else None


@contextlib.contextmanager
def records():
    """The records folder, locked for the duration (one writer at a time on this node)."""
    folder = os.path.expanduser(TAG_RECORDS)
    os.makedirs(folder, mode=0o700, exist_ok=True)
    with open(os.path.join(folder, ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield folder


def record_path(folder: str, ref: str) -> str:
    return os.path.join(folder, quote(ref, safe="") + ".json")


def read_record(path: str) -> dict | None:
    try:
        with open(path) as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return None


def write_record(path: str, record: dict) -> None:
    partial = f"{path}.{os.getpid()}.tmp"
    with open(partial, "w") as handle:
        json.dump(record, handle)
    os.replace(partial, path)


def hold(ref: str, placed_id: str, claim: str) -> None:
    """This claim placed `ref` (pointing at `placed_id`): it is now the tag's only holder."""
    if claim:
        with records() as folder:
            write_record(record_path(folder, ref), {"ref": ref, "image_id": placed_id, "holders": [claim]})


def load(spec: dict) -> tuple[Exit, dict]:
    report: dict = {"promoted": False, "loaded": "", "stderr": ""}
    loaded = docker("load", stdin=None)  # the archive: this program's stdin
    if loaded.returncode:
        report["stderr"] = tail(loaded.stderr or loaded.stdout)
        return Exit.LOAD_FAILED, report
    engine, inspected = engine_for(spec["tmp_ref"], spec["inspect_format"])
    return promote(spec, engine, report, inspected)


def each_step(engine: Cli | Api, report: dict):
    """Run one step by `engine`; should the API fail at it (a dropped connection), that step, and
    only it, by the CLI (every step is then the CLI's)."""
    state = {"engine": engine}

    def step(name: str, *args):
        current = state["engine"]
        if isinstance(current, Cli):
            return getattr(current, name)(*args)
        try:
            return getattr(current, name)(*args)
        except engine_api.FAILED as exc:
            report["api_error"] = f"{name}: {type(exc).__name__}: {exc}"
            state["engine"] = Cli()
            return getattr(state["engine"], name)(*args)

    return step


def promote(
    spec: dict, engine: Cli | Api, report: dict, inspected: tuple[int, str, bytes] | None = None
) -> tuple[Exit, dict]:
    """Inspect what landed on tmp_ref (unless `inspected` already did); when it is the wanted image
    tag ref, hold it, drop tmp_ref."""
    tmp_ref = spec["tmp_ref"]
    step = each_step(engine, report)
    status, line, err = inspected or step("inspect", tmp_ref, spec["inspect_format"])
    if status:
        report["stderr"] = tail(err)
        return Exit.INSPECT_FAILED, report
    report["loaded"] = line
    fields = line.split("\t")
    found = json.loads(fields[0]) if spec["compare"] == "id" else (json.loads(fields[1]) or [])
    if found != spec["want"]:
        step("untag", tmp_ref)
        return Exit.MISMATCH, report
    status, err = step("tag", tmp_ref, spec["ref"])
    if status:
        report["stderr"] = tail(err)
        return Exit.TAG_FAILED, report
    report["promoted"] = True
    hold(spec["ref"], json.loads(fields[0]), spec.get("claim") or "")
    status, err = step("untag", tmp_ref)
    # (already gone: the API removed it, its answer lost, and the CLI found nothing left to remove)
    if status and b"no such image" not in err.lower():
        # the real tag is verified and held: a leftover temporary tag only warns
        report["warning"] = (
            f"the temporary tag {tmp_ref} could not be removed ({tail(err, 2)}); "
            f"remove it by hand: docker image rm {tmp_ref}"
        )
    return Exit.OK, report


def retag(spec: dict) -> tuple[Exit, dict]:
    tagged = docker("tag", spec["image_id"], spec["ref"])
    if tagged.returncode:
        return Exit.TAG_FAILED, {"promoted": False, "stderr": tail(tagged.stderr)}
    hold(spec["ref"], spec["image_id"], spec.get("claim") or "")
    return Exit.OK, {"promoted": True}


def join(spec: dict) -> tuple[Exit, dict]:
    with records() as folder:
        path = record_path(folder, spec["ref"])
        record = read_record(path)
        current = image_id(spec["ref"])
        if current is None or (record is not None and record.get("image_id") != current):
            return Exit.OK, {
                "joined": False,
                "waiting": False,
                "holders": len((record or {}).get("holders") or []),
            }
        if record is not None and record.get("retained_at") and not record.get("holders"):
            # A previous image this node kept (leave with keep): a rollback holds it again.
            kept = {k: v for k, v in record.items() if k != "retained_at"}
            write_record(path, {**kept, "holders": [spec["claim"]]})
            return Exit.OK, {"joined": True, "waiting": False, "holders": 1, "was_retained": True}
        if record is None or not record.get("holders"):
            # No NodeImage is known to have placed it: by hand, or by a resource from before the records.
            # Wait for the latter's delete to hand the tag over (`leave`); never hold it otherwise.
            record = record or {"ref": spec["ref"], "image_id": current, "holders": []}
            waiting = [w for w in record.get("waiting") or [] if w != spec["claim"]] + [spec["claim"]]
            write_record(path, {**record, "waiting": waiting})
            return Exit.OK, {"joined": False, "waiting": True, "holders": 0}
        holders = [h for h in record.get("holders") or [] if h != spec["claim"]] + [spec["claim"]]
        write_record(path, {**record, "holders": holders})
        return Exit.OK, {"joined": True, "waiting": False, "holders": len(holders)}


def leave(spec: dict) -> tuple[Exit, dict]:
    ref, claim = spec["ref"], spec.get("claim") or ""
    legacy = spec.get("legacy_placed_id") or ""
    with records() as folder:
        path = record_path(folder, ref)
        record = read_record(path)
        holders = list((record or {}).get("holders") or [])
        waiting = list((record or {}).get("waiting") or [])
        if record is not None and not holders and not claim and legacy:
            # A resource from before the records placed the tag; newer ones found it there and wait:
            # hand it over to them when it still points at what was placed, else only forget it.
            if waiting and record.get("image_id") == legacy == image_id(ref):
                write_record(path, {**record, "holders": waiting, "waiting": []})
                return Exit.OK, {"removed": False, "holders": len(waiting)}
            record = None
        if record is None:
            if claim or not legacy or image_id(ref) != legacy:
                return Exit.OK, {"removed": False, "holders": 0}
            placed = legacy
        else:
            if claim in waiting:  # it never held the tag: only stop waiting
                waiting.remove(claim)
                if holders or waiting:
                    write_record(path, {**record, "waiting": waiting})
                else:
                    os.unlink(path)
                return Exit.OK, {"removed": False, "holders": len(holders)}
            if claim not in holders:
                # A successor placed the tag anew (on another image: a build under the same tag).
                return Exit.OK, {"removed": False, "holders": len(holders), **drop_displaced(spec, ref)}
            holders.remove(claim)
            if holders:
                write_record(path, {**record, "holders": holders})
                return Exit.OK, {"removed": False, "holders": len(holders)}
            placed = record.get("image_id")
            if image_id(ref) != placed:  # re-pointed by someone else since: not ours to remove
                os.unlink(path)
                return Exit.OK, {"removed": False, "holders": 0, **drop_displaced(spec, ref)}
            keep = int(spec.get("keep") or 0)
            if keep > 0 and newer_held(folder, ref):
                write_record(path, {**record, "holders": [], "waiting": waiting, "retained_at": time.time()})
                return Exit.OK, {"removed": False, "holders": 0, "retained": True, **prune(folder, ref, keep)}
            os.unlink(path)
            if keep > 0:  # no image of the repository is held here any more (a destroy): none is kept
                prune(folder, ref, 0)
        removed = docker("image", "rm", ref)
        if removed.returncode and b"conflict" not in removed.stderr.lower():
            return Exit.TAG_FAILED, {"removed": False, "holders": 0, "stderr": tail(removed.stderr)}
        return Exit.OK, {"removed": removed.returncode == 0, "holders": 0}


def drop_displaced(spec: dict, ref: str) -> dict:
    """Remove the image this claim placed (SPEC.placed_id) once `ref` points elsewhere and nothing
    else tags it: without this every build under the same tag left a whole image behind, untagged, on
    every node. `docker image rm` by ID refuses an image a container (even a stopped one) or a child
    image uses: it is then kept and the report says why."""
    placed = spec.get("placed_id") or ""
    if not placed or image_id(ref) == placed:
        return {}
    tags = docker("image", "inspect", "--format", "{{json .RepoTags}}", placed)
    if tags.returncode:  # gone already
        return {}
    try:
        tagged = json.loads(tags.stdout or b"null")
    except ValueError:
        return {}
    if tagged:  # another tag names it: it is not displaced, only no longer this one
        return {}
    removed = docker("image", "rm", placed)
    if removed.returncode:
        return {"displaced_kept": placed, "displaced_why": tail(removed.stderr, 2)}
    return {"displaced_removed": placed}


def repo_records(folder: str, ref: str) -> list[tuple[str, dict]]:
    """(path, record) of every tag record of `ref`'s repository on this node."""
    repo, found = split_tag(ref)[0], []
    for name in os.listdir(folder):
        record = read_record(os.path.join(folder, name)) if name.endswith(".json") else None
        if record and split_tag(str(record.get("ref") or ""))[0] == repo:
            found.append((os.path.join(folder, name), record))
    return found


def newer_held(folder: str, ref: str) -> bool:
    """Another image of `ref`'s repository is held here: `ref` is being replaced (not destroyed)."""
    return any(r.get("holders") and r.get("ref") != ref for _, r in repo_records(folder, ref))


def prune(folder: str, ref: str, keep: int) -> dict:
    """Of `ref`'s repository's previous images (records kept by `leave`), untag all but the `keep`
    newest; a tag re-pointed since is only forgotten. The report: what is still kept, what went."""
    kept = [
        (float(record["retained_at"]), path, record)
        for path, record in repo_records(folder, ref)
        if record.get("retained_at") and not record.get("holders")
    ]
    kept.sort(reverse=True)
    pruned = []
    for _, path, record in kept[keep:]:
        os.unlink(path)
        if image_id(record["ref"]) == record.get("image_id"):
            docker("image", "rm", record["ref"])  # a container still using it: the tag stays (conflict)
            pruned.append(record["ref"])
    return {"previous": [record["ref"] for _, _, record in kept[:keep]], "pruned": pruned}


def drop(spec: dict) -> tuple[Exit, dict]:
    with records():  # one writer at a time: no tag of ours appears while it is checked and removed
        return Exit.OK, {"removed": False, **drop_displaced(spec, spec["ref"])}


MODES = {"load": load, "retag": retag, "join": join, "leave": leave, "drop": drop}


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in MODES:
        sys.stderr.write(OUTCOMES[Exit.USAGE] + "\n")
        return Exit.USAGE
    status, report = MODES[argv[0]](json.loads(argv[1]))
    report["outcome"] = OUTCOMES[status]
    report["exit"] = int(status)
    sys.stdout.write(json.dumps(report) + "\n")
    sys.stdout.flush()
    return int(status)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
