"""The ReadinessGate dynamic provider: create/update/read run the probe (`execute`); diff never
touches a node (`plan` compares inputs with recorded state)."""

from __future__ import annotations

from typing import Any

import pulumi.dynamic as dynamic

from components.errors import ExplainedErrors
from components.readiness_gate.execute import run_probe
from components.readiness_gate.plan import has_changes, probes_again, refresh_deadline
from components.remote import RemoteError


class ReadinessGateProvider(ExplainedErrors, dynamic.ResourceProvider):
    """create: wait until ready (deadline from config); read: probe once more; delete: nothing."""

    # Existing stacks pickled this class as `components.readiness_gate.ReadinessGateProvider` (by
    # reference): keep that its path whatever file it lives in.
    __module__ = "components.readiness_gate"

    def create(self, props: dict[str, Any]) -> dynamic.CreateResult:
        report = run_probe(props, float(props["deadline_s"]))
        outs = {**props, "ready": True, "report": report}
        return dynamic.CreateResult(id_=f"{props['node']['name']}-{props['server_id']}"[:120], outs=outs)

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> dynamic.DiffResult:
        # In place (update), so the probe still knows what the gate last passed with (olds) and a
        # failure can say how to go back.
        return dynamic.DiffResult(changes=has_changes(olds, news), replaces=[])

    def update(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> dynamic.UpdateResult:
        if not probes_again(olds, news):
            return dynamic.UpdateResult(outs={**olds, **news})
        # A failed probe leaves the state as it was: `deployed` stays what last served.
        report = run_probe(news, float(news["deadline_s"]), previous=olds.get("deployed"))
        return dynamic.UpdateResult(outs={**news, "ready": True, "report": report})

    def read(self, id_: str, props: dict[str, Any]) -> dynamic.ReadResult:
        try:
            run_probe(props, refresh_deadline(props))
        except (RemoteError, ValueError):
            # Not serving any more: report the gate gone, so refresh shows it and `up` probes again.
            return dynamic.ReadResult(id_="", outs={})
        return dynamic.ReadResult(id_=id_, outs=props)

    def delete(self, _id: str, _props: dict[str, Any]) -> None:
        # A gate leaves nothing on the node.
        return None
