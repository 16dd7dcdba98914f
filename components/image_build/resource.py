"""The ImageBuild resource as the Pulumi program declares it (type `qwen35:ImageBuild`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pulumi
import pulumi.dynamic as dynamic

from components.image_build.plan import OUTPUT_KEYS
from components.image_build.programs import context_digest as digest_of
from components.image_build.provider import ImageBuildProvider


class ImageBuild(dynamic.Resource, module="qwen35", name="ImageBuild"):
    """`ref` built on the head's Docker from `context` (this machine's folder), never pushed.

    `content_addressed`: the tag is a hash of every input (a tag already there is that image).
    `context_rules`: `.dockerignore` rules after the context's own (what the build sends and hashes);
    `context_digest`: their digest when the caller made it already.
    `sources`: the build args that name images the build follows (the base, the donor): their IDs on
    the head are recorded and read back, so one rebuilt under its reference builds this again."""

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
        sources: tuple[str, ...] = (),
        context_rules: Sequence[str] = (),
        context_digest: str | None = None,
        opts: pulumi.ResourceOptions | None = None,
    ):
        props = {
            "node": dict(node),
            "ref": ref,
            "context": str(Path(context).resolve()),
            "context_digest": context_digest or digest_of(Path(context), context_rules),
            "context_rules": list(context_rules),
            "dockerfile": dockerfile,
            "platform": platform,
            "build_args": dict(build_args),
            "network": network,
            "content_addressed": content_addressed,
            "sources": list(sources),
            **{key: None for key in OUTPUT_KEYS},
        }
        super().__init__(ImageBuildProvider(), name, props, opts)
