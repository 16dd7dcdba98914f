"""The health agent, on every node but the head (issue 33): the watchdog's hands on this node.

    python3 -I -S -c <program>      (config: QWEN35_HEALTH_CONFIG, secret: /run/qwen35-health/secret)

It listens on this node's fabric address only (`agent_port`), and answers only requests signed with
the stack's secret (`health_wire.check_signature`); any other is refused with 401, counted, and
changes nothing. It reads this node's MemAvailable and its stack containers' states and logs, and
stops or starts one of them: only a name in its config (this node's containers of the stack's
prefix), never anything else on the node. Its one privilege is the node's Docker socket mount.

Its memory guard (issue 41 item 6) reads MemAvailable every second: below `memory_floor_bytes` for
`memory_floor_s` it stops this node's serving containers, once (under report: records that it would),
before the kernel's OOM killer or a wedged node does. Each trip is in every /containers answer, where
the watchdog reads it and answers with a world restart within its budget. /kernel gives the kernel's
OOM kills and NVRM Xid lines where this node's log can be read; /events Docker's events of this node's
stack containers (their restarts by Docker's policy, OOM kills, stops by someone else).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from components.node_programs import gpu_memory, health_wire

BODY_LIMIT = 64 << 10  # a request body longer than this is not one the watchdog sends
CALL_TIMEOUT_S = 10.0
# Nonces remembered at once: the watchdog sends a few requests a tick, so this many within twice the
# signature window is not the watchdog; past it every request is refused until older nonces expire.
NONCE_LIMIT = 100_000
# Where the agent keeps the nonces it accepted: its container's own filesystem, which a restart of the
# container (Docker's policy, a crash) keeps, so a request replayed to the restarted agent is refused.
NONCE_FILE = "/var/tmp/qwen35-health-agent-nonces.json"


def log(message: str) -> None:
    print(f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} health-agent: {message}", flush=True)


@dataclass(frozen=True)
class AgentSettings:
    node: str
    host: str
    port: int
    containers: tuple[str, ...]
    stop_timeout_s: dict[str, int]
    mode: str = "enforce"
    memory_floor_bytes: int | None = None
    memory_floor_s: float = 5.0
    guard_stop_s: int = 10  # the guard's stop: SIGTERM, then SIGKILL after this many seconds

    @staticmethod
    def from_json(text: str) -> AgentSettings:
        raw = json.loads(text)
        me = next(n for n in raw["nodes"] if n["name"] == raw["node"])
        timeouts = {
            t["name"]: int(t.get("stop_timeout_s", 30)) for t in raw["cluster"] if t["node"] == me["name"]
        }
        return AgentSettings(
            me["name"],
            me["fabric_ip"],
            int(raw["agent_port"]),
            tuple(me["containers"]),
            timeouts,
            raw.get("mode", "enforce"),
            raw.get("memory_floor_bytes"),
            float(raw.get("memory_floor_s", 5)),
            int(raw.get("guard_stop_s", 10)),
        )


@dataclass(frozen=True)
class Answer:
    status: int
    body: dict


class Agent:
    """The decisions: who may ask, and for what. Docker and the meminfo are given (tests fake them)."""

    def __init__(
        self,
        settings: AgentSettings,
        secret: str,
        docker: Callable[..., Any],
        meminfo: Callable[[], tuple[int | None, str | None]],
        clock: Callable[[], float] = time.time,
        kernel_log: str = health_wire.DEFAULT_KERNEL_LOG,
        nonce_file: str | None = None,
    ):
        self.s, self.secret, self.docker, self.meminfo, self.clock = settings, secret, docker, meminfo, clock
        self.kernel_log = kernel_log
        self.refusals = 0
        self.actions = 0
        self.guard = health_wire.MemoryGuard(
            settings.node,
            settings.memory_floor_bytes,
            settings.memory_floor_s,
            settings.mode == health_wire.Mode.ENFORCE.value,
            meminfo,
            self._running,
            self._guard_stop,
        )
        # nonce -> until when a replay of it would pass the time check; kept in `nonce_file` (the
        # container's own filesystem) too, so an agent restarted by Docker still refuses a replay.
        self.nonce_file = nonce_file
        self.nonce_file_failed = False
        self.nonces: dict[str, int] = self._load_nonces()
        self.lock = threading.Lock()
        self.probing = threading.Lock()  # one memory probe at a time on this node

    def handle(self, method: str, path: str, headers: dict[str, str], body: bytes) -> Answer:
        if method == "GET" and path == health_wire.METRICS_PATH:
            return Answer(200, {"metrics": self.metrics()})
        now = self.clock()
        why = health_wire.check_signature(self.secret, method, path, body, headers, now, self.s.node)
        if why is None:
            stamp = int(headers[health_wire.TIME_HEADER.lower()])
            why = self._first_use(headers[health_wire.NONCE_HEADER.lower()], stamp, now)
        if why is not None:
            with self.lock:
                self.refusals += 1
            log(f"refused {method} {path}: {why}")
            # This node's clock in every answer: the watchdog names a skew beyond the window.
            return Answer(401, {"error": f"refused: {why}", "refusals": self.refusals, "clock": now})
        try:
            payload = json.loads(body or b"{}")
            if not isinstance(payload, dict):
                raise ValueError("not an object")
        except ValueError:
            return Answer(400, {"error": "the body is not a JSON object"})
        answer = self._signed(path, payload)
        answer.body.update(refusals=self.refusals, clock=now)
        return answer

    def _load_nonces(self) -> dict[str, int]:
        """The nonces an earlier run of this agent accepted that are still within their window (none
        where the file is absent or unreadable: the agent starts and says so)."""
        if not self.nonce_file:
            return {}
        try:
            with open(self.nonce_file) as handle:
                raw = json.load(handle)
            now = self.clock()
            return {str(n): int(u) for n, u in raw.items() if int(u) >= now}
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, TypeError, AttributeError) as exc:
            log(
                f"the nonces of the last run in {self.nonce_file} could not be read ({exc}): starting without"
            )
            return {}

    def _save_nonces(self) -> None:
        """Write the nonces still in their window (atomically: a crash mid-write leaves the last file)."""
        if not self.nonce_file:
            return
        part = f"{self.nonce_file}.part"
        try:
            with open(part, "w") as handle:
                json.dump(self.nonces, handle)
            os.replace(part, self.nonce_file)
        except OSError as exc:
            if not self.nonce_file_failed:  # said once, not on every request
                log(f"cannot keep the nonces in {self.nonce_file} ({exc}): a restart would forget them")
            self.nonce_file_failed = True

    def _first_use(self, nonce: str, stamp: int, now: float) -> str | None:
        """Remember a signed request's nonce until its time leaves the window; None the first time,
        why not when it was seen (a replay) or too many are remembered."""
        with self.lock:
            self.nonces = {n: until for n, until in self.nonces.items() if until >= now}
            if nonce in self.nonces:
                return "a replayed request (its nonce was seen within the signature window)"
            if len(self.nonces) >= NONCE_LIMIT:
                return f"more than {NONCE_LIMIT} signed requests within the signature window"
            self.nonces[nonce] = stamp + health_wire.SIGNATURE_WINDOW_S
            self._save_nonces()
        return None

    def _signed(self, path: str, payload: dict) -> Answer:
        if path == health_wire.AGENT_MEMINFO:
            available, error = self.meminfo()
            return Answer(200, {"available_bytes": available, "error": error})
        if path == health_wire.AGENT_CONTAINERS:
            found = [self.docker("inspect", name) for name in self.s.containers]
            return Answer(200, {"containers": found, "guard": self.guard.report()})
        if path == health_wire.AGENT_EVENTS:
            return self._events(payload)
        if path == health_wire.AGENT_KERNEL:
            since = payload.get("since")
            since = float(since) if isinstance(since, int | float) else 0.0
            return Answer(200, health_wire.recent_kernel_faults(self.kernel_log, since))
        name = payload.get("name")
        if path not in (*health_wire.AGENT_ACTIONS, health_wire.AGENT_LOGS, health_wire.AGENT_MEMORY_PROBE):
            return Answer(404, {"error": f"no endpoint {path}"})
        if name not in self.s.containers:
            log(f"refused {path} of {name!r}: not one of this stack's containers on {self.s.node}")
            return Answer(403, {"error": f"{name!r} is not one of this stack's containers on {self.s.node}"})
        if path == health_wire.AGENT_LOGS:
            return Answer(200, {"lines": self.docker("logs", name, int(payload.get("tail") or 20))})
        if path == health_wire.AGENT_MEMORY_PROBE:
            return self._memory_probe(name)
        action = path.lstrip("/")
        with self.lock:
            self.actions += 1
            done = self.docker(action, name, self.s.stop_timeout_s.get(name, 30))
        log(f"{action} {name}: {'done' if done.get('ok') else done.get('error')}")
        return Answer(200 if done.get("ok") else 502, done)

    def _events(self, payload: dict) -> Answer:
        """Docker's events of this node's stack containers from `since` to `until` (this node's
        clock; `until` defaults to now): what the watchdog tells Docker's restarts, OOM kills and
        someone else's stops from."""
        since, until = payload.get("since"), payload.get("until", self.clock())
        if not isinstance(since, int | float) or not isinstance(until, int | float):
            return Answer(400, {"error": "since and until must be unix seconds"})
        found, error = self.docker("events", self.s.containers, float(since), float(until))
        return Answer(200, {"events": found, "error": error})

    def _memory_probe(self, name: str) -> Answer:
        """vLLM's start-up figures from the image of `name`, in a short-lived container beside it."""
        if not self.probing.acquire(blocking=False):
            return Answer(409, {"error": f"a memory probe already runs on {self.s.node}"})
        try:
            done = self.docker("memory_probe", name)
        finally:
            self.probing.release()
        log(f"memory probe beside {name}: {done.get('error') or done.get('report')}")
        return Answer(200, done)

    def _running(self) -> list[str]:
        """This node's stack containers that run, in stop order (the reverse of the start order)."""
        names = reversed(self.s.containers)
        return [name for name in names if self.docker("inspect", name).get("state") == "running"]

    def _guard_stop(self, name: str) -> dict:
        with self.lock:
            self.actions += 1
        done = health_wire.guard_stopped(
            self.docker("stop", name, self.s.guard_stop_s), self.docker("inspect", name), self.s.guard_stop_s
        )
        log(f"memory guard: stop {name}: {health_wire.guard_stop_said(done)}")
        return done

    def metrics(self) -> str:
        return (
            "# HELP qwen35_health_agent_refusals_total Requests refused: absent or wrong signature.\n"
            "# TYPE qwen35_health_agent_refusals_total counter\n"
            f'qwen35_health_agent_refusals_total{{node="{self.s.node}"}} {self.refusals}\n'
            "# HELP qwen35_health_agent_actions_total Containers stopped, started or restarted.\n"
            "# TYPE qwen35_health_agent_actions_total counter\n"
            f'qwen35_health_agent_actions_total{{node="{self.s.node}"}} {self.actions}\n'
            "# HELP qwen35_health_agent_memory_guard_trips_total Times the memory guard stopped (report "
            "mode: would have stopped) this node's serving containers.\n"
            "# TYPE qwen35_health_agent_memory_guard_trips_total counter\n"
            f'qwen35_health_agent_memory_guard_trips_total{{node="{self.s.node}"}} {self.guard.trips}\n'
        )


def docker_on(socket_path: str) -> Callable[..., Any]:
    """The node's Docker through its mounted socket, as the Agent calls it."""

    def docker(what: str, name: Any, *args: Any) -> Any:
        if what == "events":  # `name`: every name asked for; args: since, until
            return health_wire.events(socket_path, args[0], args[1], name, CALL_TIMEOUT_S)
        if what == "inspect":
            return health_wire.inspect(socket_path, name)
        if what == "logs":
            return health_wire.logs(socket_path, name, args[0])
        if what == "memory_probe":
            return gpu_memory.run_probe(socket_path, name)
        return health_wire.act(socket_path, what, name, args[0], CALL_TIMEOUT_S + args[0])

    return docker


def serve(agent: Agent, host: str, port: int):
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        timeout = 10  # seconds a connection may idle mid-request (a slow sender holds no thread forever)

        def log_message(self, fmt: str, *args: Any) -> None:
            pass

        def _answer(self, method: str) -> None:
            try:
                length = int(self.headers.get("Content-Length") or 0)
            except ValueError:
                length = -1
            if length < 0 or length > BODY_LIMIT:  # a negative length would read to the end
                self.send_error(413 if length > BODY_LIMIT else 400)
                return
            body = self.rfile.read(length) if length else b""
            headers = {k.lower(): v for k, v in self.headers.items()}
            answer = agent.handle(method, self.path, headers, body)
            if "metrics" in answer.body and self.path == health_wire.METRICS_PATH:
                data, kind = answer.body["metrics"].encode(), "text/plain; version=0.0.4"
            else:
                data, kind = json.dumps(answer.body).encode(), "application/json"
            self.send_response(answer.status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            self._answer("GET")

        def do_POST(self) -> None:  # noqa: N802
            self._answer("POST")

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    return server


def main(argv: list[str]) -> int:
    try:
        raw = os.environ[health_wire.CONFIG_ENV]
        if json.loads(raw).get("mode") == health_wire.Mode.OFF.value:
            log("health.mode is off: nothing to serve")
            return health_wire.Exit.MODE_OFF
        settings = AgentSettings.from_json(raw)
    except (KeyError, ValueError, TypeError, StopIteration) as exc:
        log(f"{health_wire.CONFIG_ENV} missing or not an agent's config ({type(exc).__name__}: {exc})")
        return health_wire.Exit.BAD_CONFIG
    secret = health_wire.read_secret()
    if not secret:
        log(
            f"no secret in {health_wire.SECRET_FILE} (nor {health_wire.SECRET_ENV}): "
            "refusing to serve requests nobody could sign"
        )
        return health_wire.Exit.NO_SECRET
    meminfo = os.environ.get(health_wire.MEMINFO_ENV, health_wire.DEFAULT_MEMINFO)
    agent = Agent(
        settings,
        secret,
        docker_on(health_wire.DOCKER_SOCKET_MOUNT),
        lambda: health_wire.read_mem_available(meminfo),
        kernel_log=os.environ.get(health_wire.KERNEL_LOG_ENV, health_wire.DEFAULT_KERNEL_LOG),
        nonce_file=NONCE_FILE,
    )
    try:
        server = serve(agent, settings.host, settings.port)
    except OSError as exc:
        log(f"cannot listen on {settings.host}:{settings.port}: {exc}")
        return health_wire.Exit.CANNOT_LISTEN
    log(f"{settings.node}: serving on {settings.host}:{settings.port} for {', '.join(settings.containers)}")
    health_wire.guard_thread(agent.guard, log)
    server.serve_forever()
    return health_wire.Exit.OK


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
