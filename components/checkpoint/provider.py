"""The Checkpoint dynamic provider: create/read/update/delete carry out `execute` and read `facts`;
diff and check never touch a node (`plan.plan_change` compares inputs with recorded state).

Keep `CheckpointProvider` in this module under this name, with no import-time side effects: stacks
pickle it by reference to `components.checkpoint.provider`.
"""

from __future__ import annotations

from typing import Any

import pulumi.dynamic as dynamic

from components.checkpoint.execute import ensure, remove
from components.checkpoint.facts import inventory, upstream_revision
from components.checkpoint.plan import Manifest, plan_change, problems
from components.errors import ExplainedErrors


class CheckpointProvider(ExplainedErrors, dynamic.ResourceProvider):
    """CRUD for Checkpoint; every method but diff/check talks to nodes over SSH."""

    def create(self, props: dict[str, Any]) -> dynamic.CreateResult:
        outs = ensure(props)
        return dynamic.CreateResult(
            id_=f"{outs['node'].get('name')}:{outs['repo']}@{outs['revision']}", outs=outs
        )

    def read(self, id_: str, props: dict[str, Any]) -> dynamic.ReadResult:
        manifest = Manifest.from_state(
            props["repo"], props["revision"], props["manifest"], props.get("refs") or {}
        )
        report = inventory(props, manifest, props.get("refresh") == "full")
        if not report.get("exists"):
            return dynamic.ReadResult("", {})
        # `digest` stays the recorded one (other nodes' inputs follow it); what is wrong shows here.
        outs = {**props, "problems": problems(manifest, report)}
        if not props.get("source") and props.get("source_mode", "hub") == "hub":
            outs["upstream_revision"] = upstream_revision(props)
        return dynamic.ReadResult(id_, outs)

    def diff(self, id_: str, olds: dict[str, Any], news: dict[str, Any]) -> dynamic.DiffResult:
        change = plan_change(olds, news)
        return dynamic.DiffResult(
            changes=change.changes, replaces=list(change.replaces), delete_before_replace=False
        )

    def update(self, id_: str, olds: dict[str, Any], news: dict[str, Any]) -> dynamic.UpdateResult:
        # A node that held everything at the last refresh most likely still does: its source's
        # session is opened only once the inventory shows something missing. (Another manifest is a
        # replacement, never an update.)
        return dynamic.UpdateResult(outs=ensure(news, copy_likely=bool(olds.get("problems"))))

    def delete(self, id_: str, props: dict[str, Any]) -> None:
        remove(props)
