"""A Hugging Face cache repo on a node: inventory, send, receive. Stdlib only; shipped over SSH.

Runs on a node as `python3 -c <this file> MODE '<json args>'` (the program travels in the command
line so that stdin stays free for the stream). Every mode but `send` prints one JSON report on
stdout; `send` writes the stream there.

The cache layout is the Hub client's: `<hub>/models--ORG--NAME/blobs/<name>` (LFS files named by
their sha256, 64 hex; small files by their git blob sha1, 40 hex), `snapshots/<commit>/<path>`
relative symlinks to `../../blobs/<name>`, `refs/<branch>` holding a commit. A blob entry may itself
be a symlink into a cache-wide shared store: it is followed on reading and materialised on writing.

Modes:
- `inventory`: what the node holds for one revision, checked against an expected file list (sizes,
  or every byte with `"hash": true`), the cache filesystem's free bytes, the cache owner.
- `send`: the listed blobs as frames `QWEN35CKPT1 <name> <size>\\n<bytes>`, then `QWEN35CKPT1 END\\n`.
- `receive`: reads that stream, hashes every blob while writing it under a temporary name, renames
  it only when size and hash match, then recreates the snapshot links, the refs and the ownership.

The manifest digest is sha256 over the sorted `path<TAB>blob<LF>` lines: equal on every node that
holds the same checkpoint.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import queue
import re
import sys
import threading
from enum import IntEnum

from components.node_programs import wire

MAGIC = b"QWEN35CKPT1"
PARTIAL_SUFFIX = ".qwen35-partial"
CHUNK = 1 << 20
# Buffers the receiver cycles through (reading the stream, writing the file, hashing on a thread):
# allocated once, so a 120 GB copy costs no allocation (and no page faults of fresh memory) per chunk.
RING = 8
PIPE_BYTES = 1 << 20
SHA256_NAME = re.compile(r"^[0-9a-f]{64}$")
SHA1_NAME = re.compile(r"^[0-9a-f]{40}$")
REPO_DIR = re.compile(r"^(models|datasets|spaces)--[A-Za-z0-9_.-]+(--[A-Za-z0-9_.-]+)*$")
REF_NAME = re.compile(r"^[A-Za-z0-9_.][A-Za-z0-9_./-]{0,199}$")


class Exit(IntEnum):
    """The exit statuses, declared once (the orchestrator maps them to messages)."""

    OK = 0
    BAD_INPUT = 2
    STREAM = 3  # the stream ended early or is malformed (a cut link)
    VERIFY = 4  # a blob's size or hash did not match its name
    IO = 5  # the node's disk refused (full, read-only, permissions)


class Failure(Exception):
    """An error with its exit status; printed as the JSON report's `error`."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def files_digest(files: list) -> str:
    """The manifest digest (`wire.manifest_digest`) of a file list `[[path, blob, size], …]`."""
    return wire.manifest_digest((f[0], f[1]) for f in files)


def blob_hasher(name: str, size: int):
    """A hash object for a blob and the hex it must end with, from the kind of name it has."""
    if SHA256_NAME.match(name):
        return hashlib.sha256()
    if SHA1_NAME.match(name):
        # A git blob id: sha1 over "blob <size>\0" and the content.
        hasher = hashlib.sha1()
        hasher.update(b"blob %d\0" % size)
        return hasher
    raise Failure(Exit.BAD_INPUT, f"blob {name!r} is neither a sha256 nor a git blob sha1: cannot verify it")


def check_path(path: str) -> str:
    """A file's path inside a snapshot: relative, no `..`, no empty parts."""
    parts = path.split("/")
    if not path or path.startswith("/") or any(p in ("", ".", "..") for p in parts) or "\x00" in path:
        raise Failure(Exit.BAD_INPUT, f"bad file path in manifest: {path!r}")
    return path


def repo_root(args: dict) -> str:
    hub = os.path.expanduser(str(args["hub"]))
    repo_dir = str(args["repo_dir"])
    if not os.path.isabs(hub) or not REPO_DIR.match(repo_dir):
        raise Failure(Exit.BAD_INPUT, f"bad cache location {hub!r} / {repo_dir!r}")
    return os.path.join(hub, repo_dir)


def resolve_revision(root: str, revision: str) -> str | None:
    """A commit sha for `revision`: itself when it is one, else what `refs/<revision>` holds."""
    if SHA1_NAME.match(revision):
        return revision
    if not REF_NAME.match(revision) or ".." in revision:
        raise Failure(Exit.BAD_INPUT, f"bad revision {revision!r}")
    try:
        with open(os.path.join(root, "refs", revision)) as handle:
            sha = handle.read().strip()
    except OSError:
        return None
    return sha if SHA1_NAME.match(sha) else None


def existing_ancestor(path: str) -> str:
    while not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path


def free_bytes(path: str) -> tuple[str, int]:
    where = existing_ancestor(path)
    stat = os.statvfs(where)
    return where, stat.f_bavail * stat.f_frsize


def hash_file(path: str, name: str, size: int) -> bool:
    hasher = blob_hasher(name, size)
    buffer = memoryview(bytearray(CHUNK))  # one buffer, filled again and again: no allocation per chunk
    with open(path, "rb", buffering=0) as handle:
        while count := handle.readinto(buffer):
            hasher.update(buffer[:count])
    return hasher.hexdigest() == name


def walk_snapshot(snapshot: str) -> list:
    """`[[path, blob, size], …]` of a snapshot dir, sizes of what the links point at (-1: dangling)."""
    files = []
    for dirpath, dirnames, filenames in os.walk(snapshot):
        dirnames.sort()
        for filename in sorted(filenames):
            full = os.path.join(dirpath, filename)
            rel = os.path.relpath(full, snapshot)
            blob = os.path.basename(os.readlink(full)) if os.path.islink(full) else ""
            try:
                size = os.stat(full).st_size
            except OSError:
                size = -1
            files.append([rel, blob, size])
    return files


def inventory(args: dict) -> dict:
    """What this node holds of one revision, checked against `expect` when given."""
    root = repo_root(args)
    revision = str(args["revision"])
    sha = resolve_revision(root, revision)
    fs_path, free = free_bytes(root)
    report: dict = {
        "root": root,
        "exists": os.path.isdir(root),
        "revision": sha,
        "fs_path": fs_path,
        "free_bytes": free,
        "partials": 0,
    }
    owner_dir = existing_ancestor(root)
    stat = os.stat(owner_dir)
    report["uid"], report["gid"] = stat.st_uid, stat.st_gid
    blobs_dir = os.path.join(root, "blobs")
    if os.path.isdir(blobs_dir):
        report["partials"] = sum(1 for n in os.listdir(blobs_dir) if n.endswith(PARTIAL_SUFFIX))
    expect = args.get("expect")
    if expect is None:
        if sha is None or not os.path.isdir(os.path.join(root, "snapshots", sha)):
            report["files"] = []
            report["missing_snapshot"] = True
            return report
        files = walk_snapshot(os.path.join(root, "snapshots", sha))
        report["files"] = files
        report["bytes"] = sum(max(f[2], 0) for f in files)
        report["digest"] = files_digest(files)
        return report
    sha = sha or revision
    snapshot = os.path.join(root, "snapshots", sha)
    status: dict[str, str] = {}
    checked: dict[str, str] = {}
    for path, blob, size in expect:
        check_path(path)
        blob_path = os.path.join(blobs_dir, blob)
        if blob not in checked:
            try:
                have = os.stat(blob_path).st_size
            except OSError:
                checked[blob] = "missing"
            else:
                if have != size:
                    checked[blob] = "truncated" if have < size else "oversized"
                elif args.get("hash") and not hash_file(blob_path, blob, size):
                    checked[blob] = "damaged"
                else:
                    checked[blob] = "ok"
        state = checked[blob]
        link = os.path.join(snapshot, path)
        if state == "ok" and not (
            os.path.islink(link) and os.path.realpath(link) == os.path.realpath(blob_path)
        ):
            state = "unlinked"
        status[path] = state
    report["status"] = status
    report["blobs"] = checked
    present = [f for f in expect if status[f[0]] == "ok"]
    report["digest"] = files_digest(present) if len(present) == len(expect) else None
    return report


def _copy_out(handle, out, size: int, path: str) -> None:
    """`size` bytes of `handle` to `out`: by sendfile (no copy through Python) where the kernel can."""
    out.flush()
    out_fd, in_fd, offset = out.fileno(), handle.fileno(), 0
    try:
        while offset < size:
            sent = os.sendfile(out_fd, in_fd, offset, min(size - offset, 1 << 30))
            if sent == 0:
                raise Failure(Exit.IO, f"{path} shrank while it was sent")
            offset += sent
        return
    except OSError as exc:
        if offset or exc.errno not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
            raise
    while offset < size:  # no sendfile to this kind of output: read and write
        chunk = handle.read(min(CHUNK, size - offset))
        if not chunk:
            raise Failure(Exit.IO, f"{path} shrank while it was sent")
        out.write(chunk)
        offset += len(chunk)


def send(args: dict, out) -> None:
    """Stream the listed blobs (following shared-store symlinks) as frames, then an end frame."""
    root = repo_root(args)
    for name in args["blobs"]:
        blob_hasher(name, 0)  # only verifiable names travel
        path = os.path.join(root, "blobs", name)
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            out.write(b"%s %s %d\n" % (MAGIC, name.encode(), size))
            _copy_out(handle, out, size, path)
    out.write(MAGIC + b" END\n")
    out.flush()


def _read_header(stream) -> tuple[str, int] | None:
    line = stream.readline(256)
    if not line:
        raise Failure(Exit.STREAM, "the stream ended before its end frame (the link was cut?)")
    parts = line.rstrip(b"\n").split(b" ")
    if parts == [MAGIC, b"END"]:
        return None
    if len(parts) != 3 or parts[0] != MAGIC or not parts[2].isdigit():
        raise Failure(Exit.STREAM, f"malformed frame header {line[:80]!r}")
    return parts[1].decode(), int(parts[2])


def _chown(path: str, owner: tuple[int, int] | None) -> None:
    if owner is not None:
        os.lchown(path, *owner)


def _makedirs(path: str, owner: tuple[int, int] | None) -> None:
    missing = []
    while not os.path.isdir(path):
        missing.append(path)
        path = os.path.dirname(path)
    for directory in reversed(missing):
        os.makedirs(directory, exist_ok=True)
        _chown(directory, owner)


class BufferRing:
    """RING buffers of CHUNK bytes: the receiver takes a free one, fills it from the stream, writes
    it to the file, and hands it to the hash thread, which gives it back once hashed."""

    def __init__(self, count: int = RING, size: int = CHUNK):
        self.free: queue.Queue = queue.Queue()
        for _ in range(count):
            self.free.put(memoryview(bytearray(size)))

    def take(self) -> memoryview:
        return self.free.get()

    def give(self, buffer: memoryview) -> None:
        self.free.put(buffer)


class HashThread:
    """Hashes filled buffers on a thread of its own (hashlib releases the GIL, so hashing overlaps
    with reading the stream and writing the file), returning each buffer to the ring when done."""

    def __init__(self, hasher, ring: BufferRing):
        self.hasher, self.ring = hasher, ring
        self.chunks: queue.Queue = queue.Queue()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while (item := self.chunks.get()) is not None:
            buffer, count = item
            try:
                self.hasher.update(buffer[:count])
            finally:
                self.ring.give(buffer)  # back to the ring whatever happened: the reader never waits forever

    def update(self, buffer: memoryview, count: int) -> None:
        self.chunks.put((buffer, count))

    def hexdigest(self) -> str:
        self.chunks.put(None)
        self.thread.join()
        return self.hasher.hexdigest()


class Finisher:
    """Makes a verified blob durable (fsync) and gives it its final name on a thread, while the next
    blob arrives; `wait()` returns once every blob is named, and raises the first failure."""

    def __init__(self):
        self.threads: list[threading.Thread] = []
        self.errors: list[BaseException] = []

    def finish(self, handle, partial: str, final: str, owner) -> None:
        def run() -> None:
            try:
                try:
                    os.fsync(handle.fileno())
                finally:
                    handle.close()
                _chown(partial, owner)
                os.chmod(partial, 0o644)
                # Replaces a damaged file or a symlink into a shared store with the verified bytes.
                os.replace(partial, final)
            except BaseException as exc:  # reported by wait(); the partial file must not stay
                with contextlib.suppress(OSError):
                    os.unlink(partial)
                self.errors.append(exc)

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        self.threads.append(thread)

    def wait(self) -> None:
        for thread in self.threads:
            thread.join()
        if self.errors:
            raise self.errors[0]


def write_all(fd: int, data: memoryview) -> None:
    while data:
        data = data[os.write(fd, data) :]


def receive_blob(
    stream, blobs_dir: str, name: str, size: int, owner, finisher: Finisher, ring: BufferRing
) -> None:
    """Write one blob under a temporary name, hashing as it arrives; it is renamed (by `finisher`)
    only once its hash matched its name."""
    final = os.path.join(blobs_dir, name)
    partial = final + PARTIAL_SUFFIX
    hasher = HashThread(blob_hasher(name, size), ring)
    left = size
    handle = open(partial, "wb", buffering=0)  # noqa: SIM115 -- closed here on failure, else by the finisher
    try:
        while left:
            buffer = ring.take()
            count = stream.readinto(buffer[: min(len(buffer), left)])
            if not count:
                ring.give(buffer)
                got = size - left
                raise Failure(Exit.STREAM, f"the stream ended inside blob {name} ({got} of {size} bytes)")
            try:
                write_all(handle.fileno(), buffer[:count])
            except BaseException:
                ring.give(buffer)
                raise
            hasher.update(buffer, count)
            left -= count
        digest = hasher.hexdigest()
        if digest != name:
            raise Failure(Exit.VERIFY, f"blob {name}: the bytes received hash to {digest}")
    except BaseException:
        handle.close()
        with contextlib.suppress(OSError):
            os.unlink(partial)
        raise
    finisher.finish(handle, partial, final, owner)


def link_snapshot(root: str, sha: str, files: list, owner) -> None:
    """Snapshot entries as relative links `../../blobs/<name>` (deeper for nested paths)."""
    snapshot = os.path.join(root, "snapshots", sha)
    for path, blob, _size in files:
        link = os.path.join(snapshot, check_path(path))
        _makedirs(os.path.dirname(link), owner)
        target = os.path.relpath(os.path.join(root, "blobs", blob), os.path.dirname(link))
        if os.path.islink(link) and os.readlink(link) == target:
            continue
        temporary = link + PARTIAL_SUFFIX
        if os.path.lexists(temporary):
            os.unlink(temporary)
        os.symlink(target, temporary)
        _chown(temporary, owner)
        os.replace(temporary, link)


def write_refs(root: str, refs: dict, owner) -> None:
    for ref, sha in refs.items():
        if not REF_NAME.match(ref) or ".." in ref or not SHA1_NAME.match(sha):
            raise Failure(Exit.BAD_INPUT, f"bad ref {ref!r} -> {sha!r}")
        path = os.path.join(root, "refs", ref)
        _makedirs(os.path.dirname(path), owner)
        temporary = path + PARTIAL_SUFFIX
        with open(temporary, "w") as handle:
            handle.write(sha)
        _chown(temporary, owner)
        os.replace(temporary, path)


def widen_pipe(fd: int) -> None:
    """A larger pipe (1 MiB, not 64 KiB) when `fd` is one: fewer wake-ups per byte. Best effort."""
    with contextlib.suppress(OSError, AttributeError):
        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, PIPE_BYTES)


def chown_target(requested, euid: int) -> tuple[int, int] | None:
    """Whom received files are given to: the cache's owner, when this process may chown (root).

    Any other user writes files that are its own already: a chown would only fail with EPERM."""
    if requested is None or euid != 0:
        return None
    return int(requested[0]), int(requested[1])


def receive(args: dict, stream) -> dict:
    """Receive the stream into the cache, then make the snapshot, refs and ownership whole."""
    widen_pipe(stream.fileno())
    root = repo_root(args)
    sha = str(args["revision"])
    if not SHA1_NAME.match(sha):
        raise Failure(Exit.BAD_INPUT, f"receive needs a commit sha, got {sha!r}")
    files = args["files"]
    sizes = {blob: size for _path, blob, size in files}
    owner = chown_target(args.get("owner"), os.geteuid())
    blobs_dir = os.path.join(root, "blobs")
    _makedirs(blobs_dir, owner)
    for stale in os.listdir(blobs_dir):
        if stale.endswith(PARTIAL_SUFFIX):
            os.unlink(os.path.join(blobs_dir, stale))  # a cut earlier copy
    received, received_bytes = 0, 0
    finisher = Finisher()
    ring = BufferRing()
    try:
        while (header := _read_header(stream)) is not None:
            name, size = header
            if name not in sizes:
                raise Failure(Exit.STREAM, f"blob {name} is not in this checkpoint's manifest")
            if size != sizes[name]:
                raise Failure(
                    Exit.VERIFY, f"blob {name}: the source has {size} bytes, the manifest says {sizes[name]}"
                )
            receive_blob(stream, blobs_dir, name, size, owner, finisher, ring)
            received += 1
            received_bytes += size
    finally:
        finisher.wait()
    for blob, size in sizes.items():
        try:
            have = os.stat(os.path.join(blobs_dir, blob)).st_size
        except OSError:
            have = -1
        if have != size:
            raise Failure(Exit.VERIFY, f"blob {blob}: {have} bytes here after the copy, expected {size}")
    link_snapshot(root, sha, files, owner)
    write_refs(root, args.get("refs") or {}, owner)
    return {
        "received": received,
        "received_bytes": received_bytes,
        "files": len(files),
        "bytes": sum(size for _p, _b, size in files),
        "snapshot_path": os.path.join(root, "snapshots", sha),
        "digest": files_digest(walk_snapshot(os.path.join(root, "snapshots", sha))),
    }


def remove(args: dict) -> dict:
    """Remove one revision's snapshot, its refs, and the blobs no other snapshot of the repo uses."""
    root = repo_root(args)
    sha = str(args["revision"])
    if not SHA1_NAME.match(sha):
        raise Failure(Exit.BAD_INPUT, f"remove needs a commit sha, got {sha!r}")
    snapshots = os.path.join(root, "snapshots")
    target = os.path.join(snapshots, sha)
    removed_files = 0
    if os.path.isdir(target):
        for dirpath, dirnames, filenames in os.walk(target, topdown=False):
            for name in filenames + dirnames:
                path = os.path.join(dirpath, name)
                if os.path.islink(path) or not os.path.isdir(path):
                    os.unlink(path)
                    removed_files += 1
                else:
                    os.rmdir(path)
        os.rmdir(target)
    used = set()
    if os.path.isdir(snapshots):
        for other in os.listdir(snapshots):
            used.update(blob for _p, blob, _s in walk_snapshot(os.path.join(snapshots, other)))
    freed = 0
    freed_blobs = []
    blobs_dir = os.path.join(root, "blobs")
    if os.path.isdir(blobs_dir):
        for name in os.listdir(blobs_dir):
            if name not in used:
                path = os.path.join(blobs_dir, name)
                freed += os.lstat(path).st_size
                os.unlink(path)
                freed_blobs.append(name)
    refs_dir = os.path.join(root, "refs")
    if os.path.isdir(refs_dir):
        for dirpath, dirnames, filenames in os.walk(refs_dir, topdown=False):
            for name in filenames:
                path = os.path.join(dirpath, name)
                with open(path) as handle:
                    if handle.read().strip() == sha:
                        os.unlink(path)
            # A branch such as `refs/pr/1` leaves a folder; only an empty one goes.
            for name in dirnames:
                with contextlib.suppress(OSError):
                    os.rmdir(os.path.join(dirpath, name))
    hub = os.path.dirname(root)
    files, folders = leftovers(os.path.basename(root), sha, freed_blobs)
    for relative in files:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(hub, relative))
    pruned = [relative for relative in folders if _rmdir_if_empty(os.path.join(hub, relative))]
    return {"removed_files": removed_files, "freed_bytes": freed, "pruned_folders": pruned}


def leftovers(repo_dir: str, sha: str, freed_blobs: list[str]) -> tuple[list[str], list[str]]:
    """What a removal clears besides the snapshot, blobs and refs, relative to the hub dir: the Hub
    client's files for this commit and these blobs, then the folders that go if empty (deepest first).

    Never the hub dir, `.locks` or the cache root: those are the cache's, shared by every repo."""
    files = [
        f"{repo_dir}/trees/{sha}.json",
        *(f".locks/{repo_dir}/{blob}.lock" for blob in sorted(freed_blobs)),
    ]
    folders = [
        f".locks/{repo_dir}",
        *(f"{repo_dir}/{part}" for part in ("trees", "snapshots", "blobs", "refs")),
        repo_dir,
    ]
    return files, folders


def _rmdir_if_empty(path: str) -> bool:
    # rmdir refuses a folder that still holds anything: another snapshot, a file someone placed.
    try:
        os.rmdir(path)
    except OSError:
        return False
    return True


MODES = ("inventory", "send", "receive", "remove")


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[1] not in MODES:
        print(json.dumps({"error": f"usage: hf_checkpoint.py {'|'.join(MODES)} '<json args>'"}))
        return Exit.BAD_INPUT
    mode = argv[1]
    # `send` owns stdout (the stream): its errors go to stderr only.
    errors = sys.stderr if mode == "send" else sys.stdout
    try:
        args = json.loads(argv[2])
        if mode == "send":
            send(args, sys.stdout.buffer)
            return Exit.OK
        if mode == "inventory":
            report = inventory(args)
        elif mode == "remove":
            report = remove(args)
        else:
            report = receive(args, sys.stdin.buffer)
    except Failure as exc:
        print(json.dumps({"error": str(exc), "status": exc.status}), file=errors)
        return exc.status
    except (KeyError, TypeError, ValueError) as exc:
        print(json.dumps({"error": f"bad arguments: {exc!r}", "status": Exit.BAD_INPUT}), file=errors)
        return Exit.BAD_INPUT
    except OSError as exc:
        where = f"{exc.filename}: " if exc.filename else ""
        print(json.dumps({"error": f"{where}{exc.strerror or exc}", "status": Exit.IO}), file=errors)
        return Exit.IO
    print(json.dumps(report, sort_keys=True))
    return Exit.OK


if __name__ == "__main__":
    sys.exit(main(sys.argv))
