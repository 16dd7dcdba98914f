"""The HealthSecret dynamic provider: create draws the secret (`execute.ensure`); nothing else ever
changes it (`plan`), and no method touches a node."""

from __future__ import annotations

from typing import Any

import pulumi.dynamic as dynamic

from components.health_secret.execute import ensure
from components.health_secret.plan import kept_outputs, plan_change, validate
from components.provider_kit.provider_base import NodeResourceProvider, Verbs


class HealthSecretProvider(NodeResourceProvider):
    """create: a new random secret; diff: never a replacement; update: the inputs, the same secret;
    read: the recorded state (nothing outside the state holds it); delete: nothing to remove."""

    # Stacks pickle this class by reference as `components.health_secret.HealthSecretProvider`: keep
    # that its path whatever file it lives in. Stacks made before the package was split from health/
    # hold `components.health.HealthSecretProvider`, which components/health re-exports.
    __module__ = "components.health_secret"
    verbs = Verbs(
        validate,
        plan_change,
        ensure,
        # The ID names the stack, never the secret.
        resource_id=lambda props, _outs: f"{props.get('owner')}/health-secret",
    )

    # Not `ensure`: an update never draws a new secret.
    def update(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> dynamic.UpdateResult:
        return dynamic.UpdateResult(outs=kept_outputs(olds, news))
