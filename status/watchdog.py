"""The `watchdog` row: the head's watchdog as its /state answers (its verdict, the restart budget, a
memory hold, the memory guard's trips, a fault its diagnosis named), each with the next step."""

from __future__ import annotations

from typing import Any

from components.config import CheckMode, StackConfig
from components.health.containers import watchdog_container_name
from components.node_programs.gpu_memory import COUNTED, DROP_CACHES
from components.node_programs.health_wire import gb
from status.problem import Problem, first_line, timestamp


def judge_watchdog(config: StackConfig, cluster: dict, head_report: dict) -> list[Problem]:
    """The `watchdog` line from the head's watchdog /state, with the next step for each verdict."""
    if config.health.mode is CheckMode.OFF:
        cluster["watchdog"] = "off (health.mode off: nothing watches the server after `up`)"
        return []
    head, name = config.head.name, watchdog_container_name(config)
    fact = head_report.get("watchdog")
    if not head_report.get("reachable") or fact is None:
        cluster["watchdog"] = "not checked (head unreachable or its Docker down)"
        return []
    container = (head_report.get("containers") or {}).get(name) or {"present": False}
    if not container.get("present"):
        # The head's containers already say it is missing, and that `pulumi up --refresh` creates it.
        cluster["watchdog"] = "not deployed; next: `pulumi up` declares it after the readiness gate"
        return []
    if container.get("state") != "running":
        cluster["watchdog"] = f"not running (container {container.get('state')}); next: see {name} above"
        return []
    if fact.get("error"):
        cluster["watchdog"] = f"no answer: {first_line(fact['error'])}"
        return [
            Problem(
                head,
                f"the watchdog runs but does not answer /state: {first_line(fact['error'])}",
                f"read `docker logs {name}` on {head}; health.port and health.metrics_host must be this "
                "node's own",
            )
        ]
    state = fact.get("state") or {}
    # An agent whose clock is beyond the signature window refuses every request: the watchdog names it.
    skewed = [
        Problem("cluster", str(said), "synchronise the nodes' clocks (chrony or systemd-timesyncd)")
        for said in state.get("clock_skew") or []
    ]
    now = head_report.get("now")
    problems = _watchdog_state(config, cluster, state, now) + skewed + _guard_trips(config, state, now)
    fault = (state.get("last_diagnosis") or {}).get("fault") or {}
    if fault.get("says") and state.get("state") in ("recovering", "budget_spent", "memory_held", "failing"):
        # A memory or GPU fault, not a plain crash: the diagnosis read Docker's OOMKilled and the kernel.
        cluster["watchdog"] += f"; {fault.get('kind')} fault"
        problems.append(
            Problem(
                "cluster",
                f"the watchdog's last diagnosis names a {fault.get('kind')} fault: {fault['says']}",
                _FAULT_NEXT.get(str(fault.get("kind")), "read the watchdog's /state `last_diagnosis`"),
            )
        )
    return problems


_FAULT_NEXT = {
    "memory": "unified memory ran out: lower serve.gpu_memory_utilization or serve.max_num_seqs, or find "
    "what else holds memory on that node (`free -g`, `ps aux --sort=-rss | head`)",
    "gpu": "a GPU fault (NVRM Xid): read `dmesg | grep -i xid` on that node; Xid 79 (fallen off the bus) and "
    "ECC errors need a reboot, and a repeat needs NVIDIA support",
}


def _guard_trips(config: StackConfig, state: dict, now: Any) -> list[Problem]:
    """Each node's memory guard trip within the budget's window (all of them when the time is unknown)."""
    problems = []
    for node, trip in sorted((state.get("memory_guard") or {}).items()):
        at = trip.get("at") if isinstance(trip, dict) else None
        if isinstance(at, int | float) and isinstance(now, int | float) and now - at > config.health.window_s:
            continue
        done = "stopped" if trip.get("acted") else "would have stopped (report mode)"
        problems.append(
            Problem(
                node,
                f"the memory guard {done} the serving containers {timestamp(at, now)}: {trip.get('message')}",
                f"find what held {node}'s memory (the watchdog's /state `last_diagnosis`: kernel OOM "
                "kills, OOMKilled); the watchdog restarts the cluster within its budget; "
                "health.memory_floor_gb sets the floor",
            )
        )
    return problems


def _watchdog_state(config: StackConfig, cluster: dict, state: dict, now: Any) -> list[Problem]:
    """The `watchdog` line for the state a running watchdog answered, and its problem if any."""
    verdict = state.get("state")
    mode = state.get("mode") or config.health.mode.value
    budget = state.get("budget_left")
    left = f"budget {budget}/{config.health.max_restarts} left" if isinstance(budget, int | float) else ""
    said = str(state.get("next_step") or "").strip()
    if verdict == "healthy":
        parts = [p for p in (f"mode {mode}", left) if p]
        would = state.get("would")
        if would:
            parts.append(
                f"report mode would have {str(would.get('step', '')).replace('_', ' ')} "
                f"({would.get('reason')}) {timestamp(would.get('at'), now)}"
            )
        cluster["watchdog"] = f"healthy ({', '.join(parts)})"
        return []
    if verdict == "starting":
        cluster["watchdog"] = f"starting ({said or 'no verdict before the server is first ready'})"
        return []
    if verdict == "failing":
        failures, what = state.get("consecutive_failures"), "probes"
        if state.get("consecutive_completion_failures"):  # /health passes; the completions do not
            failures, what = state["consecutive_completion_failures"], "completions"
        cluster["watchdog"] = f"failing ({failures} of {config.health.failures} {what} in a row; {said})"
        return []
    if verdict == "recovering":
        step = str(state.get("step") or "?")
        cluster["watchdog"] = f"recovering ({step.replace('_', ' ')}, {left})"
        return [
            Problem(
                "cluster",
                f"the watchdog is recovering the server: step {step} since "
                f"{timestamp(state.get('since'), now)}",
                said or f"wait: each restart gets health.ready_s ({config.health.ready_s:g} s) to be ready",
            )
        ]
    if verdict == "budget_spent":
        spent = state.get("spent") or {}
        when = timestamp(spent.get("at"), now)
        cluster["watchdog"] = f"budget spent {when}: {spent.get('why') or 'no reason recorded'}"
        return [
            Problem(
                "cluster",
                f"the watchdog spent its restart budget {when} and stopped the server and the cluster: "
                f"{spent.get('why') or 'no reason recorded'}",
                said
                or "find the cause (its /state `last_diagnosis`), then `pulumi up --refresh` starts the "
                "containers again; the watchdog sees them running and resets its budget",
            )
        ]
    if verdict == "memory_held":
        return _memory_held(cluster, state.get("held") or {})
    cluster["watchdog"] = f"{verdict or 'unknown'} ({said or 'no next step given'})"
    return []


def _memory_held(cluster: dict, held: dict) -> list[Problem]:
    """A watchdog that held off a restart: a node's MemAvailable below what the memory fit needs."""
    node = held.get("node") or "a node"
    message = held.get("message") or f"{node}: MemAvailable below what the memory fit needs"
    cluster["watchdog"] = f"memory held on {node}: {_figures(held)}"
    rule = held.get("rule")
    if isinstance(rule, dict):  # vLLM's start-up rule refused the node (the image's own figures)
        if rule.get("page_cache"):
            step = f"free {node}'s page cache: `{DROP_CACHES}` there, then `pulumi up --refresh`"
        else:
            step = (
                f"find what holds {node}'s memory (`nvidia-smi`, `docker ps`) or reboot it, or lower "
                "serve.gpu_memory_utilization; then `pulumi up --refresh`"
            )
    elif held.get("available_bytes") is None:  # not read at all: the node or its agent is the matter
        step = (
            f"check {node} and its health agent (`docker logs <prefix>-health-agent` there): its "
            "MemAvailable could not be read; once it answers, `pulumi up --refresh`"
        )
    else:
        step = f"reboot {node} (unified memory is only given back by a reboot), then `pulumi up --refresh`"
    return [Problem(node, f"the watchdog did not restart the server: {message}", step)]


def _figures(held: dict) -> str:
    """`MemAvailable 61.0 GB, 70.0 GB needed` from a watchdog's `held`."""
    rule = held.get("rule")
    if isinstance(rule, dict) and isinstance(rule.get("free_bytes"), int):
        counted = COUNTED.get(str(rule.get("free_from")), "")
        return (
            f"{gb(rule['free_bytes'])} free {counted}, {gb(rule['requested_bytes'])} vLLM requests "
            f"(gpu_memory_utilization {rule.get('utilization')})"
        )
    available, need = held.get("available_bytes"), held.get("need_bytes")
    if not isinstance(available, int | float) or not isinstance(need, int | float):
        return str(held.get("message") or "figures unknown")
    return f"MemAvailable {gb(available)}, {gb(need)} needed"
