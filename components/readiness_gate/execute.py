"""The probe carried out: shipped to the head over SSH, its progress relayed, its report returned.
The only I/O of the package: `ensure` (create, update) and `observe` (refresh); a gate's delete
leaves nothing on the node, so there is no release."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from components.node_programs.wire import PROBE_PROGRESS_PREFIX
from components.nodes import NodeDictError, checked_target, transport_to
from components.provider_kit.progress import tell_operator
from components.readiness_gate.errors import GateFailed, ServingTransportRefused
from components.readiness_gate.facts import probe_report, serving_transport
from components.readiness_gate.plan import failure_hint, refresh_deadline, serving_verdict
from components.readiness_gate.programs import EXIT_HINTS, probe_argv, probe_program
from components.remote import RemoteError, lines_marked, require_ssh, run_relaying, ssh_argv, stderr_tail

# Extra seconds beyond the probe's own deadline: SSH, plus the probe's last round of docker
# calls (ray status, node list, inspect, logs: up to 60 s each) and its log tail.
TRANSPORT_SLACK_S = 300
# The serving ranks log their NCCL INIT/NET lines (and vLLM its torch backend) once, at their start;
# the gate reads them right after it, so the last lines of the log hold them.
SERVING_LOG_TAIL = 20000
# One node's `docker logs` over SSH, connecting included.
SERVING_LOG_READ_S = 60


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


def _read_serving_log(name: str, where: Mapping[str, Any]) -> str:
    """The last SERVING_LOG_TAIL lines of `name`'s serving container (stdout and stderr), or
    RemoteError / NodeDictError naming the node."""
    transport = transport_to(f"ReadinessGate serving_logs.{name}.node", where.get("node"))
    argv = ["docker", "logs", "--tail", str(SERVING_LOG_TAIL), str(where["container"])]
    result = transport.run(argv, timeout=SERVING_LOG_READ_S)
    if not result.ok:
        raise RemoteError(name, argv, result.returncode, result.stderr, "is the serving container running?")
    return result.stdout.decode(errors="replace") + "\n" + result.stderr.decode(errors="replace")


def _unread(exc: Exception) -> dict[str, Any]:
    reason = stderr_tail(str(exc), lines=2).strip().replace("\n", " ")
    return {
        "backend": None,
        "network": None,
        "hcas": [],
        "gid_index": {},
        "said": f"log not read ({reason})",
        "verdict": "unknown",
        "problems": [],
    }


def serving_transports(props: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """What each node's serving ranks logged about their transport (`serving_logs`: node -> its node
    dict and serving container), judged against the HCAs NCCL was given (`nccl_fabric`); all read at
    once, each within SERVING_LOG_READ_S. A log that cannot be read is recorded as such (the server
    answered: that is not a refusal). Under `transport_mode: enforce`, ServingTransportRefused when a
    node's ranks used sockets while HCAs were given."""
    where = dict(props.get("serving_logs") or {})
    if not where:
        return {}
    fabric = props.get("nccl_fabric") or {}
    mode = str(props.get("transport_mode") or "report")
    with ThreadPoolExecutor(max_workers=min(8, len(where))) as pool:
        logs = {name: pool.submit(_read_serving_log, name, spec) for name, spec in sorted(where.items())}
    records: dict[str, dict[str, Any]] = {}
    refusals = []
    for name, future in logs.items():
        try:
            text = future.result()
        except (RemoteError, NodeDictError) as exc:
            records[name] = _unread(exc)
            continue
        hcas = list((fabric.get(name) or {}).get("ib_hca") or [])
        records[name], refusal = serving_verdict(name, mode, serving_transport(text), hcas)
        if refusal:
            refusals.append(refusal)
    if refusals:
        raise ServingTransportRefused("\n".join(refusals))
    return records


def ensure(props: Mapping[str, Any], olds: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Wait (up to `deadline_s`) until the server answers; the gate's outputs (the inputs, `ready`,
    the probe's `report`, what the serving ranks logged about their transport), or GateFailed /
    ServingTransportRefused. `olds`: the recorded state, whose `deployed` is what the gate last
    passed with (a failure's rollback hint)."""
    report = _probe(props, float(props["deadline_s"]), (olds or {}).get("deployed"))
    return {**props, "ready": True, "report": report, "serving_transport": serving_transports(props)}


def observe(props: Mapping[str, Any]) -> dict[str, Any] | None:
    """Probe once more (refresh: at most REFRESH_DEADLINE_S); the recorded outputs while the server
    answers, None when it no longer does."""
    try:
        _probe(props, refresh_deadline(props))
    except (RemoteError, ValueError):
        return None
    return dict(props)
