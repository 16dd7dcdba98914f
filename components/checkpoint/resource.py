"""Checkpoint: "this revision of this Hub repo is in node X's cache, intact" (a Pulumi dynamic resource,
type `qwen35:Checkpoint`).

On the head (no `source`): create() fetches the revision once from the Hub (or adopts what the head's
cache already holds), resolves it to a commit, and records the manifest. On every other node:
create() takes the manifest of its source node (an input: the source's own Checkpoint output),
inventories the node, checks free space for what is missing plus a reserve, and streams only the
missing or damaged files source → destination, verified while received. read() checks presence and
size of every file (every byte with `refresh: full`); diff() makes no I/O; delete() keeps the files
unless told otherwise.
"""

from __future__ import annotations

from typing import Any

import pulumi
import pulumi.dynamic as dynamic

from components.checkpoint.plan import OUTPUT_KEYS
from components.checkpoint.provider import CheckpointProvider


class Checkpoint(dynamic.Resource, module="qwen35", name="Checkpoint"):
    """One node's copy of the checkpoint.

    Outputs: revision, files, bytes, bytes_sent, digest, snapshot_path (and manifest, refs, problems).
    """

    revision: pulumi.Output[str]
    files: pulumi.Output[int]
    bytes: pulumi.Output[int]
    bytes_sent: pulumi.Output[int]
    digest: pulumi.Output[str]
    snapshot_path: pulumi.Output[str]
    manifest: pulumi.Output[list]
    refs: pulumi.Output[dict]

    def __init__(
        self,
        name: str,
        *,
        node: dict,
        repo: str,
        revision: str,
        cache_dir: str,
        source: dict | None = None,
        source_cache_dir: str | None = None,
        source_checkpoint: Checkpoint | None = None,
        source_mode: str = "hub",
        allow: list[str] | None = None,
        ignore: list[str] | None = None,
        refresh: str = "sizes",
        keep: bool = True,
        reserve: int = 0,
        fetch: dict | None = None,
        tuning: dict | None = None,
        hf_token: pulumi.Input[str] | None = None,
        opts: pulumi.ResourceOptions | None = None,
    ):
        props: dict[str, Any] = {
            "node": node,
            "repo": repo,
            # As configured (a branch, tag or commit); the `revision` output is the commit it resolved to.
            "requested_revision": revision,
            "cache_dir": cache_dir,
            "source": source,
            "source_cache_dir": source_cache_dir,
            "source_mode": source_mode,
            "allow": list(allow or []),
            "ignore": list(ignore or []),
            "refresh": refresh,
            "keep": keep,
            "reserve": reserve,
            "fetch": fetch or {},
            "tuning": tuning or {},
            "hf_token": pulumi.Output.secret(hf_token) if hf_token is not None else None,
            "python": "python3",
            # The source's checkpoint, as recorded: a new revision there reaches this node by replacement.
            "source_revision": source_checkpoint.revision if source_checkpoint else None,
            "source_manifest": source_checkpoint.manifest if source_checkpoint else None,
            "source_refs": source_checkpoint.refs if source_checkpoint else None,
            "manifest_digest": source_checkpoint.digest if source_checkpoint else None,
        }
        props.update({key: None for key in OUTPUT_KEYS if key not in props})
        super().__init__(
            CheckpointProvider(),
            name,
            props,
            pulumi.ResourceOptions.merge(
                opts, pulumi.ResourceOptions(additional_secret_outputs=["hf_token"])
            ),
        )
