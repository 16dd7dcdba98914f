"""`python -m bench health`: the watchdog in the lab, figures not asserts.

- its cost on the head: CPU (% of one core, from /proc/<pid>/stat over a minute) and RSS, with the
  Sparks' defaults (a /health probe every 10 s, a one-token completion every 6th);
- with the lab's small intervals (a probe every 1 s, 2 failures, a 0.8 s deadline): the time from a
  hang (SIGSTOP of the serving process) to its detection and to the server ready again, median of 3;
- the plain alternative: Docker's restart policy alone on the same hang: the container stays "Up",
  its RestartCount 0, /health unanswered: the policy acts on an exit, never on a hang.
"""

from __future__ import annotations

import os
import statistics
import sys
import time

import lab
from components.health.containers import watchdog_container_name
from lab.sessions import lab_session
from tests.lab.test_mp_standin import standin_image
from tests.support.health_lab import Stack, http

SPARK_DEFAULTS = {"interval_s": 10, "deadline_s": 5, "completion_every": 6, "failures": 3}
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
    ]
    width = max(len(r[0]) for r in rows)
    for name, value in rows:
        print(f"{name.ljust(width)} | {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
