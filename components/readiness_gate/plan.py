"""The gate's pure decisions: what a change is (`plan_change`), whether it probes again, and how to go
back after a failure.

No I/O here: diff() uses these, and the tests are tables.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from components.nccl import ENFORCE, nccl_problems
from components.provider_kit.change import Change
from components.provider_kit.inputs import known, node_problems
from components.readiness_gate.facts import ServingTransport

# `fabric.node_proof`'s modes, which also judge the serving ranks' transport.
TRANSPORT_MODES = ("off", "report", "enforce")
# How long `pulumi refresh` waits for a server that answered before.
REFRESH_DEADLINE_S = 60
# Inputs whose change means "probe again" (everything but the secret and the node's access details).
PROBE_KEYS = (
    "server_id",
    # Every container of the cluster: a Ray worker recreated behind a running server is a cluster
    # that has not answered since, so the gate probes again instead of still saying "ready".
    "container_ids",
    "url",
    "model",
    "expect_nodes",
    "expect_gpus",
    "expect_node_ips",
    "ray_container",
    "log_container",
)
# Inputs that decide how the serving ranks' transport is read and judged: where each node's serving
# container is, the HCAs NCCL was given and the mode (`fabric.node_proof`). A change reads the logs
# again without probing (a new server changes `container_ids`, which probes and reads).
TRANSPORT_KEYS = ("serving_logs", "nccl_fabric", "transport_mode")
# Inputs whose change is an update: what it probes, plus what only the next probe would use (a new
# API key, deadline or access details) and what it deploys (for the rollback hint).
UPDATE_KEYS = (*PROBE_KEYS, *TRANSPORT_KEYS, "api_key", "deadline_s", "node", "deployed")


def plan_change(olds: Mapping[str, Any], news: Mapping[str, Any]) -> Change:
    """From recorded state and new inputs, no I/O: an update for any changed input, never a
    replacement (in place, the update still sees what the gate last passed with)."""
    return Change(replaces=(), updates=tuple(key for key in UPDATE_KEYS if olds.get(key) != news.get(key)))


def probes_again(change: Change) -> bool:
    """Whether an update runs the probe again (what it probes changed), or only records the inputs."""
    return change.updates_any(PROBE_KEYS)


def reads_transport_again(change: Change) -> bool:
    """Whether an update that does not probe reads the serving ranks' logs again."""
    return change.updates_any(TRANSPORT_KEYS)


def kept_cold_start(old_report: Mapping[str, Any] | None, report: Mapping[str, Any]) -> dict[str, Any]:
    """The probe's report, its `cold_start` kept from `old_report` when both are one start of the
    server (same `started_at`) and the new probe did not see it from before the API was ready: a
    re-probe of a server that has long answered (a Ray worker recreated behind it) loses nothing
    its first probe measured."""
    old = (old_report or {}).get("cold_start") or {}
    new = report.get("cold_start") or {}
    same = old.get("started_at") is not None and old.get("started_at") == new.get("started_at")
    if same and new.get("first_completion_s") is None and old.get("first_completion_s") is not None:
        return {**report, "cold_start": dict(old)}
    return dict(report)


def refresh_deadline(props: Mapping[str, Any]) -> float:
    """The deadline of refresh's one probe: the gate's own, at most REFRESH_DEADLINE_S."""
    return min(REFRESH_DEADLINE_S, float(props.get("deadline_s") or REFRESH_DEADLINE_S))


def rollback_hint(previous: Mapping[str, Any] | None, current: Mapping[str, Any] | None) -> str:
    """How to go back to what the gate last passed with: each setting that changed since, as the
    exact config line (empty when nothing it knows changed, or it never passed before)."""
    previous, current = previous or {}, current or {}
    lines = [
        f"{previous['lines'][key]} (now {current.get(key)})"
        for key in ("image", "revision")
        if previous.get(key)
        and previous.get(key) != current.get(key)
        and (previous.get("lines") or {}).get(key)
    ]
    if not lines:
        return ""
    return (
        "to go back to what served before, set "
        + "; ".join(lines)
        + " in the stack config and run `pulumi up` (the previous image is still on every node)"
    )


def failure_hint(
    exit_hint: str, previous: Mapping[str, Any] | None, current: Mapping[str, Any] | None
) -> str:
    """What a failed probe tells the operator: what its exit status means, then how to go back."""
    return "; ".join(hint for hint in (exit_hint, rollback_hint(previous, current)) if hint)


def validate(props: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(field, reason) for each input `check` refuses: no I/O; a value not known yet passes."""
    problems = node_problems(props, "node")
    logs = props.get("serving_logs")
    if known(logs):
        if not isinstance(logs, Mapping):
            return [*problems, ("serving_logs", "give node name -> {node, container}")]
        for name, where in logs.items():
            container = where.get("container") if isinstance(where, Mapping) else None
            if not known(container) or not container:
                problems.append((f"serving_logs.{name}", "name the node's serving container (`container`)"))
                continue
            problems += [(f"serving_logs.{name}.{k}", why) for k, why in node_problems(where, "node")]
    mode = props.get("transport_mode")
    if known(mode) and mode not in TRANSPORT_MODES:
        modes = ", ".join(TRANSPORT_MODES)
        problems.append(("transport_mode", f"one of {modes} (fabric.node_proof), not {mode!r}"))
    return problems


def serving_verdict(
    node: str, mode: str, transport: ServingTransport, ib_hca: Sequence[str]
) -> tuple[dict[str, Any], str | None]:
    """(what is recorded for `node`, the refusal under enforce or None). Refused: the serving ranks'
    NCCL used sockets while HCAs were given, naming the node and quoting NCCL's line. Ranks without
    NCCL (gloo, the CPU build) are recorded as such, never refused."""
    record = transport.record()
    if not transport.nccl.lines:
        return {**record, "verdict": "pass", "problems": []}, None
    problems, warnings = nccl_problems(node, transport.nccl, ib_hca)
    record = {**record, "verdict": "fail" if problems else "pass", "problems": problems + warnings}
    if mode != ENFORCE or not problems:
        return record, None
    return record, (
        f"serving ranks on {node}: NCCL would not use the fabric's RDMA:\n"
        + "\n".join(f"  - {p}" for p in problems)
        + "\n  (fabric.node_proof: enforce stops here; `report` records this and goes on)"
    )
