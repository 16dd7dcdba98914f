"""The checkpoint on every node: fetched once on the head, copied along the image's fan-out tree."""

from __future__ import annotations

from typing import Any

import pulumi

from components.checkpoint.resource import Checkpoint
from components.config import StackConfig
from components.containers import host_path
from components.layout import node_cache_dir
from components.node_programs.wire import PROGRESS_DIR
from components.nodes import NodeAccess
from components.provider_kit.fan_out_tree import fan_out_tree


def checkpoint_tree(
    name: str,
    config: StackConfig,
    access: dict[str, NodeAccess],
    opts: pulumi.ResourceOptions,
    hf_token: pulumi.Input[str] | None = None,
    fetch_image: pulumi.Input[str] | None = None,
) -> dict[str, Checkpoint]:
    """One Checkpoint per node; the head's fetches, every other copies from its source in the tree.

    N workers take ceil(log2(N+1)) rounds: every node that holds the checkpoint serves the next.
    """
    repo = config.hub_repo
    if repo is None:
        return {}
    model = config.model
    head = config.head.name
    common: dict[str, Any] = {
        "repo": repo,
        "revision": model.revision,
        "source_mode": model.source,
        "allow": model.allow_patterns,
        "ignore": model.ignore_patterns,
        "refresh": model.refresh,
        "keep": model.keep_on_destroy,
        "reserve": model.disk_reserve_bytes,
        "tuning": config.copy_.tuning(),
    }
    head_user = config.node_user(config.head)
    fetch = {
        "python": model.fetch_python,
        "image": model.fetch_image or fetch_image,
        "endpoint": model.endpoint,
        "progress": host_path(f"{PROGRESS_DIR}/fetch-{repo.replace('/', '--')}.json", head_user),
    }
    placed: dict[str, Checkpoint] = {
        head: Checkpoint(
            f"{name}-{head}",
            node=access[head].node_dict(),
            cache_dir=node_cache_dir(config, head),
            fetch=fetch,
            hf_token=hf_token if model.source == "hub" else None,
            opts=opts,
            **common,
        )
    }
    workers = [n.name for n in config.workers]
    for round_ in fan_out_tree(head, workers):
        for source, destination in round_:
            placed[destination] = Checkpoint(
                f"{name}-{destination}",
                node=access[destination].node_dict(),
                cache_dir=node_cache_dir(config, destination),
                source=access[source].node_dict(),
                source_cache_dir=node_cache_dir(config, source),
                source_checkpoint=placed[source],
                opts=pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(depends_on=[placed[source]])),
                **common,
            )
    return placed
