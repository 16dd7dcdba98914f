"""The ReadinessGate dynamic provider: create/update/read run the probe (`execute.ensure`,
`execute.observe`); diff never touches a node (`plan.plan_change` compares inputs with recorded
state)."""

from __future__ import annotations

from typing import Any

import pulumi.dynamic as dynamic

from components.errors import ExplainedErrors
from components.readiness_gate.execute import ensure, observe, release, serving_transports
from components.readiness_gate.plan import (
    kept_cold_start,
    plan_change,
    probes_again,
    reads_transport_again,
    validate,
)


class ReadinessGateProvider(ExplainedErrors, dynamic.ResourceProvider):
    """create: wait until ready (deadline from config); read: probe once more; delete: nothing."""

    # Existing stacks pickled this class as `components.readiness_gate.ReadinessGateProvider` (by
    # reference): keep that its path whatever file it lives in.
    __module__ = "components.readiness_gate"

    def check(self, _olds: dict[str, Any], news: dict[str, Any]) -> dynamic.CheckResult:
        failures = [dynamic.CheckFailure(key, reason) for key, reason in validate(news)]
        return dynamic.CheckResult(news, failures)

    def create(self, props: dict[str, Any]) -> dynamic.CreateResult:
        outs = ensure(props)
        return dynamic.CreateResult(id_=f"{props['node']['name']}-{props['server_id']}"[:120], outs=outs)

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> dynamic.DiffResult:
        # In place (update), so the probe still knows what the gate last passed with (olds) and a
        # failure can say how to go back.
        return dynamic.DiffResult(changes=plan_change(olds, news).changes, replaces=[])

    def update(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> dynamic.UpdateResult:
        change = plan_change(olds, news)
        if not probes_again(change):
            outs = {**olds, **news}
            if reads_transport_again(change):
                # The mode, the HCAs given or where the ranks run changed, the server did not: read
                # and judge the ranks' logs again, no probe.
                outs["serving_transport"] = serving_transports(news)
            return dynamic.UpdateResult(outs=outs)
        # A failed probe leaves the state as it was: `deployed` stays what last served.
        outs = ensure(news, olds)
        return dynamic.UpdateResult(
            outs={**outs, "report": kept_cold_start(olds.get("report"), outs["report"])}
        )

    def read(self, id_: str, props: dict[str, Any]) -> dynamic.ReadResult:
        if observe(props) is None:
            # Not serving any more: report the gate gone, so refresh shows it and `up` probes again.
            return dynamic.ReadResult(id_="", outs={})
        return dynamic.ReadResult(id_=id_, outs=props)

    def delete(self, _id: str, _props: dict[str, Any]) -> None:
        release(_props)
