"""ReadinessGate: a dynamic resource whose create waits until the cluster answers a real request.

The provider ships `components/node_programs/readiness.py` to the head over SSH (`python3 -`, program
on stdin) and runs it there, so the probe sees the server the way a client on the head does. Dynamic
providers' create never runs during preview. `read` (pulumi refresh) probes once more with a short
deadline and reports the gate gone when the server no longer answers, so refresh shows that drift.

Its one fact is the probe's report (Ray's nodes and GPUs, the model, the completion's tokens), read
by running the probe itself: there is no facts.py.

Files, by job:
    plan.py      the pure decisions: which input changes probe again, the rollback hint of a failure
    programs.py  the probe program as the head runs it (its argv, its source with the API key), its
                 report and what its exit status means
    execute.py   the probe carried out over SSH, its progress lines relayed to the operator
    errors.py    GateFailed: the probe ran and said no
    provider.py  the dynamic provider (diff: no I/O)
    resource.py  the ReadinessGate resource (type qwen35:ReadinessGate)
Code run on the head: components/node_programs/readiness.py.

Keep `ReadinessGateProvider` importable here under this name, with no import-time side effects: stacks
pickle it by reference to this module.
"""

from components.readiness_gate.errors import GateFailed
from components.readiness_gate.execute import TRANSPORT_SLACK_S, run_probe, run_relaying
from components.readiness_gate.plan import PROBE_KEYS, REFRESH_DEADLINE_S, rollback_hint
from components.readiness_gate.programs import probe_argv, probe_program
from components.readiness_gate.provider import ReadinessGateProvider
from components.readiness_gate.resource import ReadinessGate

__all__ = [
    "PROBE_KEYS",
    "REFRESH_DEADLINE_S",
    "TRANSPORT_SLACK_S",
    "GateFailed",
    "ReadinessGate",
    "ReadinessGateProvider",
    "probe_argv",
    "probe_program",
    "rollback_hint",
    "run_probe",
    "run_relaying",
]
