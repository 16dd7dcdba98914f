"""The ImageBuild resource as the Pulumi program declares it (type `qwen35:ImageBuild`)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pulumi
import pulumi.dynamic as dynamic

from components.image_build.plan import OUTPUT_KEYS
from components.image_build.programs import context_digest
from components.image_build.provider import ImageBuildProvider


class ImageBuild(dynamic.Resource, module="qwen35", name="ImageBuild"):
    """`ref` built on the head's Docker from `context` (this machine's folder), never pushed.

    `content_addressed`: the tag is a hash of every input (a tag already there is that image)."""

    image_id: pulumi.Output[str]
    ref: pulumi.Output[str]
    built: pulumi.Output[bool]

    def __init__(
        self,
        name: str,
        *,
        node: Mapping[str, Any],
        ref: str,
        context: Path,
        dockerfile: str,
        platform: str,
        build_args: Mapping[str, str],
        network: str | None = None,
        content_addressed: bool = True,
        opts: pulumi.ResourceOptions | None = None,
    ):
        props = {
            "node": dict(node),
            "ref": ref,
            "context": str(Path(context).resolve()),
            "context_digest": context_digest(Path(context)),
            "dockerfile": dockerfile,
            "platform": platform,
            "build_args": dict(build_args),
            "network": network,
            "content_addressed": content_addressed,
            **{key: None for key in OUTPUT_KEYS},
        }
        super().__init__(ImageBuildProvider(), name, props, opts)
