"""The ImageBuild dynamic provider: create/update/read carry out `execute` on the head; check and
diff never touch a node (`plan` compares inputs with recorded state)."""

from __future__ import annotations

from components.image_build.execute import ensure, observe
from components.image_build.plan import build_id, plan_change, validate
from components.provider_kit.provider_base import NodeResourceProvider, Verbs


class ImageBuildProvider(NodeResourceProvider):
    """create: build (or keep a content tag already there); read: where the tag points (a tag gone or
    moved stays this resource, its image ID recorded: `up` re-tags or rebuilds); update: restore a
    drifted tag (re-tag, or build again); delete: nothing on the head."""

    # Stacks pickle this class by reference as `components.image_build.ImageBuildProvider`: keep that
    # its path whatever file it lives in.
    __module__ = "components.image_build"
    verbs = Verbs(
        validate,
        plan_change,
        ensure,
        resource_id=lambda props, _outs: build_id(props),
        observe=observe,
    )
