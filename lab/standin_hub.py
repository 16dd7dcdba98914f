"""A stand-in Hugging Face Hub on loopback: the HTTP endpoints the real `huggingface_hub` client uses.

A test double, not a Hub: it serves generated repos (directories of files on disk) under one branch
and one commit each (`push` moves the branch to a new commit; earlier ones stay resolvable by their
sha, as on the Hub), so the real client (`snapshot_download` with `HF_ENDPOINT` pointed here) runs
against it and nothing touches the real Hub. Endpoints (huggingface_hub 2.4):

- `GET /api/models/{repo}/revision/{rev}`: `{"id", "sha", "siblings"}`;
- `GET /api/models/{repo}/tree/{rev}?recursive=…`: the file list with blob ids and LFS sha256/size;
- `HEAD|GET /{repo}/resolve/{rev}/{path}`: `X-Repo-Commit`, `ETag` (git blob sha1), and for LFS
  files `X-Linked-Etag` (sha256) and `X-Linked-Size`; `Range: bytes=N-` answers 206.

Faults for tests: `require_token` (401 without `Authorization: Bearer <token>`: as a private repo
`RepoNotFound` when no token came, as a token the Hub does not know when another came), `fail_status`
(every request answers that status), `cut_after` (the first GET of each LFS file closes the
connection after that many body bytes). Errors carry `X-Error-Code` as the Hub's do.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

CHUNK = 1 << 20
# The Hub stores files above this size (and every *.safetensors) in LFS, named by their sha256.
LFS_THRESHOLD = 10 * 1024 * 1024
# The Hub's reason for a token it does not know (huggingface_hub tells it from a missing repo by it).
INVALID_TOKEN = "Invalid credentials in Authorization header"


@dataclass(frozen=True)
class HubFile:
    path: str
    size: int
    blob_id: str  # git blob sha1: the ETag of a non-LFS file
    sha256: str | None  # LFS files only: their X-Linked-Etag and their blob name in the cache
    source: Path

    @property
    def etag(self) -> str:
        return self.sha256 or self.blob_id


@dataclass
class HubRepo:
    repo_id: str
    sha: str
    files: dict[str, HubFile]
    branches: dict[str, str] = field(default_factory=dict)


def _hash_file(path: Path) -> tuple[str, str]:
    size = path.stat().st_size
    sha1 = hashlib.sha1(b"blob %d\0" % size)
    sha256 = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(CHUNK):
            sha1.update(chunk)
            sha256.update(chunk)
    return sha1.hexdigest(), sha256.hexdigest()


def load_repo(repo_id: str, directory: Path, branch: str = "main") -> HubRepo:
    """A repo from a directory: every file under it, hashed; the commit sha derived from the tree."""
    files = {}
    tree = hashlib.sha1()
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        rel = path.relative_to(directory).as_posix()
        blob_id, sha256 = _hash_file(path)
        lfs = path.stat().st_size > LFS_THRESHOLD or rel.endswith(".safetensors")
        files[rel] = HubFile(rel, path.stat().st_size, blob_id, sha256 if lfs else None, path)
        tree.update(f"{rel}\0{blob_id}\n".encode())
    sha = tree.hexdigest()
    return HubRepo(repo_id, sha, files, {branch: sha})


def generate_repo(
    directory: Path,
    shards: int = 2,
    shard_bytes: int = 1 << 20,
    seed: int = 1,
    model_type: str = "qwen3_5_moe",
) -> Path:
    """A small model repo: config.json, tokenizer files and `shards` safetensors files of random bytes."""
    directory.mkdir(parents=True, exist_ok=True)
    config = {
        "architectures": ["Qwen3_5MoeForConditionalGeneration"],
        "model_type": "qwen3_5_moe",
        "seed": seed,
    }
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (directory / "generation_config.json").write_text(json.dumps({"temperature": 0.6}) + "\n")
    (directory / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 262144}) + "\n")
    (directory / "tokenizer.json").write_text(json.dumps({"version": "1.0", "seed": seed}) + "\n")
    names = [f"model-{i + 1:05d}-of-{shards:05d}.safetensors" for i in range(shards)]
    weight_map = {f"layer.{i}.weight": name for i, name in enumerate(names)}
    (directory / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}) + "\n")
    for name in names:
        target = directory / name
        if target.exists() and target.stat().st_size == shard_bytes:
            continue
        with open(target, "wb") as out:
            left = shard_bytes
            while left:
                chunk = os.urandom(min(CHUNK, left))
                out.write(chunk)
                left -= len(chunk)
    return directory


class StandinHub:
    """The server: `with StandinHub({repo_id: dir}) as hub:` gives `hub.endpoint`."""

    def __init__(self, repos: dict[str, Path], host: str = "127.0.0.1", port: int = 0):
        self.repos: dict[str, HubRepo] = {rid: load_repo(rid, Path(d)) for rid, d in repos.items()}
        # repo id -> sha -> an earlier commit: the Hub keeps every commit, a rollback pins one of them
        self.earlier: dict[str, dict[str, HubRepo]] = {}
        self.require_token: str | None = None
        self.fail_status: int | None = None
        self.cut_after: int | None = None
        self.rate_bps: int | None = None  # file bodies at about this many bytes per second (a slow link)
        self.requests: list[tuple[str, str, dict]] = []
        self._cut_done: set[str] = set()
        self._lock = threading.Lock()
        hub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet: tests read hub.requests
                pass

            def do_HEAD(self):
                hub._handle(self, head=True)

            def do_GET(self):
                hub._handle(self, head=False)

        self.server = http.server.ThreadingHTTPServer((host, port), Handler)
        self.server.daemon_threads = True
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> StandinHub:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def push(self, repo: HubRepo) -> HubRepo:
        """A new commit of `repo.repo_id` on its branch; the one it replaces stays served by its sha.
        Returns the replaced commit."""
        old = self.repos[repo.repo_id]
        self.earlier.setdefault(repo.repo_id, {})[old.sha] = old
        self.repos[repo.repo_id] = repo
        return old

    # --- request handling -------------------------------------------------------------------------

    def _error(self, handler, status: int, code: str | None, message: str) -> None:
        body = json.dumps({"error": message}).encode()
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(body)))
        if code:
            handler.send_header("X-Error-Code", code)
        handler.send_header("X-Error-Message", message)
        handler.end_headers()
        if handler.command != "HEAD":
            handler.wfile.write(body)

    def _json(self, handler, payload, head: bool) -> None:
        body = json.dumps(payload).encode()
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        if not head:
            handler.wfile.write(body)

    def _repo_and_rest(self, parts: list[str]) -> tuple[HubRepo | None, list[str]]:
        if len(parts) < 2:
            return None, []
        return self.repos.get(f"{parts[0]}/{parts[1]}"), parts[2:]

    def _commit(self, repo: HubRepo, rev: str) -> tuple[HubRepo, str] | None:
        """The commit `rev` names (a branch, the current sha, or an earlier sha) and its files."""
        if rev == repo.sha or rev in repo.branches.values():
            return repo, rev
        if rev in repo.branches:
            return repo, repo.branches[rev]
        earlier = self.earlier.get(repo.repo_id, {}).get(rev)
        return (earlier, rev) if earlier is not None else None

    def _handle(self, handler, head: bool) -> None:
        url = urllib.parse.urlsplit(handler.path)
        path = urllib.parse.unquote(url.path)
        with self._lock:
            self.requests.append((handler.command, path, {k.lower(): v for k, v in handler.headers.items()}))
        if self.fail_status is not None:
            code = "RepoNotFound" if self.fail_status in (401, 404) else "ServerError"
            return self._error(handler, self.fail_status, code, f"stand-in hub answers {self.fail_status}")
        authorization = handler.headers.get("Authorization")
        if self.require_token is not None and authorization is None:
            return self._error(handler, 401, "RepoNotFound", "Invalid username or password.")
        if self.require_token is not None and authorization != f"Bearer {self.require_token}":
            # What the Hub answers a token it does not know: no error code, its reason in the header.
            return self._error(handler, 401, None, INVALID_TOKEN)
        parts = [p for p in path.split("/") if p]
        if parts[:2] == ["api", "models"]:
            repo, rest = self._repo_and_rest(parts[2:])
            if repo is None:
                return self._error(handler, 404, "RepoNotFound", "Repository not found")
            if len(rest) >= 2 and rest[0] in ("revision", "tree"):
                found = self._commit(repo, rest[1])
                if found is None:
                    return self._error(handler, 404, "RevisionNotFound", f"Invalid rev id: {rest[1]}")
                repo, sha = found
                if rest[0] == "revision":
                    siblings = [{"rfilename": p} for p in sorted(repo.files)]
                    return self._json(handler, {"id": repo.repo_id, "sha": sha, "siblings": siblings}, head)
                return self._json(handler, [self._tree_entry(f) for f in repo.files.values()], head)
            return self._error(handler, 404, "EntryNotFound", "unknown API path")
        repo, rest = self._repo_and_rest(parts)
        if repo is None:
            return self._error(handler, 404, "RepoNotFound", "Repository not found")
        if len(rest) < 3 or rest[0] != "resolve":
            return self._error(handler, 404, "EntryNotFound", "unknown path")
        found = self._commit(repo, rest[1])
        if found is None:
            return self._error(handler, 404, "RevisionNotFound", f"Invalid rev id: {rest[1]}")
        repo, sha = found
        hub_file = repo.files.get("/".join(rest[2:]))
        if hub_file is None:
            return self._error(handler, 404, "EntryNotFound", "Entry not found")
        self._send_file(handler, sha, hub_file, head)

    @staticmethod
    def _tree_entry(hub_file: HubFile) -> dict:
        entry = {"type": "file", "path": hub_file.path, "size": hub_file.size, "oid": hub_file.blob_id}
        if hub_file.sha256:
            entry["lfs"] = {"oid": hub_file.sha256, "size": hub_file.size, "pointerSize": 134}
        return entry

    def _send_file(self, handler, sha: str, hub_file: HubFile, head: bool) -> None:
        start = 0
        ranged = handler.headers.get("Range", "")
        if ranged.startswith("bytes=") and ranged[6:].split("-")[0].isdigit():
            start = min(int(ranged[6:].split("-")[0]), hub_file.size)
        handler.send_response(206 if start else 200)
        handler.send_header("Content-Type", "application/octet-stream")
        handler.send_header("Content-Length", str(hub_file.size - start))
        handler.send_header("Accept-Ranges", "bytes")
        if start:
            handler.send_header("Content-Range", f"bytes {start}-{hub_file.size - 1}/{hub_file.size}")
        handler.send_header("X-Repo-Commit", sha)
        handler.send_header("ETag", f'"{hub_file.blob_id}"')
        if hub_file.sha256:
            handler.send_header("X-Linked-Etag", f'"{hub_file.sha256}"')
            handler.send_header("X-Linked-Size", str(hub_file.size))
        handler.end_headers()
        if head:
            return
        cut = None
        with self._lock:
            if self.cut_after is not None and hub_file.sha256 and hub_file.path not in self._cut_done:
                self._cut_done.add(hub_file.path)
                cut = self.cut_after
        sent = 0
        with open(hub_file.source, "rb") as source:
            source.seek(start)
            while chunk := source.read(CHUNK):
                if cut is not None and sent + len(chunk) > cut:
                    handler.wfile.write(chunk[: max(cut - sent, 0)])
                    handler.wfile.flush()
                    handler.close_connection = True
                    handler.connection.shutdown(2)
                    return
                handler.wfile.write(chunk)
                sent += len(chunk)
                if self.rate_bps:
                    time.sleep(len(chunk) / self.rate_bps)


def main(argv: list[str] | None = None) -> int:
    """`python -m lab.standin_hub [PORT]`: serve a generated `lab/standin-qwen35` (random bytes, for the
    stand-in server) and the tiny real Qwen3.5-MoE `lab/qwen3.5-tiny-moe` (for the real vLLM) on loopback."""
    import sys
    import tempfile
    import time

    from lab.tiny_qwen35 import REPO_ID, write

    args = sys.argv[1:] if argv is None else argv
    port = int(args[0]) if args else 18090
    folder = Path(tempfile.mkdtemp(prefix="standin-hub-"))
    repos = {
        "lab/standin-qwen35": generate_repo(folder / "repo", shards=2, shard_bytes=4 << 20),
        REPO_ID: write(folder / "tiny"),
    }
    with StandinHub(repos, port=port) as hub:
        for repo_id in repos:
            print(
                f"stand-in Hub (a test double) at {hub.endpoint}: {repo_id} @ {hub.repos[repo_id].sha}",
                flush=True,
            )
        while True:
            time.sleep(3600)


if __name__ == "__main__":
    raise SystemExit(main())
