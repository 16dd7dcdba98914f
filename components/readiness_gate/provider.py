"""The ReadinessGate dynamic provider: create/update/read run the probe (`execute.ensure`,
`execute.observe`); diff never touches a node (`plan.plan_change` compares inputs with recorded
state)."""

from __future__ import annotations

from typing import Any

import pulumi.dynamic as dynamic

from components.provider_kit.provider_base import NodeResourceProvider, Verbs
from components.readiness_gate.execute import ensure, observe, serving_transports
from components.readiness_gate.plan import (
    kept_cold_start,
    plan_change,
    probes_again,
    reads_transport_again,
    validate,
)


class ReadinessGateProvider(NodeResourceProvider):
    """create: wait until ready (deadline from config); read: probe once more (not serving any more:
    the gate gone, so refresh shows it and `up` probes again); delete: nothing."""

    # Existing stacks pickled this class as `components.readiness_gate.ReadinessGateProvider` (by
    # reference): keep that its path whatever file it lives in.
    __module__ = "components.readiness_gate"
    verbs = Verbs(
        validate,
        plan_change,
        ensure,
        resource_id=lambda props, _outs: f"{props['node']['name']}-{props['server_id']}"[:120],
        observe=observe,
    )

    # Not always `ensure`: only a change to what it probes probes again, and the cold start is kept.
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
