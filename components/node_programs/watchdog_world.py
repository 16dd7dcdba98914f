"""The watchdog's World: what it reads (the server's /health, /metrics and a completion; each node's
containers, Docker's events of them, MemAvailable and kernel log; Ray's live nodes) and what it does
(stop and start a container, probe a node's GPU memory). The head's Docker through its mounted
socket; every other node's only through its agent, each request signed for that node. A library of
`watchdog`: standard library only; it travels with the program to the node. Tests give a fake World.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

from components.node_programs import gpu_memory, health_wire
from components.node_programs.watchdog_settings import Settings, Target

CALL_TIMEOUT_S = 10.0  # any one call to an agent, the daemon or Ray (the stop's own wait is added)
# A start's log read once it answers: its milestones are among the first lines (vLLM's per-request and
# 10-second stats lines come after).
START_LOG_LINES = 20000


@dataclass(frozen=True)
class Probe:
    """One probe's outcome: `kind` ok | timeout | refused | status | error."""

    ok: bool
    latency_s: float
    kind: str = "ok"
    detail: str = ""


class World:
    """What the watchdog reads and does; tests give a fake one."""

    def probe_health(self, deadline_s: float) -> Probe:
        raise NotImplementedError

    def probe_completion(self, deadline_s: float) -> Probe:
        raise NotImplementedError

    def probe_metrics(self, deadline_s: float) -> str | None:
        """vLLM's /metrics text; None when it cannot be read (no verdict from it then)."""
        return None

    def mem_available(self, node: str) -> tuple[int | None, str | None]:
        raise NotImplementedError

    def containers(self, node: str) -> list[dict]:
        raise NotImplementedError

    def memory_probe(self, node: str) -> dict:
        """`gpu_memory.run_probe` on `node` beside its first stack container: {report, error, took_s}."""
        return {"report": None, "error": "no memory probe in this world"}

    def events(self, node: str, since: float, until: float) -> tuple[list[dict], str | None]:
        """Docker's events of `node`'s stack containers from `since` to `until` (that node's clock),
        as `health_wire.events` gives them: (events, None), or ([], why they could not be read)."""
        return [], "no Docker event log in this world"

    def stop(self, target: Target) -> dict:
        raise NotImplementedError

    def start(self, target: Target) -> dict:
        raise NotImplementedError

    def logs(self, target: Target, tail: int) -> list[str]:
        raise NotImplementedError

    def start_lines(self, target: Target, since: float, until: float) -> list[str]:
        """The target's log lines between `since` and `until`, each with Docker's timestamp
        (`cold_start.stamped`); OSError when they cannot be read."""
        raise OSError("no log with timestamps in this world")

    def ray_nodes(self) -> dict:
        raise NotImplementedError

    def boot_time(self) -> float | None:
        """When the head booted (unix seconds, /proc/stat's btime), None when unknown."""
        return None

    def agent_refusals(self) -> dict[str, int]:
        return {}

    def agent_clock_skew(self) -> dict[str, float]:
        """Each agent's clock minus the head's (seconds), as last measured."""
        return {}

    def memory_guards(self) -> dict[str, dict]:
        """Each agent's memory guard report (`MemoryGuard.report`), as its last answer gave it."""
        return {}

    def kernel_faults(self, node: str, since: float) -> dict:
        """{faults, error}: the node's kernel OOM kills and Xids from `since` on (best effort)."""
        return {"faults": [], "error": "not read"}


# ---- the real World: HTTP to the server and the agents, the head's Docker through its socket ---------


def http_call(
    url: str,
    method: str = "GET",
    body: bytes | None = None,
    headers: dict | None = None,
    timeout: float = 5.0,
) -> tuple[int, bytes]:
    """One HTTP request with a deadline over the whole exchange: (status, body)."""
    import http.client
    import urllib.parse

    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=timeout)
    deadline = time.monotonic() + timeout
    try:
        conn.request(method, parts.path + (f"?{parts.query}" if parts.query else ""), body, headers or {})
        response = conn.getresponse()
        data = response.read()
        if time.monotonic() > deadline:
            raise TimeoutError(f"answered after {timeout:g} s")
        return response.status, data
    finally:
        conn.close()


def timed_probe(call: Callable[[], tuple[int, bytes]]) -> Probe:

    started = time.monotonic()
    try:
        status, _ = call()
    except TimeoutError as exc:
        return Probe(False, time.monotonic() - started, "timeout", str(exc) or "no answer")
    except ConnectionRefusedError as exc:
        return Probe(False, time.monotonic() - started, "refused", str(exc))
    except OSError as exc:
        return Probe(False, time.monotonic() - started, "error", f"{type(exc).__name__}: {exc}")
    except Exception as exc:  # a malformed answer (http.client's own errors)
        return Probe(False, time.monotonic() - started, "error", f"{type(exc).__name__}: {exc}")
    latency = time.monotonic() - started
    return Probe(status == 200, latency, "ok" if status == 200 else "status", f"HTTP {status}")


class Agent:
    """The watchdog's client of one node's agent: every request signed for that node, with a nonce."""

    def __init__(self, address: str, secret: str, node: str):
        self.address, self.secret, self.node = address, secret, node
        self.skew_s: float | None = None  # the agent's clock minus this one's, from its last answer

    def call(self, path: str, payload: dict, timeout: float = CALL_TIMEOUT_S, skew: bool = True) -> dict:
        """`skew`: measure the agent's clock from this answer (not from one that took long: the agent
        stamps its clock when the request arrives, so half the wait would read as skew)."""
        body = json.dumps(payload).encode()
        headers = {"Content-Type": "application/json"}
        sent = time.time()
        headers.update(health_wire.signed_headers(self.secret, "POST", path, body, sent, node=self.node))
        status, data = http_call(f"http://{self.address}{path}", "POST", body, headers, timeout)
        answer = json.loads(data) if data else {}
        if skew and isinstance(answer.get("clock"), int | float):
            # Half the round trip is the measure's error: seconds matter here, not milliseconds.
            self.skew_s = float(answer["clock"]) - (sent + time.time()) / 2
        if status != 200:
            raise OSError(f"agent {self.address} answered {status}: {answer.get('error')}")
        return answer


class RealWorld(World):
    def __init__(self, settings: Settings, secret: str, api_key: str | None, meminfo: str, socket_path: str):
        self.s, self.api_key, self.meminfo, self.socket = settings, api_key, meminfo, socket_path
        self.agents = {n.name: Agent(n.agent, secret, n.name) for n in settings.nodes if n.agent}
        self.refusals: dict[str, int] = {}
        self.guards: dict[str, dict] = {}  # each agent's memory guard report, from its /containers answer
        self.kernel_log = os.environ.get(health_wire.KERNEL_LOG_ENV, health_wire.DEFAULT_KERNEL_LOG)

    def probe_health(self, deadline_s: float) -> Probe:
        return timed_probe(lambda: http_call(f"{self.s.vllm_url}/health", timeout=deadline_s))

    def probe_completion(self, deadline_s: float) -> Probe:
        body = json.dumps(
            {"model": self.s.model, "messages": [{"role": "user", "content": "ping"}], "max_tokens": 1}
        ).encode()
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        url = f"{self.s.vllm_url}/v1/chat/completions"
        return timed_probe(lambda: http_call(url, "POST", body, headers, deadline_s))

    def probe_metrics(self, deadline_s: float) -> str | None:
        try:
            status, data = http_call(f"{self.s.vllm_url}/metrics", timeout=deadline_s)
        except Exception:  # no figures: no verdict from them (/health and the completions still judge)
            return None
        return data.decode(errors="replace") if status == 200 else None

    def _agent(
        self, node: str, path: str, payload: dict, timeout: float = CALL_TIMEOUT_S, skew: bool = True
    ) -> dict:
        answer = self.agents[node].call(path, payload, timeout, skew)
        if "refusals" in answer:
            self.refusals[node] = int(answer["refusals"])
        return answer

    def mem_available(self, node: str) -> tuple[int | None, str | None]:
        if node not in self.agents:
            return health_wire.read_mem_available(self.meminfo)
        try:
            answer = self._agent(node, health_wire.AGENT_MEMINFO, {})
        except (OSError, ValueError) as exc:
            return None, f"its agent did not answer: {exc}"
        return answer.get("available_bytes"), answer.get("error")

    def memory_probe(self, node: str) -> dict:
        template = self.s.node(node).containers[0]
        if node not in self.agents:
            return gpu_memory.run_probe(self.socket, template)
        try:
            timeout = gpu_memory.PROBE_TIMEOUT_S + gpu_memory.REMOVE_S + CALL_TIMEOUT_S
            return self._agent(node, health_wire.AGENT_MEMORY_PROBE, {"name": template}, timeout, skew=False)
        except (OSError, ValueError) as exc:
            return {"report": None, "error": f"its agent did not answer: {exc}"}

    def containers(self, node: str) -> list[dict]:
        if node not in self.agents:
            return [health_wire.inspect(self.socket, name) for name in self.s.node(node).containers]
        try:
            answer = self._agent(node, health_wire.AGENT_CONTAINERS, {})
            if isinstance(answer.get("guard"), dict):
                self.guards[node] = answer["guard"]
            return answer["containers"]
        except (OSError, ValueError, KeyError) as exc:
            return [
                {"name": name, "state": "unknown", "error": str(exc)} for name in self.s.node(node).containers
            ]

    def events(self, node: str, since: float, until: float) -> tuple[list[dict], str | None]:
        names = self.s.node(node).containers
        if node not in self.agents:
            return health_wire.events(self.socket, since, until, names, CALL_TIMEOUT_S)
        try:
            answer = self._agent(node, health_wire.AGENT_EVENTS, {"since": since, "until": until})
        except (OSError, ValueError) as exc:
            return [], f"its agent did not answer: {exc}"
        found = answer.get("events")
        return (found, answer.get("error")) if isinstance(found, list) else ([], "its agent gave no events")

    def _act(self, action: str, target: Target) -> dict:
        if target.node not in self.agents:
            return health_wire.act(
                self.socket,
                action,
                target.name,
                target.stop_timeout_s,
                CALL_TIMEOUT_S + target.stop_timeout_s,
            )
        path = health_wire.AGENT_STOP if action == "stop" else health_wire.AGENT_START
        try:
            return self._agent(
                target.node, path, {"name": target.name}, CALL_TIMEOUT_S + target.stop_timeout_s
            )
        except (OSError, ValueError) as exc:
            return {"ok": False, "error": str(exc)}

    def stop(self, target: Target) -> dict:
        return self._act("stop", target)

    def start(self, target: Target) -> dict:
        return self._act("start", target)

    def logs(self, target: Target, tail: int) -> list[str]:
        if target.node not in self.agents:
            return health_wire.logs(self.socket, target.name, tail)
        try:
            asked = {"name": target.name, "tail": tail}
            return self._agent(target.node, health_wire.AGENT_LOGS, asked)["lines"]
        except (OSError, ValueError, KeyError) as exc:
            return [f"(no logs: {exc})"]

    def start_lines(self, target: Target, since: float, until: float) -> list[str]:
        if target.node in self.agents:
            raise OSError(f"{target.name} runs on {target.node}: its log is read on the head only")
        return health_wire.stamped_logs(self.socket, target.name, since, until, START_LOG_LINES)

    def ray_nodes(self) -> dict:
        """Ray's live nodes from its dashboard (best effort, bounded)."""
        if not self.s.ray_dashboard:
            return {"error": "no Ray dashboard address"}
        try:
            status, data = http_call(f"{self.s.ray_dashboard}/nodes?view=summary", timeout=5.0)
            nodes = json.loads(data).get("data", {}).get("summary", [])
            alive = [n for n in nodes if (n.get("raylet") or {}).get("state") == "ALIVE"]
            return {"alive": len(alive), "nodes": len(nodes), "status": status}
        except Exception as exc:  # best effort: any failure is recorded, never raised
            return {"error": f"{type(exc).__name__}: {exc}"}

    def boot_time(self) -> float | None:
        return health_wire.boot_time()

    def memory_guards(self) -> dict[str, dict]:
        return dict(self.guards)

    def kernel_faults(self, node: str, since: float) -> dict:
        if node not in self.agents:
            return health_wire.recent_kernel_faults(self.kernel_log, since)
        try:
            answer = self._agent(node, health_wire.AGENT_KERNEL, {"since": since})
        except (OSError, ValueError) as exc:
            return {"faults": [], "error": f"its agent did not answer: {exc}"}
        return {"faults": answer.get("faults") or [], "error": answer.get("error")}

    def agent_refusals(self) -> dict[str, int]:
        return dict(self.refusals)

    def agent_clock_skew(self) -> dict[str, float]:
        return {node: agent.skew_s for node, agent in self.agents.items() if agent.skew_s is not None}
