"""HealthSecret: the per-stack secret the watchdog signs its requests to the agents with, and which
keys the mp world's PyTorch rendezvous (a dynamic resource: create draws `secrets.token_hex(32)`,
nothing else changes it, no method touches a node). Its stored type stays `qwen35:HealthSecret`.

Files, by job:
    plan.py        the pure decisions: validate, plan_change -> Change, the kept secret
    execute.py     ensure: create's outputs, with the secret drawn (no node touched)
    errors.py      SecretMissing: the recorded state holds no secret to keep
    provider.py    the dynamic provider (no node touched)
    resource.py    the HealthSecret resource (type qwen35:HealthSecret)

Keep `HealthSecretProvider` importable here under this name, with no import-time side effects:
stacks pickle it by reference to this module (and, made before this package, to components.health).
"""

from components.health_secret.errors import SecretMissing
from components.health_secret.execute import ensure
from components.health_secret.plan import (
    SECRET_KEY,
    UPDATE_KEYS,
    is_secret,
    kept_outputs,
    plan_change,
    validate,
)
from components.provider_kit.lazy import lazy_exports

# Loaded on first use: these modules import Pulumi (components/provider_kit/lazy.py).
__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "HealthSecret": ".resource",
        "HealthSecretProvider": ".provider",
    },
)

__all__ = [
    "SECRET_KEY",
    "UPDATE_KEYS",
    "HealthSecret",
    "HealthSecretProvider",
    "SecretMissing",
    "ensure",
    "is_secret",
    "kept_outputs",
    "plan_change",
    "validate",
]
