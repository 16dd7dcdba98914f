"""The health programs in the lab, for tests/lab/test_health.py and bench/health.py: a stack of
its own (prefix, ports, crafted meminfo files) under executor mp on node-a (head) and node-b, the
stand-in vLLM's ranks, and the watchdog and agent in containers started from their specs."""

from __future__ import annotations

import json
import secrets
import shutil
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path

import lab
from components.config import parse_stack_config
from components.containers import ContainerSpec
from components.health.containers import (
    agent_container_name,
    agent_container_spec,
    health_config,
    health_volume_name,
    watchdog_container_name,
    watchdog_container_spec,
)
from components.mp_executor import mp_container_name, mp_serve_argv
from lab.layout import lab_dir, node_paths
from lab.nodes import bind_error
from lab.standin_vllm import FAULT_PATH, LEAK_ENV, MEMINFO_ENV, REJOIN_ENV
from tests.support.declared import upload_flags
from tests.support.program import dev_raw

# Where the stand-in image keeps its checkpoint's config.json (tests/lab/test_mp_standin.py).
MODEL_DIR = "/models/standin"


GB = 10**9
INTERVAL, DEADLINE, FAILURES = 1.0, 0.8, 2
HEALTH = {
    "mode": "enforce",
    "interval_s": INTERVAL,
    "deadline_s": DEADLINE,
    "failures": FAILURES,
    "completion_every": 3,
    "completion_deadline_s": 10,
    "startup_s": 60,
    "ready_s": 6,
    "memory_wait_s": 3,
    "max_restarts": 3,
    "window_s": 3600,
}
STOP_S = 2  # how long the watchdog's `docker stop` waits for a container (the Sparks' vLLM: 120 s)
MEMINFO = "MemTotal:       128000000 kB\nMemFree:         1000000 kB\nMemAvailable:   {kb} kB\n"


def free_ports(count: int, hosts: tuple[str, ...]) -> list[int]:
    found = []
    for port in range(18500, 18800):
        if all(bind_error(host, port) is None for host in hosts):
            found.append(port)
            if len(found) == count:
                return found
    raise AssertionError(f"no {count} free ports on {hosts} in 18500-18799")


def http(url: str, body: dict | None = None, headers: dict | None = None, timeout: float = 10):
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data, {"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except OSError:
        return None, b""


def run_argv(spec: ContainerSpec, image: str, secret_values: dict[str, str]) -> list[str]:
    """`docker run` for a health spec: every field it sets (none is dropped: it has no GPU or device)."""
    assert not spec.devices and not spec.gpus and not spec.privileged and not spec.capabilities
    argv = ["run", "--detach", "--name", spec.name, "--network", spec.network_mode, "--ipc", spec.ipc_mode]
    argv += ["--restart", spec.restart.value] + (["--init"] if spec.init else [])
    for key, value in sorted(spec.env.items()):
        argv += ["--env", f"{key}={value}"]
    for variable, key in sorted(spec.secret_env.items()):
        if secret_values.get(key):
            argv += ["--env", f"{variable}={secret_values[key]}"]
    # The deployment uploads each secret file at creation; lab nodes share this machine's filesystem,
    # so a private host file bound read-only stands in for it (tests/support/declared.py does too).
    for path, key in sorted(spec.secret_files.items()):
        if secret_values.get(key):
            argv += upload_flags({"file": path, "content": secret_values[key]})
    for mount in spec.mounts:
        argv += ["--volume", f"{mount.source}:{mount.target}" + (":ro" if mount.read_only else "")]
    for key, value in sorted(spec.labels.items()):
        argv += ["--label", f"{key}={value}"]
    return argv + ["--stop-timeout", str(spec.stop_grace_s), image, *spec.command]


class Stack:
    """One test's stack: config, images, containers on node-a and node-b, and what to ask them."""

    def __init__(self, node_a: lab.LabNode, node_b: lab.LabNode, images: dict[str, str], **health):
        self.prometheus = None
        self.nodes = {"node-a": node_a, "node-b": node_b}
        self.images = images
        self.prefix = f"hlt{uuid.uuid4().hex[:6]}"
        self.dir = Path(tempfile.mkdtemp(prefix=f"{self.prefix}-", dir=lab_dir()))
        self.meminfo = {name: self.dir / f"{name}.meminfo" for name in self.nodes}
        for path in self.meminfo.values():
            path.write_text(MEMINFO.format(kb=100 * GB // 1024))
            path.chmod(0o666)
        serve, master, port, agent = free_ports(4, (node_a.host, node_b.host))
        raw = dev_raw("lab")
        raw.pop("ray", None)
        for node in raw["nodes"]:
            node.pop("ray_ports", None)
            node["docker_socket"] = str(node_paths(node["name"]).socket)
            node["meminfo_path"] = str(self.meminfo[node["name"]])
        raw["serve"] = {**raw["serve"], "model": MODEL_DIR, "host": node_a.host, "port": serve}
        raw["cluster"] = {"executor": "mp", "master_port": master}
        raw["containers"] = {**raw["containers"], "name_prefix": self.prefix}
        raw["health"] = {**HEALTH, "port": port, "agent_port": agent, **health}
        self.cfg = parse_stack_config(raw)
        self.head, self.worker = self.cfg.nodes
        self.secret = secrets.token_hex(32)
        self.server = mp_container_name(self.cfg, self.head)
        self.rank = mp_container_name(self.cfg, self.worker)
        self.watchdog_url = f"http://{node_a.host}:{port}"
        self.agent_url = f"http://{node_b.host}:{agent}"
        self.vllm_url = f"http://{node_a.host}:{serve}"

    def config_json(self, node, need: dict[str, int | None] | None = None) -> str:
        body = json.loads(health_config(self.cfg, node, need))
        for target in [body["server"], *body["cluster"]]:
            target["stop_timeout_s"] = STOP_S
        return json.dumps(body)

    def docker(self, node: str, *argv: str, check: bool = True):
        return lab.docker(self.nodes[node], *argv, check=check, timeout=120)

    def start_ranks(
        self, rejoin: bool = False, leak_gb: int = 0, memory: dict[str, str] | None = None
    ) -> None:
        """As the deployment orders them: the headless rank, then the head (the server); `memory`: a
        node's rank under Docker's `--memory` limit (no swap: the kernel's OOM killer acts at it)."""
        for node, name in ((self.worker, self.rank), (self.head, self.server)):
            env = ["--env", "VLLM_STANDIN_JOIN_TIMEOUT_S=120", "--env", f"{REJOIN_ENV}={int(rejoin)}"]
            if (memory or {}).get(node.name):
                env += ["--memory", memory[node.name], "--memory-swap", memory[node.name]]
            if leak_gb:
                env += ["--env", f"{MEMINFO_ENV}=/run/meminfo", "--env", f"{LEAK_ENV}={leak_gb * GB}"]
                env += ["--volume", f"{self.meminfo[node.name]}:/run/meminfo"]
            argv = mp_serve_argv(self.cfg, node)
            self.docker(
                node.name, "run", "--detach", "--init", "--name", name, "--network", "host", *env,
                "--entrypoint", argv[0], self.images[node.name], *argv[1:],
            )  # fmt: skip

    def start_agent(self, need: dict | None = None) -> None:
        spec = agent_container_spec(self.cfg, self.worker, "unused", self.config_json(self.worker, need))
        self.docker("node-b", *run_argv(spec, self.images["node-b"], {"health_secret": self.secret}))
        wait_for(lambda: http(f"{self.agent_url}/metrics")[0] == 200, 20, "the agent never listened")

    def start_watchdog(self, need: dict | None = None) -> None:
        spec = watchdog_container_spec(self.cfg, "unused", self.config_json(self.head, need))
        assert spec.name == watchdog_container_name(self.cfg)
        self.docker("node-a", *run_argv(spec, self.images["node-a"], {"health_secret": self.secret}))
        wait_for(lambda: http(f"{self.watchdog_url}/state")[0] == 200, 20, "the watchdog never listened")

    def up(
        self,
        rejoin: bool = False,
        leak_gb: int = 0,
        need: dict | None = None,
        memory: dict[str, str] | None = None,
    ) -> None:
        self.start_ranks(rejoin, leak_gb, memory)
        self.start_agent(need)
        self.start_watchdog(need)
        self.wait_state(lambda s: s["state"] == "healthy", 60, "never healthy")

    def state(self) -> dict:
        status, body = http(f"{self.watchdog_url}/state", timeout=5)
        return json.loads(body) if status == 200 else {}

    def wait_state(self, ok: Callable[[dict], bool], timeout: float, what: str) -> dict:
        last: dict = {}

        def check() -> bool:
            nonlocal last
            last = self.state() or last
            return bool(last) and ok(last)

        wait_for(check, timeout, lambda: f"{what}: /state {json.dumps(last)[:3000]}\n{self.logs()}")
        return last

    def fault(self, mode: str, **extra) -> float:
        at = time.time()
        status, body = http(f"{self.vllm_url}{FAULT_PATH}", {"mode": mode, **extra})
        assert status == 200, body
        return at

    def inspect(self, node: str, name: str) -> tuple[str, str]:
        out = self.docker(node, "inspect", "--format", "{{.State.Status}} {{.State.StartedAt}}", name).out
        status, started = out.split()
        return status, started

    def logs(self) -> str:
        out = []
        for node, name in (
            ("node-a", watchdog_container_name(self.cfg)),
            ("node-b", agent_container_name(self.cfg)),
        ):
            found = self.docker(node, "logs", "--tail", "30", name, check=False)
            out.append(f"--- {name}:\n{found.out[-3000:]}{found.err[-1500:]}")
        return "\n".join(out)

    def remove(self) -> None:
        for node in self.nodes:
            names = self.docker(
                node, "ps", "-aq", "--filter", f"name={self.prefix}-", check=False
            ).out.split()
            if names:
                self.docker(node, "rm", "--force", *names, check=False)
        self.docker("node-a", "volume", "rm", "-f", health_volume_name(self.cfg), check=False)
        shutil.rmtree(self.dir, ignore_errors=True)


class Timeout(AssertionError):
    """What was awaited did not happen in time (the message says what and shows the state)."""


def wait_for(check: Callable[[], bool], timeout: float, what) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise Timeout(what() if callable(what) else what)
        time.sleep(0.2)
