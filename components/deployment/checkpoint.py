"""The checkpoint stage: the model's files on every node, fetched on the head and copied along a
fan-out tree (none when `serve.model` is a path and `model.repo` unset).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pulumi

from components.checkpoint import Checkpoint, checkpoint_tree

if TYPE_CHECKING:
    from components.deployment.component import Qwen35Deployment


def place_checkpoints(
    name: str, deployment: Qwen35Deployment, hf_token: pulumi.Output[str] | None
) -> dict[str, Checkpoint]:
    """The checkpoint on every node (none when `serve.model` is a path and `model.repo` unset).

    Without `model.fetch_python` the head fetches in a short-lived container of the deployment's
    image (it has the Hub client), so the fetch waits for that image on the head.
    """
    cfg = deployment.config
    if cfg.hub_repo is None:
        return {}
    head_image = deployment.node_images[cfg.head.name]
    needs_image = cfg.model.source == "hub" and not cfg.model.fetch_python and not cfg.model.fetch_image
    return checkpoint_tree(
        f"{name}-checkpoint",
        cfg,
        deployment.access,
        opts=pulumi.ResourceOptions(
            parent=deployment,
            depends_on=[*deployment.claims.values(), *([head_image] if needs_image else [])],
        ),
        hf_token=hf_token,
        fetch_image=head_image.image_id if needs_image else None,
    )
