"""The ImageBuild dynamic provider: create/update/read carry out `execute` on the head; check and
diff never touch a node (`plan` compares inputs with recorded state)."""

from __future__ import annotations

from typing import Any

import pulumi.dynamic as dynamic

from components.errors import ExplainedErrors
from components.image_build.execute import ensure, observe, release
from components.image_build.plan import build_id, plan_change, validate


class ImageBuildProvider(ExplainedErrors, dynamic.ResourceProvider):
    """create: build (or keep a content tag already there); read: where the tag points; update:
    restore a drifted tag (re-tag, or build again); delete: nothing on the head."""

    # Stacks pickle this class by reference as `components.image_build.ImageBuildProvider`: keep that
    # its path whatever file it lives in.
    __module__ = "components.image_build"

    def check(self, _olds: dict[str, Any], news: dict[str, Any]) -> dynamic.CheckResult:
        failures = [dynamic.CheckFailure(key, reason) for key, reason in validate(news)]
        return dynamic.CheckResult(news, failures)

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> dynamic.DiffResult:
        change = plan_change(olds, news)
        # Replacement creates first: the new image is tagged before the old resource goes (and its
        # delete leaves the head alone), so what runs keeps its image throughout.
        return dynamic.DiffResult(
            changes=change.changes, replaces=list(change.replaces), delete_before_replace=False
        )

    def create(self, props: dict[str, Any]) -> dynamic.CreateResult:
        return dynamic.CreateResult(id_=build_id(props), outs=ensure(props))

    def update(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> dynamic.UpdateResult:
        return dynamic.UpdateResult(outs=ensure(news, olds))

    def read(self, id_: str, props: dict[str, Any]) -> dynamic.ReadResult:
        # A tag gone or moved stays this resource (its image ID recorded): `up` re-tags or rebuilds.
        return dynamic.ReadResult(id_=id_, outs=observe(props))

    def delete(self, _id: str, _props: dict[str, Any]) -> None:
        release(_props)
