"""Fetch one revision of a Hub repo into the standard cache layout, on the head; one JSON report.

Runs on the head under a Python that has `huggingface_hub` (the deployment image's, in a short-lived
container, or one the stack names): `python3 -c <this file> '<json args>'`. The token, when there is
one, arrives as the first line of stdin and is exported as `HF_TOKEN` for the client: it is never an
argument, and no message printed here contains it. `HF_ENDPOINT` in the environment is honoured.

Args: `hub` (the cache's hub dir), `repo`, `revision`, `allow`, `ignore` (pattern lists or null),
`progress` (a progress file to keep up to date, or null), `attempts` (download calls; files that
completed stay, so a cut download continues where it stopped).

Report: `{"revision": <commit sha>, "snapshot_path": …}` or `{"error": …, "kind": …}`, kinds:
`not_found` (repo missing, private or the token refused: 401/404), `revision` (no such revision),
`network`, `other`.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time

EXIT_OK = 0
EXIT_BAD_INPUT = 2
EXIT_FETCH = 6


def scrub(text: str, secret: str | None) -> str:
    return text.replace(secret, "***") if secret else text


def write_progress(path: str, record: dict) -> None:
    """The progress file format the copies use: one JSON object, replaced atomically."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    temporary = f"{path}.{os.getpid()}.tmp"
    with open(temporary, "w") as handle:
        json.dump(record, handle)
    os.replace(temporary, path)


def blob_bytes(blobs_dir: str) -> int:
    total = 0
    try:
        names = os.listdir(blobs_dir)
    except OSError:
        return 0
    for name in names:
        with contextlib.suppress(OSError):
            total += os.stat(os.path.join(blobs_dir, name)).st_size
    return total


class Progress:
    """Samples the bytes under the repo's blobs dir every second into the progress file."""

    def __init__(self, path: str | None, operation: str, blobs_dir: str):
        self.path, self.operation, self.blobs_dir = path, operation, blobs_dir
        self.total = 0
        self.stop = threading.Event()
        self.started = time.time()
        self.base = blob_bytes(blobs_dir)

    def record(self, phase: str) -> dict:
        done = max(blob_bytes(self.blobs_dir) - self.base, 0)
        elapsed = max(time.time() - self.started, 1e-6)
        rate = done / elapsed
        left = max(self.total - done, 0) if self.total else None
        return {
            "operation": self.operation,
            "phase": phase,
            "bytes_done": done,
            "bytes_total": self.total or None,
            "rate_bytes_per_s": round(rate),
            "eta_s": round(left / rate) if left is not None and rate > 0 else None,
            "started": self.started,
            "updated": time.time(),
        }

    def run(self) -> None:
        while not self.stop.wait(1.0):
            write_progress(self.path, self.record("fetch"))

    def __enter__(self) -> Progress:
        if self.path:
            threading.Thread(target=self.run, daemon=True).start()
        return self

    def __exit__(self, exc_type, *rest) -> None:
        self.stop.set()
        if self.path:
            write_progress(self.path, self.record("failed" if exc_type else "done"))


def _total_bytes(api, repo: str, sha: str, args: dict) -> int:
    """Bytes the download will bring (for the ETA), from the tree with the same patterns."""
    from huggingface_hub.utils import filter_repo_objects

    files = [f for f in api.list_repo_tree(repo, revision=sha, recursive=True) if hasattr(f, "size")]
    kept = filter_repo_objects(
        files,
        allow_patterns=args.get("allow") or None,
        ignore_patterns=args.get("ignore") or None,
        key=lambda f: f.path,
    )
    return sum(int(f.size or 0) for f in kept)


def fetch(args: dict, token: str | None) -> dict:
    from huggingface_hub import HfApi, snapshot_download
    from huggingface_hub.utils import (
        GatedRepoError,
        HfHubHTTPError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    repo, revision, hub = str(args["repo"]), str(args["revision"]), os.path.expanduser(str(args["hub"]))
    where = f"repo {repo} revision {revision}"
    attempts = int(args.get("attempts") or 3)
    repo_dir = os.path.join(hub, "models--" + repo.replace("/", "--"))
    try:
        # Resolved once: the commit every node will hold and serve, whatever the branch does later.
        info = HfApi(token=token or None).model_info(repo, revision=revision, files_metadata=False)
        sha = info.sha
        with Progress(args.get("progress"), f"fetch {repo}", os.path.join(repo_dir, "blobs")) as progress:
            progress.total = _total_bytes(HfApi(token=token or None), repo, sha, args)
            last: Exception | None = None
            for attempt in range(attempts):
                try:
                    path = snapshot_download(
                        repo,
                        revision=revision if attempt == 0 else sha,
                        cache_dir=hub,
                        allow_patterns=args.get("allow") or None,
                        ignore_patterns=args.get("ignore") or None,
                        token=token or None,
                    )
                    break
                except (RepositoryNotFoundError, RevisionNotFoundError, GatedRepoError):
                    raise
                except (HfHubHTTPError, OSError) as exc:
                    last = exc  # a cut connection: completed files stay; the next call continues
                    time.sleep(min(2**attempt, 10))
            else:
                return {
                    "error": f"{where}: download failed after {attempts} attempts: {last}",
                    "kind": "network",
                }
        return {"revision": sha, "snapshot_path": path, "repo_dir": repo_dir}
    except RevisionNotFoundError:
        return {"error": f"{where}: the Hub has no such revision (branch, tag or commit)", "kind": "revision"}
    except (RepositoryNotFoundError, GatedRepoError) as exc:
        status = getattr(getattr(exc, "response", None), "status_code", "?")
        return {
            "error": f"{where}: not found, or not accessible with the configured token (HTTP {status}); "
            "check the repo id, and for a private or gated repo set qwen35-spark:hf_token",
            "kind": "not_found",
        }
    except HfHubHTTPError as exc:
        status = getattr(getattr(exc, "response", None), "status_code", "?")
        return {"error": f"{where}: the Hub answered HTTP {status}", "kind": "other"}
    except OSError as exc:
        return {"error": f"{where}: {exc.__class__.__name__}: {exc}", "kind": "network"}


def main(argv: list[str]) -> int:
    token = None
    if not sys.stdin.isatty():
        token = sys.stdin.readline().strip() or None
    if token:
        os.environ["HF_TOKEN"] = token
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    try:
        args = json.loads(argv[1])
        report = fetch(args, token)
    except ImportError as exc:
        report = {"error": f"huggingface_hub is not importable by {sys.executable}: {exc}", "kind": "other"}
    except (IndexError, KeyError, TypeError, ValueError) as exc:
        print(json.dumps({"error": f"bad arguments: {exc!r}", "kind": "other"}))
        return EXIT_BAD_INPUT
    text = scrub(json.dumps(report, sort_keys=True), token)
    print(text)
    return EXIT_FETCH if "error" in report else EXIT_OK


if __name__ == "__main__":
    sys.exit(main(sys.argv))
