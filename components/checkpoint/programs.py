"""The node programs of the checkpoint (components/node_programs/) as argument lists and reports.

Each program travels in its command line (`python3 -c <source> …`), so stdin stays free for a stream
or a secret; its one-line JSON report comes back on stdout.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from components.checkpoint.plan import CheckpointError
from components.node_programs import hf_checkpoint, program_argv

# What a receive's exit status means (declared once, in the node program).
RECEIVE_EXITS = {
    hf_checkpoint.Exit.BAD_INPUT: "bad input to the receiving program",
    hf_checkpoint.Exit.STREAM: "the stream ended early or was malformed (the link was cut?)",
    hf_checkpoint.Exit.VERIFY: "a received file did not match its hash or size",
    hf_checkpoint.Exit.IO: "the destination's disk refused a write",
}


def repo_dir_name(repo: str) -> str:
    """`models--ORG--NAME`: the Hub client's folder for a model repo in its cache."""
    return "models--" + repo.replace("/", "--")


def hub_dir(cache_dir: str) -> str:
    """The Hub cache inside an HF_HOME-style cache dir (what containers mount as HF_HOME)."""
    return cache_dir.rstrip("/") + "/hub"


def _argv(python: str, program: str, *args: str) -> list[str]:
    # Stdlib programs run isolated (-I -S); the Hub client is the one that needs site packages.
    return program_argv(program, list(args), python, isolated=program != "hub_fetch")


def inventory_argv(
    python: str,
    cache_dir: str,
    repo: str,
    revision: str,
    expect: Sequence[Sequence[Any]] | None = None,
    full: bool = False,
) -> list[str]:
    args = {
        "hub": hub_dir(cache_dir),
        "repo_dir": repo_dir_name(repo),
        "revision": revision,
        "expect": [list(f) for f in expect] if expect is not None else None,
        "hash": full,
    }
    return _argv(python, "hf_checkpoint", "inventory", json.dumps(args, sort_keys=True))


def send_argv(python: str, cache_dir: str, repo: str, blobs: Sequence[str]) -> list[str]:
    args = {"hub": hub_dir(cache_dir), "repo_dir": repo_dir_name(repo), "blobs": list(blobs)}
    return _argv(python, "hf_checkpoint", "send", json.dumps(args, sort_keys=True))


def receive_argv(
    python: str,
    cache_dir: str,
    repo: str,
    revision: str,
    files: Sequence[Sequence[Any]],
    refs: dict[str, str],
    owner: tuple[int, int] | None,
) -> list[str]:
    args = {
        "hub": hub_dir(cache_dir),
        "repo_dir": repo_dir_name(repo),
        "revision": revision,
        "files": [list(f) for f in files],
        "refs": dict(refs),
        "owner": list(owner) if owner else None,
    }
    return _argv(python, "hf_checkpoint", "receive", json.dumps(args, sort_keys=True))


def remove_argv(python: str, cache_dir: str, repo: str, revision: str) -> list[str]:
    args = {"hub": hub_dir(cache_dir), "repo_dir": repo_dir_name(repo), "revision": revision}
    return _argv(python, "hf_checkpoint", "remove", json.dumps(args, sort_keys=True))


def fetch_argv(
    python: str,
    cache_dir: str,
    repo: str,
    revision: str,
    allow: Sequence[str],
    ignore: Sequence[str],
    progress: str | None,
    resolve_only: bool = False,
) -> list[str]:
    args = {
        "hub": hub_dir(cache_dir),
        "repo": repo,
        "revision": revision,
        "allow": list(allow) or None,
        "ignore": list(ignore) or None,
        "progress": progress,
        "attempts": 3,
        "resolve_only": resolve_only,
    }
    return _argv(python, "hub_fetch", json.dumps(args, sort_keys=True))


def parse_report(text: str) -> dict[str, Any] | None:
    """The program's JSON report: the last line of its stdout that parses as an object."""
    for line in reversed(text.strip().splitlines()):
        try:
            report = json.loads(line)
        except ValueError:
            continue
        if isinstance(report, dict):
            return report
    return None


def head_fetch_argv(
    props: Mapping[str, Any], owner: tuple[int, int] | None, resolve_only: bool = False
) -> list[str]:
    """The fetch on the head: a Python that has the Hub client, or a short-lived container of the image."""
    fetch = props.get("fetch") or {}
    cache_dir = props["cache_dir"]
    endpoint = fetch.get("endpoint")
    progress = fetch.get("progress")
    if fetch.get("python"):
        program = fetch_argv(
            fetch["python"], cache_dir, props["repo"], props["requested_revision"], props.get("allow") or [],
            props.get("ignore") or [], None if resolve_only else progress, resolve_only,
        )  # fmt: skip
        return (["env", f"HF_ENDPOINT={endpoint}"] if endpoint else []) + program
    image = fetch.get("image")
    if not image:
        raise CheckpointError(
            "Checkpoint fetch: neither a Python (model.fetch_python) nor an image to run the Hub client"
        )
    hub = hub_dir(cache_dir)
    argv = ["docker", "run", "--rm", "-i", "--network", "host", "--entrypoint", "python3"]
    argv += ["-v", f"{hub}:{hub}", "-e", "HF_HOME=/tmp/qwen35-hf-home", "-e", "HF_HUB_DISABLE_TELEMETRY=1"]
    if owner:
        argv += ["--user", f"{owner[0]}:{owner[1]}"]
    if progress:
        folder = progress.rsplit("/", 1)[0]
        argv += ["-v", f"{folder}:{folder}"]
    if endpoint:
        argv += ["-e", f"HF_ENDPOINT={endpoint}"]
    program = fetch_argv(
        "python3", cache_dir, props["repo"], props["requested_revision"], props.get("allow") or [],
        props.get("ignore") or [], None if resolve_only else progress, resolve_only,
    )  # fmt: skip
    return [*argv, image, *program[1:]]
