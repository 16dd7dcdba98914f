"""The HealthSecret dynamic provider: create draws the secret (`execute.ensure`); nothing else ever
changes it (`plan`), and no method touches a node."""

from __future__ import annotations

from typing import Any

import pulumi.dynamic as dynamic

from components.errors import ExplainedErrors
from components.health_secret.execute import ensure, observe, release
from components.health_secret.plan import kept_outputs, plan_change, validate


class HealthSecretProvider(ExplainedErrors, dynamic.ResourceProvider):
    """create: a new random secret; diff: never a replacement; update: the inputs, the same secret;
    read: the recorded state (nothing outside the state holds it); delete: nothing to remove."""

    # Stacks pickle this class by reference as `components.health_secret.HealthSecretProvider`: keep
    # that its path whatever file it lives in. Stacks made before the package was split from health/
    # hold `components.health.HealthSecretProvider`, which components/health re-exports.
    __module__ = "components.health_secret"

    def check(self, _olds: dict[str, Any], news: dict[str, Any]) -> dynamic.CheckResult:
        failures = [dynamic.CheckFailure(key, reason) for key, reason in validate(news)]
        return dynamic.CheckResult(news, failures)

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> dynamic.DiffResult:
        change = plan_change(olds, news)
        return dynamic.DiffResult(changes=change.changes, replaces=[], delete_before_replace=False)

    def create(self, props: dict[str, Any]) -> dynamic.CreateResult:
        # The ID names the stack, never the secret.
        return dynamic.CreateResult(id_=f"{props.get('owner')}/health-secret", outs=ensure(props))

    def update(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> dynamic.UpdateResult:
        return dynamic.UpdateResult(outs=kept_outputs(olds, news))

    def read(self, id_: str, props: dict[str, Any]) -> dynamic.ReadResult:
        return dynamic.ReadResult(id_=id_, outs=observe(props))

    def delete(self, _id: str, _props: dict[str, Any]) -> None:
        release(_props)
