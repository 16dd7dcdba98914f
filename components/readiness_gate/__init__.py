"""ReadinessGate: a dynamic resource whose create waits until the cluster answers a real request.

The provider ships `components/node_programs/readiness.py` to the head over SSH (`python3 -`, program
on stdin) and runs it there, so the probe sees the server the way a client on the head does. Dynamic
providers' create never runs during preview. `read` (pulumi refresh) probes once more with a short
deadline and reports the gate gone when the server no longer answers, so refresh shows that drift.

Files, by job:
    facts.py     the probe's report parsed (Ray's nodes and GPUs, the model, the completion's tokens)
    programs.py  the probe program as the head runs it (its argv, its source with the API key) and
                 what its exit status means
    plan.py      the pure decisions: `plan_change`, which changes probe again, the rollback hint
    execute.py   the probe carried out over SSH (the only I/O): ensure (create, update), observe
                 (refresh), its progress lines relayed to the operator
    errors.py    GateFailed: the probe ran and said no
    provider.py  the dynamic provider (diff: no I/O)
    resource.py  the ReadinessGate resource (type qwen35:ReadinessGate)
Code run on the head: components/node_programs/readiness.py.

Keep `ReadinessGateProvider` importable here under this name, with no import-time side effects: stacks
pickle it by reference to this module.
"""

from components.provider_kit.lazy import lazy_exports
from components.readiness_gate.errors import GateFailed
from components.readiness_gate.execute import TRANSPORT_SLACK_S, ensure, observe
from components.readiness_gate.facts import probe_report
from components.readiness_gate.plan import (
    PROBE_KEYS,
    REFRESH_DEADLINE_S,
    plan_change,
    probes_again,
    rollback_hint,
)
from components.readiness_gate.programs import probe_argv, probe_program

# Loaded on first use: these modules import Pulumi (components/provider_kit/lazy.py).
__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "ReadinessGate": ".resource",
        "ReadinessGateProvider": ".provider",
    },
)

__all__ = [
    "PROBE_KEYS",
    "REFRESH_DEADLINE_S",
    "TRANSPORT_SLACK_S",
    "GateFailed",
    "ReadinessGate",
    "ReadinessGateProvider",
    "ensure",
    "observe",
    "plan_change",
    "probe_argv",
    "probe_program",
    "probe_report",
    "probes_again",
    "rollback_hint",
]
