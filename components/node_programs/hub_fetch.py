"""Fetch one revision of a Hub repo into the standard cache layout, on the head; one JSON report.

Runs on the head under a Python that has `huggingface_hub` (the deployment image's, in a short-lived
container, or one the stack names): `python3 -c <this file> '<json args>'`. The token, when there is
one, arrives as the first line of stdin and is exported as `HF_TOKEN` for the client: it is never an
argument, and no message printed here contains it. `HF_ENDPOINT` in the environment is honoured.

Args: `hub` (the cache's hub dir), `repo`, `revision`, `allow`, `ignore` (pattern lists or null),
`resolve_only` (only resolve the revision to its commit now: what refresh shows),
`progress` (a progress file to keep up to date, or null), `attempts` (download calls; files that
completed stay, so a cut download continues where it stopped).

Report: `{"revision": <commit sha>, "snapshot_path": …}` or `{"error": …, "kind": …}`, kinds:
`not_found` (repo missing, or private and the token does not open it: 401/404), `token` (the Hub
refused the token itself: 401/403 with its reason), `revision` (no such revision), `network`, `other`.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import socket
import sys
import threading
import time
from enum import IntEnum

from components.node_programs.wire import PROGRESS_MARKER


class Exit(IntEnum):
    OK = 0
    BAD_INPUT = 2
    FETCH = 6  # the Hub client failed: the report names the kind of failure


TOKEN_SETTING = "qwen35-spark:hf_token"  # named in messages; the token itself never is
# A stderr line every second while downloading: `PROGRESS_MARKER <bytes done> <bytes total>`. The
# orchestrator relays it to the operator during `pulumi up`, and its silence is a stall.


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
    """The fetch's progress: bytes under the repo's blobs dir sampled every second, said on stderr
    (`PROGRESS_MARKER`) and kept in the progress file when there is one, in the transfer layer's
    format (`components/node_programs/transfer_source.py`); the file is removed at the end."""

    def __init__(self, path: str | None, operation: str, node: str, blobs_dir: str):
        self.path, self.blobs_dir = path, blobs_dir
        self.stop = threading.Event()
        self.base = blob_bytes(blobs_dir)
        started = time.time()
        self.doc = {
            "operation": operation,
            "node": node,
            "peer": "",
            "stage": "fetch",
            "bytes_done": 0,
            "bytes_total": 0,
            "rate_bps": 0,
            "eta_s": None,
            "started_at": round(started, 3),
            "updated_at": round(started, 3),
            "pid": os.getpid(),
        }

    def sample(self) -> dict:
        done = max(blob_bytes(self.blobs_dir) - self.base, 0)
        now = time.time()
        elapsed = now - self.doc["started_at"]
        rate = done / elapsed if elapsed > 0 else 0.0
        total = self.doc["bytes_total"]
        eta = (total - done) / rate if rate > 0 and total > done else (0 if total and done >= total else None)
        self.doc.update(
            bytes_done=done,
            rate_bps=int(rate),
            eta_s=None if eta is None else round(eta, 1),
            updated_at=round(now, 3),
        )
        return dict(self.doc)

    def say(self, sample: dict) -> None:
        sys.stderr.write(f"{PROGRESS_MARKER} {sample['bytes_done']} {sample['bytes_total']}\n")
        sys.stderr.flush()

    def run(self) -> None:
        while not self.stop.wait(1.0):
            sample = self.sample()
            self.say(sample)
            if self.path:
                with contextlib.suppress(OSError):
                    write_progress(self.path, sample)

    def __enter__(self) -> Progress:
        if self.path:
            with contextlib.suppress(OSError):
                write_progress(self.path, self.sample())
        threading.Thread(target=self.run, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.say(self.sample())  # the last count, however short the download was
        if self.path:
            with contextlib.suppress(OSError):
                os.unlink(self.path)


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


def _status(exc: Exception) -> object:
    return getattr(getattr(exc, "response", None), "status_code", "?")


def _hub_reason(exc: Exception) -> str:
    """The Hub's own explanation of an error (its X-Error-Message or error body): first line, short."""
    lines = str(getattr(exc, "server_message", None) or "").strip().splitlines()
    return lines[0][:200] if lines else ""


def network_errors() -> tuple[type[BaseException], ...]:
    """No answer from the Hub: refused, reset, timed out, no such host, and the same from whichever
    HTTP client this huggingface_hub uses (httpx's are not OSError: they were a traceback)."""
    found: list[type[BaseException]] = [ConnectionError, TimeoutError, socket.gaierror]
    for module in ("httpx2", "httpx", "requests"):  # huggingface_hub 2.x, 1.x, 0.x
        try:
            client = importlib.import_module(module)
        except ImportError:
            continue
        for name in ("TransportError", "ConnectionError", "Timeout"):
            error = getattr(client, name, None)
            if isinstance(error, type) and issubclass(error, BaseException):
                found.append(error)
    return tuple(found)


def unreachable(where: str, exc: BaseException) -> dict:
    from huggingface_hub import constants

    return {
        "error": f"{where}: the Hub at {constants.ENDPOINT} did not answer ({exc.__class__.__name__}: "
        f"{exc}); check the head's network (or HF_ENDPOINT), then run pulumi up again",
        "kind": "network",
    }


def download(
    args: dict, sha: str, token: str | None, attempts: int, network: tuple
) -> tuple[str | None, Exception | None]:
    """(the snapshot's path, None), or (None, the last error) when every attempt was cut off: each
    after the first continues where the last stopped (completed files stay), at the resolved commit."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.utils import (
        GatedRepoError,
        HfHubHTTPError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    last: Exception | None = None
    for attempt in range(attempts):
        try:
            path = snapshot_download(
                str(args["repo"]),
                revision=str(args["revision"]) if attempt == 0 else sha,
                cache_dir=os.path.expanduser(str(args["hub"])),
                allow_patterns=args.get("allow") or None,
                ignore_patterns=args.get("ignore") or None,
                token=token or None,
            )
            return path, None
        except (RepositoryNotFoundError, RevisionNotFoundError, GatedRepoError):
            raise
        except (HfHubHTTPError, OSError, *network) as exc:
            last = exc  # a cut connection: completed files stay; the next call continues
            time.sleep(min(2**attempt, 10))
    return None, last


def fetch(args: dict, token: str | None) -> dict:
    from huggingface_hub import HfApi
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
    network = network_errors()
    try:
        # Resolved once: the commit every node will hold and serve, whatever the branch does later.
        info = HfApi(token=token or None).model_info(repo, revision=revision, files_metadata=False)
        sha = info.sha
        if args.get("resolve_only"):  # refresh: where the branch points now; nothing is downloaded
            return {"revision": sha}
        operation = "fetch-" + repo.replace("/", "--")
        blobs = os.path.join(repo_dir, "blobs")
        with Progress(args.get("progress"), operation, str(args.get("node") or ""), blobs) as progress:
            progress.doc["bytes_total"] = _total_bytes(HfApi(token=token or None), repo, sha, args)
            path, last = download(args, sha, token, attempts, network)
        if path is None:
            return {"error": f"{where}: download failed after {attempts} attempts: {last}", "kind": "network"}
        return {"revision": sha, "snapshot_path": path, "repo_dir": repo_dir}
    except RevisionNotFoundError:
        return {"error": f"{where}: the Hub has no such revision (branch, tag or commit)", "kind": "revision"}
    except (RepositoryNotFoundError, GatedRepoError) as exc:
        status = _status(exc)
        access = "not accessible with the configured token" if token else "private and no token is configured"
        return {
            "error": f"{where}: not found, or {access} (HTTP {status}); "
            f"check the repo id, and for a private or gated repo set {TOKEN_SETTING}",
            "kind": "not_found",
        }
    except HfHubHTTPError as exc:
        status, reason = _status(exc), _hub_reason(exc)
        if status in (401, 403):  # the Hub refused the token itself (unknown, expired, or too weak)
            return {
                "error": f"{where}: the Hub refused the configured token "
                f"(HTTP {status}: {reason or 'no reason given'}); set a valid read token of an account "
                f"that may read {repo}: pulumi config set --secret {TOKEN_SETTING} hf_…",
                "kind": "token",
            }
        return {
            "error": f"{where}: the Hub answered HTTP {status}" + (f": {reason}" if reason else ""),
            "kind": "other",
        }
    except network as exc:
        return unreachable(where, exc)
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
        return Exit.BAD_INPUT
    text = scrub(json.dumps(report, sort_keys=True), token)
    print(text)
    return Exit.FETCH if "error" in report else Exit.OK


if __name__ == "__main__":
    sys.exit(main(sys.argv))
