"""The HealthSecret resource as the Pulumi program declares it (type `qwen35:HealthSecret`)."""

from __future__ import annotations

import pulumi
import pulumi.dynamic as dynamic

from components.health_secret.plan import PLACEHOLDER, SECRET_KEY
from components.health_secret.provider import HealthSecretProvider


class HealthSecret(dynamic.Resource, module="qwen35", name="HealthSecret"):
    """The per-stack secret the watchdog signs its requests to the agents with: drawn once by create,
    a Pulumi secret in the state, never in a plain output."""

    secret: pulumi.Output[str]

    def __init__(self, name: str, *, owner: str, prefix: str, opts: pulumi.ResourceOptions | None = None):
        # The input of the same name is a secret (of nothing): the dynamic provider accepts no secrets,
        # so the engine marks each output secret whose input was, as the provider returns it, before
        # any event shows it. additional_secret_outputs alone left it plain in `up --json`'s events
        # (tests/engine/test_stacks.py found it there).
        props = {"owner": owner, "prefix": prefix, SECRET_KEY: pulumi.Output.secret(PLACEHOLDER)}
        opts = pulumi.ResourceOptions.merge(
            opts, pulumi.ResourceOptions(additional_secret_outputs=[SECRET_KEY])
        )
        super().__init__(HealthSecretProvider(), name, props, opts)
