"""The HealthSecret resource as the Pulumi program declares it (type `qwen35:HealthSecret`)."""

from __future__ import annotations

import pulumi
import pulumi.dynamic as dynamic

from components.health.plan import SECRET_KEY
from components.health.provider import HealthSecretProvider


class HealthSecret(dynamic.Resource, module="qwen35", name="HealthSecret"):
    """The per-stack secret the watchdog signs its requests to the agents with: drawn once by create,
    a Pulumi secret in the state, never in a plain output."""

    secret: pulumi.Output[str]

    def __init__(self, name: str, *, owner: str, prefix: str, opts: pulumi.ResourceOptions | None = None):
        props = {"owner": owner, "prefix": prefix, SECRET_KEY: None}
        opts = pulumi.ResourceOptions.merge(
            opts, pulumi.ResourceOptions(additional_secret_outputs=[SECRET_KEY])
        )
        super().__init__(HealthSecretProvider(), name, props, opts)
