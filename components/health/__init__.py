"""Health: the watchdog on the head, which probes the server and recovers a hung or crashed one, and
an agent on every other node, its hands there. Here they are pure container specs and their config
(`containers.py`: the containers' specs, their config JSON and each node's memory need); the
programs are `components/node_programs/watchdog.py` (its parts in `watchdog_*.py`) and
`health_agent.py`, their shared constants `health_wire`. The secret the watchdog signs with is
`components/health_secret`.

`HealthSecretProvider` stays importable here, a leftover: stacks made before the secret had a package
of its own (before 2026-12-06, fba3e1e) pickled it by reference as
`components.health.HealthSecretProvider`. Remove it, with its entries in `EARLIER_PICKLE_PATHS`
(tests/unit/test_house.py) and `EARLIER` (test_lazy_exports.py), once every stack made before that
date has been destroyed or updated by `pulumi up` since.
"""

from components.provider_kit.lazy import lazy_exports

# Loaded on first use: the provider imports Pulumi, and `status` reads this package's containers.
__getattr__, __dir__ = lazy_exports(__name__, {"HealthSecretProvider": "components.health_secret"})

__all__ = ["HealthSecretProvider"]
