"""The probe carried out: shipped to the head over SSH, its progress relayed, its report returned.
The only I/O of the package: `ensure` (create, update) and `observe` (refresh); a gate's delete
leaves nothing on the node, so there is no release."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

from components.node_programs.wire import PROBE_PROGRESS_PREFIX
from components.nodes import checked_target
from components.provider_kit.progress import tell_operator
from components.readiness_gate.errors import GateFailed
from components.readiness_gate.facts import probe_report
from components.readiness_gate.plan import failure_hint, refresh_deadline
from components.readiness_gate.programs import EXIT_HINTS, probe_argv, probe_program
from components.remote import RemoteError, lines_marked, require_ssh, run_relaying, ssh_argv

# Extra seconds beyond the probe's own deadline: SSH, plus the probe's last round of docker
# calls (ray status, node list, inspect, logs: up to 60 s each) and its log tail.
TRANSPORT_SLACK_S = 300


def _probe(
    props: Mapping[str, Any], deadline_s: float, previous: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Run the probe on the head; its report on success, RemoteError (with the log tail) if not.

    Its progress lines (the stage it waits on, at least every 30 s) reach the operator as they come.
    `previous`: what the gate last passed with (`deployed`), for the rollback hint of a failure.
    """
    target = checked_target("ReadinessGate node", props["node"])
    require_ssh(target.label)
    argv = probe_argv(props, deadline_s)
    result = run_relaying(
        target.label,
        ssh_argv(target, argv, dial_with=sys.executable),
        argv,
        probe_program(props.get("api_key")),
        deadline_s + TRANSPORT_SLACK_S,
        # Only the probe's progress lines (the stage it waits on) reach the operator as they come.
        lines_marked(
            PROBE_PROGRESS_PREFIX, lambda line: tell_operator(f"readiness on {target.label}: {line}")
        ),
    )
    if result.ok:
        return probe_report(result, target.label)
    # The probe's own message (stage, last error, 30 log lines) is the useful part: keep all of it.
    hint = failure_hint(EXIT_HINTS.get(result.returncode, ""), previous, props.get("deployed"))
    raise GateFailed(props["node"]["name"], argv, result.returncode, result.stderr, hint)


def ensure(props: Mapping[str, Any], olds: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Wait (up to `deadline_s`) until the server answers; the gate's outputs (the inputs, `ready`,
    the probe's `report`), or GateFailed. `olds`: the recorded state, whose `deployed` is what the gate
    last passed with (a failure's rollback hint)."""
    report = _probe(props, float(props["deadline_s"]), (olds or {}).get("deployed"))
    return {**props, "ready": True, "report": report}


def observe(props: Mapping[str, Any]) -> dict[str, Any] | None:
    """Probe once more (refresh: at most REFRESH_DEADLINE_S); the recorded outputs while the server
    answers, None when it no longer does."""
    try:
        _probe(props, refresh_deadline(props))
    except (RemoteError, ValueError):
        return None
    return dict(props)


def release(props: Mapping[str, Any]) -> None:
    """delete: nothing to do; a gate leaves nothing on the node."""
    return None
