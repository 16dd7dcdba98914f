"""What a node needs of a checkpoint: pure functions of the source's manifest and a node's inventory.

No I/O here: `execute.py` runs the node programs, `facts.py` parses their reports, these functions
decide, and the tests are tables.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from components.checkpoint.errors import CheckpointError
from components.node_programs.hf_checkpoint import files_digest
from components.nodes import same_node
from components.provider_kit.change import Change
from components.provider_kit.inputs import node_problems

GIB = 1 << 30
# Inputs whose change means another checkpoint on that node (a new resource).
REPLACE_KEYS = ("repo", "requested_revision", "source_mode", "cache_dir", "manifest_digest")
# Inputs whose change is an update in place. How a node is reached may change (a new address, a jump
# host); only another node (`nodes.same_node`) is another checkpoint, a replacement whose old copy,
# when not kept, is removed from the old node.
UPDATE_KEYS = ("node", "source", "refresh", "reserve", "tuning", "keep", "fetch", "allow", "ignore")
OUTPUT_KEYS = (
    "upstream_revision",
    "revision",
    "files",
    "bytes",
    "bytes_sent",
    "files_sent",
    "digest",
    "snapshot_path",
    "manifest",
    "refs",
    "problems",
    "seconds",
)


@dataclass(frozen=True)
class Manifest:
    """One revision of a repo as the source holds it: `(path, blob, size)` per file, and its refs."""

    repo: str
    revision: str
    files: tuple[tuple[str, str, int], ...]
    refs: tuple[tuple[str, str], ...] = ()

    @property
    def digest(self) -> str:
        return files_digest([list(f) for f in self.files])

    @property
    def bytes(self) -> int:
        return sum(size for _path, _blob, size in self.files)

    @property
    def blob_sizes(self) -> dict[str, int]:
        return {blob: size for _path, blob, size in self.files}

    def as_state(self) -> list[list[Any]]:
        return [list(f) for f in self.files]

    @classmethod
    def from_state(cls, repo: str, revision: str, files: Sequence[Sequence[Any]], refs: Mapping[str, str]):
        return cls(
            repo, revision, tuple((str(p), str(b), int(s)) for p, b, s in files), tuple(sorted(refs.items()))
        )


def manifest_from_inventory(repo: str, revision: str, report: Mapping[str, Any], node: str) -> Manifest:
    """The source's manifest from its inventory (no `expect`); an incomplete snapshot is an error."""
    sha = report.get("revision")
    if not sha or report.get("missing_snapshot") or not report.get("files"):
        raise CheckpointError(
            f"{node}: {repo} revision {revision} is not in its cache under {report.get('root')}; "
            "next: fetch it there (model.source: hub) or download it by hand with the Hub client"
        )
    broken = [path for path, blob, size in report["files"] if not blob or size < 0]
    if broken:
        raise CheckpointError(
            f"{node}: {repo}@{sha}: snapshot entries without a blob behind them: {', '.join(broken[:5])}; "
            "next: re-download them on that node (the Hub client repairs its cache), then run again"
        )
    refs = {revision: sha} if revision != sha else {}
    return Manifest(repo, sha, tuple((p, b, int(s)) for p, b, s in report["files"]), tuple(refs.items()))


@dataclass(frozen=True)
class CopyPlan:
    """What to send to one node: the blobs it lacks (or holds damaged), and whether links need work."""

    blobs: tuple[str, ...]
    bytes: int
    relink: bool

    @property
    def nothing_to_do(self) -> bool:
        return not self.blobs and not self.relink


def plan_copy(manifest: Manifest, report: Mapping[str, Any]) -> CopyPlan:
    """From a node's inventory against the manifest: send only what is missing or damaged."""
    blob_states: Mapping[str, str] = report.get("blobs") or {}
    sizes = manifest.blob_sizes
    send = tuple(sorted(blob for blob in sizes if blob_states.get(blob) != "ok"))
    file_states: Mapping[str, str] = report.get("status") or {}
    relink = any(file_states.get(path) != "ok" for path, _b, _s in manifest.files) or bool(
        manifest.refs and report.get("revision") != manifest.revision
    )
    return CopyPlan(send, sum(sizes[b] for b in send), relink)


def check_space(node: str, plan: CopyPlan, report: Mapping[str, Any], reserve: int) -> None:
    """Refuse before any byte moves when the node's cache filesystem cannot take the missing bytes."""
    free = int(report.get("free_bytes") or 0)
    need = plan.bytes + reserve
    if plan.bytes and free < need:
        raise CheckpointError(
            f"{node}: not enough disk in {report.get('fs_path')}: {free / GIB:.2f} GiB free, the checkpoint "
            f"needs {need / GIB:.2f} GiB ({plan.bytes / GIB:.2f} GiB of missing files + "
            f"{reserve / GIB:.2f} GiB reserve); nothing was sent; next: free space there, "
            "or lower model.disk_reserve_bytes if you know better"
        )


def problems(manifest: Manifest, report: Mapping[str, Any]) -> dict[str, str]:
    """`path -> state` for every file of the manifest a node does not hold intact."""
    states: Mapping[str, str] = report.get("status") or {}
    return {path: states.get(path, "missing") for path, _b, _s in manifest.files if states.get(path) != "ok"}


def plan_change(olds: Mapping[str, Any], news: Mapping[str, Any]) -> Change:
    """From recorded state and new inputs, no I/O: replace, update in place, or leave alone. A refresh
    that found missing or damaged files (`problems`) is an update: `up` sends them again."""
    replaces = [key for key in REPLACE_KEYS if olds.get(key) != news.get(key)]
    if not same_node(olds.get("node"), news.get("node")):
        replaces.append("node")
    updates = [key for key in UPDATE_KEYS if olds.get(key) != news.get(key) and key not in replaces]
    if olds.get("problems"):
        updates.append("problems")
    return Change(tuple(replaces), tuple(updates))


def validate(props: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(field, reason) for each input `check` refuses: no I/O; a value not known yet passes."""
    return node_problems(props, "node")
