"""`python -m bench health`: the watchdog in the lab, figures not asserts.

- its cost on the head: CPU (% of one core, from /proc/<pid>/stat over a minute) and RSS, with the
  Sparks' defaults (a /health probe every 10 s, a one-token completion every 6th);
- with the lab's small intervals (a probe every 1 s, 2 failures, a 0.8 s deadline): the time from a
  hang (SIGSTOP of the serving process) to its detection and to the server ready again, median of 3;
- the plain alternative: Docker's restart policy alone on the same hang: the container stays "Up",
  its RestartCount 0, /health unanswered: the policy acts on an exit, never on a hang;
- beside them, the real engine (`python -m bench health` runs both; `python -m bench health-real`
  the real rows alone): vLLM's CPU build serving the tiny Qwen3.5-MoE under `mp` on node-a and node-b
  through the real Pulumi engine (engine/real_vllm.yaml), its `VLLM::Worker` stopped (SIGSTOP) while
  `/health` still answers 200: the time to detection (from completions and vLLM's own /metrics) and
  to the world serving again, median of REAL_HANGS, with the bound the watchdog computes.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import lab
from components.health.containers import watchdog_container_name
from lab.sessions import lab_session
from tests.lab.test_mp_standin import standin_image
from tests.support.health_lab import Stack, http, wait_for

SPARK_DEFAULTS = {"interval_s": 10, "deadline_s": 5, "completion_every": 6, "failures": 3}
REAL_HANGS = 2
# The real engine's watchdog, as tests/engine/test_real_vllm.py runs it (a completion every probe).
REAL_HEALTH = {"mode": "enforce", "interval_s": 2, "deadline_s": 1, "completion_every": 1,
               "completion_deadline_s": 15, "failures": 2, "startup_s": 400, "ready_s": 400,
               "memory_wait_s": 10, "max_restarts": 6, "window_s": 3600}  # fmt: skip
CPU_WINDOW_S = 60.0
HANGS = 3
PLAIN_WATCH_S = 20.0


def process_tree(pid: int) -> list[int]:
    """`pid` and its descendants (the container's tini and the watchdog's python under it)."""
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        try:
            with open(f"/proc/{current}/task/{current}/children") as handle:
                todo += [int(child) for child in handle.read().split()]
        except OSError:
            continue
    return found


def cpu_ticks(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat)
    return total


def rss_kb(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/status") as handle:
            total += next(int(line.split()[1]) for line in handle if line.startswith("VmRSS:"))
    return total


def watchdog_cost(node_a: lab.LabNode, node_b: lab.LabNode, images: dict[str, str]) -> tuple[float, float]:
    """(% of one core, RSS in MB) of the watchdog over CPU_WINDOW_S, with the Sparks' intervals."""
    stack = Stack(node_a, node_b, images, **SPARK_DEFAULTS, startup_s=600)
    try:
        stack.up(rejoin=True)
        name = watchdog_container_name(stack.cfg)
        pid = int(lab.docker(node_a, "inspect", "--format", "{{.State.Pid}}", name).out)
        pids = process_tree(pid)
        before, started = cpu_ticks(pids), time.monotonic()
        time.sleep(CPU_WINDOW_S)
        used = (cpu_ticks(pids) - before) / os.sysconf("SC_CLK_TCK")
        return 100 * used / (time.monotonic() - started), rss_kb(pids) / 1024
    finally:
        stack.remove()


def hang_times(node_a: lab.LabNode, node_b: lab.LabNode, images: dict[str, str]) -> list[tuple[float, float]]:
    """(seconds to detection, seconds to ready again) of HANGS hangs, one stack each."""
    times = []
    for _ in range(HANGS):
        stack = Stack(node_a, node_b, images)
        try:
            stack.up(rejoin=True)
            at = stack.fault("hang")
            state = stack.wait_state(lambda s: s["state"] == "healthy" and s["restarts"], 60, "not recovered")
            times.append((state["last_diagnosis"]["at"] - at, state["last_ready"] - at))
        finally:
            stack.remove()
    return times


def plain_hang(node_a: lab.LabNode, node_b: lab.LabNode, images: dict[str, str]) -> str:
    """The same hang under `--restart unless-stopped` and no watchdog: what Docker does about it."""
    stack = Stack(node_a, node_b, images)
    try:
        stack.start_ranks(rejoin=True)
        for node, name in (("node-b", stack.rank), ("node-a", stack.server)):
            stack.docker(node, "update", "--restart", "unless-stopped", name)
        deadline = time.monotonic() + 60
        while http(f"{stack.vllm_url}/health", timeout=2)[0] != 200 and time.monotonic() < deadline:
            time.sleep(0.2)
        stack.fault("hang")
        time.sleep(PLAIN_WATCH_S)
        status = stack.docker(
            "node-a", "inspect", "--format", "{{.State.Status}} {{.RestartCount}}", stack.server
        ).out.split()
        answered = http(f"{stack.vllm_url}/health", timeout=2)[0]
        return (
            f"after {PLAIN_WATCH_S:g} s: state {status[0]}, RestartCount {status[1]}, /health "
            f"{'answered ' + str(answered) if answered else 'unanswered'}: never detected"
        )
    finally:
        stack.remove()


def state(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as answer:
        return json.loads(answer.read())


def wait_for_state(url: str, ok, timeout: float, what: str) -> dict:
    """The watchdog's /state once `ok` holds (read every 0.2 s), or Timeout naming the last seen."""
    seen: dict = {}

    def reached() -> bool:
        try:
            seen["last"] = state(url)
        except (OSError, ValueError) as exc:
            seen["last"] = {"error": str(exc)}
            return False
        return bool(ok(seen["last"]))

    wait_for(
        reached, timeout, lambda: f"the watchdog did not reach {what} in {timeout:g} s: {seen.get('last')}"
    )
    return seen["last"]


def worker_pid(node: lab.LabNode, container: str) -> int:
    """The host pid of the container's `VLLM::Worker` (the lab's nodes share this machine's kernel)."""
    top = lab.docker(node, "top", container, "-eo", "pid,comm").out.splitlines()[1:]
    return next(
        int(line.split()[0])
        for line in top
        if line.split()[1:] and line.split()[1].startswith("VLLM::Worker")
    )


def real_hang_times(nodes: dict[str, lab.LabNode]) -> tuple[list[tuple[float, float]], float]:
    """(seconds to detection, seconds to the world serving again) of REAL_HANGS hangs of the real
    engine, and the watchdog's own bound, on one stack deployed by the real Pulumi engine."""
    from bench.engine import REAL_STACK, bench_stack, up
    from engine import ensure_engine
    from engine.lab_stack import real_engine_config
    from lab import tiny_qwen35
    from lab.standin_hub import StandinHub
    from lab.vllm_cpu_image import vllm_cpu_image

    times, bound = [], float("nan")
    with tempfile.TemporaryDirectory() as folder:
        engine = ensure_engine(backend=Path(folder))
        (image,) = {vllm_cpu_image(node)[0] for node in nodes.values()}
        with StandinHub({tiny_qwen35.REPO_ID: tiny_qwen35.write(Path(folder) / "tiny")}) as hub:
            config = real_engine_config(
                image, hub.endpoint, health=REAL_HEALTH, bench={"mode": "off"}, answers={"mode": "off"}
            )
            with bench_stack(engine, f"{REAL_STACK}-health", config):
                first = up(engine, f"{REAL_STACK}-health")
                if first.returncode:
                    raise SystemExit(f"bench health: the real stack's up failed:\n{first.err[-3000:]}")
                outputs = json.loads(
                    engine.run("stack", "output", "--json", stack=f"{REAL_STACK}-health").out
                )
                url = outputs["health"]["state_url"]
                before = wait_for_state(url, lambda s: s.get("state") == "healthy", 300, "healthy")
                bound = before["hang_bound_s"]
                for _ in range(REAL_HANGS):
                    times.append(real_hang(nodes["node-a"], url, bound))
    return times, bound


def real_hang(node: lab.LabNode, url: str, bound: float) -> tuple[float, float]:
    """One SIGSTOP of the head's engine worker: (to detection, to the world serving again)."""
    before = state(url)
    pid = worker_pid(node, "qwen35-vllm")
    os.kill(pid, signal.SIGSTOP)
    stopped = time.time()  # the watchdog stamps its records with this machine's clock
    try:
        found = wait_for_state(
            url, lambda s: len(s["restarts"]) > len(before["restarts"]), bound + 60, "a recovery"
        )
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
    ready = wait_for_state(
        url,
        lambda s: s["state"] == "healthy" and (s.get("last_ready") or 0) > found["restarts"][-1]["at"],
        600,
        "ready",
    )
    return found["last_diagnosis"]["at"] - stopped, ready["last_ready"] - stopped


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} s median of {len(values)} ({min(values):.2f}-{max(values):.2f})"


def real_rows(nodes: dict[str, lab.LabNode]) -> list[tuple[str, str]]:
    times, bound = real_hang_times(nodes)
    detect, ready = [t[0] for t in times], [t[1] for t in times]
    return [
        (
            f"real vLLM: engine hung, /health 200 -> detected (2 s probes, a completion each, 2 failures; "
            f"bound {bound:.0f} s)",
            spread(detect),
        ),
        (
            "real vLLM: hang -> world serving again (every rank restarted, weights loaded again)",
            spread(ready),
        ),
    ]


def print_table(rows: list[tuple[str, str]]) -> None:
    width = max(len(r[0]) for r in rows)
    for name, value in rows:
        print(f"{name.ljust(width)} | {value}")


def main_real() -> int:
    """`python -m bench health-real`: the real engine's rows alone."""
    with lab_session(["node-a", "node-b"]) as nodes:
        print_table(real_rows(nodes))
    return 0


def main(nodes: dict[str, lab.LabNode] | None = None) -> int:
    with lab_session(["node-a", "node-b"]) as session:
        nodes = nodes or session
        node_a, node_b = nodes["node-a"], nodes["node-b"]
        images = {node.name: standin_image(node) for node in (node_a, node_b)}
        print("bench health: the watchdog's cost over a minute ...", file=sys.stderr, flush=True)
        cpu, rss = watchdog_cost(node_a, node_b, images)
        print("bench health: hangs ...", file=sys.stderr, flush=True)
        times = hang_times(node_a, node_b, images)
        print("bench health: the plain alternative ...", file=sys.stderr, flush=True)
        plain = plain_hang(node_a, node_b, images)
        print("bench health: the real engine's hangs ...", file=sys.stderr, flush=True)
        real = real_rows(nodes)
    detect = [t[0] for t in times]
    ready = [t[1] for t in times]
    rows = [
        ("watchdog CPU on the head (probe every 10 s)", f"{cpu:.2f} % of one core over {CPU_WINDOW_S:g} s"),
        ("watchdog RSS on the head", f"{rss:.1f} MB (tini + python3)"),
        (
            "hang -> detected (1 s probes, 2 failures, 0.8 s deadline; bound 2.8 s)",
            f"{statistics.median(detect):.2f} s median of {HANGS} ({min(detect):.2f}-{max(detect):.2f})",
        ),
        (
            "hang -> world ready again (restart_cluster: mp restarts every rank)",
            f"{statistics.median(ready):.2f} s median of {HANGS} ({min(ready):.2f}-{max(ready):.2f})",
        ),
        ("plain: Docker's restart policy on the same hang", plain),
        ("Sparks' defaults: detection bound", "interval 10 s x 3 failures + 5 s deadline = 35 s"),
        *real,
    ]
    print_table(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
