"""What the watchdog shows: /state (JSON, `snapshot`) and /metrics (Prometheus text, `metrics_text`),
made from its Status and its persisted history, and the HTTP server that answers both. A library of
`watchdog`: standard library only; it travels with the program to the node.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any

from components.node_programs import cold_start, health_wire
from components.node_programs.watchdog_policy import budget_left, in_window
from components.node_programs.watchdog_settings import Settings
from components.node_programs.watchdog_state import Persisted, Status

EVENTS_SHOWN = 20  # Docker's events shown in /state (`docker_events.recent`), the newest


def snapshot(s: Settings, st: Status, p: Persisted, now: float) -> dict:
    """/state at `now`: the keys `health_wire.STATE_KEYS` names, and the figures behind /metrics."""
    return {
        "state": st.state.value,
        "mode": s.mode,
        "step": st.step.value if st.step else None,
        "since": st.since,
        "last_ready": st.last_ready,
        "consecutive_failures": st.failures,
        "consecutive_completion_failures": st.completion_failures,
        "progress": None if st.progress is None else dict(st.progress),
        "hang_bound_s": s.hang_bound_s(),
        "restarts": in_window(s, p.restarts, now),
        "restarts_total": dict(p.restarts_total),
        "budget_left": budget_left(s, p.restarts, now),
        "spent": p.spent,
        "held": st.held,
        "budget_resets": list(p.budget_resets),
        "last_diagnosis": st.diagnosis,
        "would": st.would,
        "next_step": st.next_step,
        "mem_available_bytes": dict(st.mem),
        "memory_rule": {node: dict(rule) for node, rule in st.rules.items()},
        "last_probe": None
        if st.last_probe is None
        else {
            "ok": st.last_probe.ok,
            "kind": st.last_probe.kind,
            "latency_s": st.last_probe.latency_s,
        },
        "last_ttft_s": st.last_ttft,
        "cold_start": None if st.cold_start is None else dict(st.cold_start),
        "agent_refusals": dict(st.refusals or {}),
        "agent_clock_skew_s": dict(st.skew),
        "memory_guard": dict(st.memory_guard),
        "memory_guard_trips": dict(st.guard_trips),
        "docker_events": events_state(st),
        "standing_back": [
            {**{k: v for k, v in e.items() if k not in ("kill", "id")}, "id": str(e.get("id"))[:12]}
            for e in list(st.standing.values())
        ],
        "stand_backs": list(st.stand_backs),
        "stand_backs_total": st.stand_backs_total,
        "clock_skew": [
            health_wire.skew_message(node, value)
            for node, value in sorted(st.skew.items())
            if abs(value) > health_wire.SIGNATURE_WINDOW_S
        ],
    }


def events_state(st: Status) -> dict:
    """/state's `docker_events`: each node's read (and whether its restarts are counted from the
    events or from RestartCount), and the newest events with whose they are."""
    docker = st.docker
    nodes = {
        node: {
            "read_until": docker.read.get(node),
            "error": error,
            "restarts_from": "events" if error is None else "RestartCount",
        }
        for node, error in list(docker.error.items())
    }
    recent = [
        {**{k: v for k, v in event.items() if k != "id"}, "id": str(event.get("id"))[:12]}
        for event in list(docker.kept)[-EVENTS_SHOWN:]
    ]
    return {"nodes": nodes, "recent": recent}


def _number(value: float | int) -> str:
    # Bytes and timestamps in full (`:g` would keep 6 digits).
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def metrics_text(state: dict) -> str:
    """/state as Prometheus text (version 0.0.4)."""
    probe = state.get("last_probe") or {}
    by_node = sorted((state.get("mem_available_bytes") or {}).items())
    progress = state.get("progress") or {}
    totals = sorted((state.get("restarts_total") or {}).items()) or [("none", 0)]
    families = [
        ("probe_latency_seconds", "gauge", "The last probe's latency.", [("", probe.get("latency_s"))]),
        ("probe_ok", "gauge", "1 when the last probe passed.", [("", probe and int(bool(probe.get("ok"))))]),
        ("consecutive_failures", "gauge", "Failed probes in a row.", [("", state["consecutive_failures"])]),
        (
            "consecutive_completion_failures",
            "gauge",
            "Failed completions in a row (a passing /health does not clear them).",
            [("", state.get("consecutive_completion_failures"))],
        ),
        (
            "engine_stalled_seconds",
            "gauge",
            "How long requests have run without a token generated (vLLM's /metrics).",
            [("", progress.get("stalled_s"))],
        ),
        (
            "restarts_total",
            "counter",
            "Restarts by the watchdog, by reason.",
            [(f'{{reason="{reason}"}}', count) for reason, count in totals],
        ),
        ("budget_left", "gauge", "Restarts left in the window.", [("", state["budget_left"])]),
        (
            "mem_available_bytes",
            "gauge",
            "MemAvailable per node, last read.",
            [(f'{{node="{node}"}}', value) for node, value in by_node if isinstance(value, int)],
        ),
        (
            "last_ready_timestamp_seconds",
            "gauge",
            "When the server was last ready.",
            [("", state.get("last_ready"))],
        ),
        (
            "completion_ttft_seconds",
            "gauge",
            "The last one-token completion's time to its token.",
            [("", state.get("last_ttft_s"))],
        ),
        *_node_families(state),
        *_event_families(state),
        *_start_families(state),
        (
            "state",
            "gauge",
            "1 for the watchdog's current state.",
            [(f'{{state="{s.value}"}}', int(state["state"] == s.value)) for s in health_wire.State],
        ),
    ]
    return _prometheus(families)


def _node_families(state: dict) -> list[tuple[str, str, str, list]]:
    """The families labelled by node that the agents and the memory guards feed."""
    refusals = sorted((state.get("agent_refusals") or {}).items())
    skew = sorted((state.get("agent_clock_skew_s") or {}).items())
    trips = sorted((state.get("memory_guard_trips") or {}).items())
    rules = sorted((node, r) for node, r in (state.get("memory_rule") or {}).items() if r.get("checked"))
    return [
        (
            "agent_refusals_total",
            "counter",
            "Requests an agent refused (absent or wrong signature).",
            [(f'{{node="{node}"}}', count) for node, count in refusals],
        ),
        (
            "agent_clock_skew_seconds",
            "gauge",
            f"Each agent's clock minus the head's (beyond {health_wire.SIGNATURE_WINDOW_S} s every request "
            "fails).",
            [(f'{{node="{node}"}}', value) for node, value in skew],
        ),
        (
            "memory_guard_trips_total",
            "counter",
            "Times a node's memory guard stopped (report mode: would have stopped) its serving containers.",
            [(f'{{node="{node}"}}', count) for node, count in trips],
        ),
        (
            "memory_rule_free_bytes",
            "gauge",
            "Free memory as vLLM's start-up rule counts it on the node (its image's probe, last run).",
            [(f'{{node="{node}"}}', rule.get("free_bytes")) for node, rule in rules],
        ),
        (
            "memory_rule_requested_bytes",
            "gauge",
            "What vLLM needs free to start there: gpu_memory_utilization × total (the same probe).",
            [(f'{{node="{node}"}}', rule.get("requested_bytes")) for node, rule in rules],
        ),
    ]


def _event_families(state: dict) -> list[tuple[str, str, str, list]]:
    """What Docker's event log told (issue 53): the stand-backs, and whose events could be read."""
    events = sorted(((state.get("docker_events") or {}).get("nodes") or {}).items())
    return [
        (
            "stand_backs_total",
            "counter",
            "Times the watchdog stood back for a serving container someone else was stopping.",
            [("", state.get("stand_backs_total"))],
        ),
        (
            "docker_events_read",
            "gauge",
            "1 when the node's Docker events were read last tick; 0: its restarts counted from RestartCount.",
            [(f'{{node="{node}"}}', int(read.get("error") is None)) for node, read in events],
        ),
    ]


def _start_families(state: dict) -> list[tuple[str, str, str, list]]:
    """The server's last start (`cold_start` in /state): when, and each milestone's seconds."""
    start = state.get("cold_start") or {}
    milestones = [(name, start.get(f"{name}_s")) for name in cold_start.MILESTONES[:3]]
    return [
        (
            "server_started_timestamp_seconds",
            "gauge",
            "When the server's container last started.",
            [("", start.get("started_at"))],
        ),
        (
            "server_start_seconds",
            "gauge",
            "Seconds from the server container's last start to each of vLLM's milestones (its log lines).",
            [(f'{{milestone="{name}"}}', value) for name, value in milestones],
        ),
    ]


def _prometheus(families: list[tuple[str, str, str, list]]) -> str:
    """(name, kind, help, [(labels, value)]) families as Prometheus text; a None value is left out."""
    lines = []
    for name, kind, text, samples in families:
        lines += [f"# HELP qwen35_health_{name} {text}", f"# TYPE qwen35_health_{name} {kind}"]
        lines += [
            f"qwen35_health_{name}{labels} {_number(v)}" for labels, v in samples if v not in (None, {})
        ]
    return "\n".join(lines) + "\n"


def serve_http(read_state: Callable[[], dict], host: str, port: int):
    """Answer /metrics and /state on host:port from `read_state` (the watchdog's /state), in threads."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, fmt: str, *args: Any) -> None:
            pass

        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            path = self.path.split("?", 1)[0]
            if path == health_wire.METRICS_PATH:
                data, kind = metrics_text(read_state()).encode(), "text/plain; version=0.0.4"
            elif path == health_wire.STATE_PATH:
                data, kind = json.dumps(read_state()).encode(), "application/json"
            else:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server
