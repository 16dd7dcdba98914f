"""BuiltImage: the deployment image built on the head's Docker from a base and a donor image.

Two strategies share it (`image.strategy`): `hybrid` puts the donor's Qwen3.5 code into the base's
older vLLM (patches/Dockerfile); `graft` keeps the donor's complete vLLM and carries the base's
cluster layer onto it: Ray at the base's version and its system NCCL (patches/Dockerfile.graft).
The class was HybridImage; it keeps that type token (`qwen35:index:HybridImage`) and its resource
names, so existing stacks' builds are not replaced.
The tag is a hash of everything that goes into the build, so changed inputs rebuild (and replace
what depends on the image) while unchanged inputs never do. Its child is the project's own
`ImageBuild` (this package's resource.py), which replaced `pulumi_docker.Image` (docs/image-build.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pulumi

from components.config import ImageConfig, ImageStrategy
from components.image_build.programs import context_digest, context_rules
from components.image_build.resource import ImageBuild

# The reference every node holds, and the build's inputs it hashes, are the layout's (`status` reads
# them there, without Pulumi); the graph's readers keep importing them here too.
from components.layout import PATCH_DIR, build_args, built_ref
from components.layout import content_tag as content_tag
from components.layout import image_ref as image_ref

# The Dockerfile of each built strategy, in the build context.
DOCKERFILES = {ImageStrategy.HYBRID: "Dockerfile", ImageStrategy.GRAFT: "Dockerfile.graft"}
# The build args naming the images a build starts from: the build follows their IDs on the head, so
# `vllm-node:latest` rebuilt with a new NCCL rebuilds this image at the next `up --refresh`.
SOURCE_ARGS = ("BASE_IMAGE", "DONOR_IMAGE")


def dockerfile(image: ImageConfig) -> str:
    """The Dockerfile (in the context) that builds this strategy's image."""
    if image.strategy not in DOCKERFILES:
        raise ValueError(f"image.strategy {image.strategy.value!r} builds nothing (the image is used as is)")
    return DOCKERFILES[image.strategy]


@dataclass(frozen=True)
class BuiltImageArgs:
    """The image section, the head's node dict (`NodeAccess.node_dict()`), the build context."""

    image: ImageConfig
    node: Mapping[str, Any]
    context: Path = PATCH_DIR


class BuiltImage(pulumi.ComponentResource):
    """Builds the hybrid or graft image on the head node's Docker (never pushed; no build in preview);
    `image_id` is the built image's ID."""

    def __init__(self, name: str, args: BuiltImageArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("qwen35:index:HybridImage", name, None, opts)
        cfg = args.image
        bargs = build_args(cfg)
        # The context read once per run, a file at a time: its digest makes the tag and is the build's input.
        rules = context_rules(bargs)
        digest = context_digest(args.context, rules)
        self.ref = built_ref(cfg, args.context, digest)
        self.tag = self.ref.rpartition(":")[2]
        # Named as the pulumi_docker.Image child was: a stack built with that one sees it deleted
        # (which does nothing on the head) and this one created (docs/image-build.md).
        self.image = ImageBuild(
            f"{name}-build",
            node=args.node,
            ref=self.ref,
            context=args.context,
            dockerfile=dockerfile(cfg),
            platform=cfg.platform,
            build_args=bargs,
            network=cfg.build_network,
            content_addressed=not cfg.tag,
            sources=SOURCE_ARGS,
            context_rules=rules,
            context_digest=digest,
            opts=pulumi.ResourceOptions(parent=self),
        )
        self.image_id = self.image.image_id
        self.image_name = pulumi.Output.from_input(cfg.name)
        self.register_outputs(
            {"image_name": cfg.name, "tag": self.tag, "ref": self.ref, "strategy": cfg.strategy.value}
        )
