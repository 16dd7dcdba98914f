"""The image stages: the build on the head (none for strategy prebuilt), then one NodeImage per node,
copied along a fan-out tree from the head.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pulumi

from components.config import ImageStrategy
from components.image_build.component import BuiltImage, BuiltImageArgs
from components.node_image import NodeImage, copy_tree

if TYPE_CHECKING:
    from components.deployment.component import Qwen35Deployment


def image_build(name: str, deployment: Qwen35Deployment) -> BuiltImage | None:
    """The image built on the head; None for strategy prebuilt (the reference is there already)."""
    image = deployment.config.image
    if image.strategy is ImageStrategy.PREBUILT:
        return None
    head = deployment.access[deployment.config.head.name].node_dict()
    # Built by the head's own Docker over the project's SSH transport (not a docker provider).
    return BuiltImage(
        f"{name}-image",
        BuiltImageArgs(image=image, node=head),
        opts=pulumi.ResourceOptions(parent=deployment),
    )


def place_images(
    name: str, deployment: Qwen35Deployment, ref: str, build: BuiltImage | None
) -> dict[str, NodeImage]:
    """One NodeImage per node, copied along a fan-out tree from the head (where the image is)."""
    return copy_tree(
        f"{name}-image",
        ref,
        deployment.access,
        deployment.config.head.name,
        # Every node's claim first: a stack refused on any node copies nothing to any node.
        opts=pulumi.ResourceOptions(
            parent=deployment, depends_on=[*deployment.claims.values(), *([build] if build else [])]
        ),
        # The built image's ID: a rebuild under the same tag (a pinned `image.tag`, or a drifted tag
        # built again) re-places the image everywhere; an identical one changes nothing downstream.
        # A prebuilt image re-tagged on the head shows at refresh (NodeImage reads the head's ID).
        trigger=build.image_id if build else None,
        tuning=deployment.config.copy_.tuning() or None,
        # Only classic-store nodes serve others (a containerd store may lack layer blobs).
        can_reexport={n.name for n in deployment.config.nodes if n.image_store == "classic"},
        keep_previous=deployment.config.image.keep_previous,
    )
