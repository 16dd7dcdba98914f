"""Health: the watchdog on the head, which probes the server and recovers a hung or crashed one, and
an agent on every other node, its hands there. Here they are pure container specs and their config
(`containers`); the programs are `components/node_programs/watchdog.py` and `health_agent.py`, their
shared constants `health_wire`.

HealthSecret: the per-stack secret the watchdog signs its requests to the agents with (a dynamic
resource: create draws `secrets.token_hex(32)`, nothing else changes it, no method touches a node).

Files, by job:
    containers.py  the containers' specs, their config JSON and each node's memory need (pure)
    plan.py        HealthSecret's pure decisions: validate, plan_change -> Change, the kept secret
    execute.py     ensure: create's outputs, with the secret drawn (no node touched)
    errors.py      SecretMissing: the recorded state holds no secret to keep
    provider.py    the dynamic provider (no node touched)
    resource.py    the HealthSecret resource (type qwen35:HealthSecret)

Keep `HealthSecretProvider` importable here under this name, with no import-time side effects:
stacks pickle it by reference to this module.
"""

from components.health.errors import SecretMissing
from components.health.execute import ensure
from components.health.plan import SECRET_KEY, UPDATE_KEYS, is_secret, kept_outputs, plan_change, validate
from components.health.provider import HealthSecretProvider
from components.health.resource import HealthSecret

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
