"""The health stage under the real engine: `up` creates the watchdog and the agent after
the gate; refresh is clean while they run; an upgrade that replaces the watchdog keeps its restart
history (the state volume outlives its container); destroy removes them and the volume.

One stack of its own (`engine-health`, the lab's Ray stack under `health.mode: enforce` with short
intervals): the shared lab stack runs `report`, and this one must act once to have a history.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

import lab
from engine.lab_stack import write_config
from lab.standin_vllm import FAULT_PATH
from tests.engine.conftest import (
    CONTAINER,
    HEALTH_SECRET,
    VOLUME,
    Stack,
    answers,
    changes,
    finished,
    secret_stack,
    steps,
    urn_name,
)
from tests.engine.conftest import up_or_fail as up

pytestmark = pytest.mark.engine

NS = "qwen35-spark"
WATCHDOG, AGENT, VOLUME_NAME = "qwen35-watchdog", "qwen35-health-agent", "qwen35-health"
R_AGENT = "qwen35-health-agent-node-b"
SERVER = "qwen35-vllm"
# Short enough for a test, long enough that the lab's stand-in answers within each deadline.
HEALTH = {
    "mode": "enforce",
    "interval_s": 1,
    "deadline_s": 0.5,
    "completion_every": 3,
    "completion_deadline_s": 10,
    "failures": 2,
    "startup_s": 60,
    "ready_s": 90,
    "memory_wait_s": 5,
    "max_restarts": 3,
    "window_s": 3600,
}


def health_config(lab_config, **health) -> dict:
    return lab_config(health={**HEALTH, **health})


@pytest.fixture(scope="module")
def stack(engine, lab_nodes, lab_config, secrets) -> Iterator[Stack]:
    with secret_stack(engine, "engine-health", health_config(lab_config), secrets) as made:
        yield made


@pytest.fixture(scope="module")
def first_up(stack) -> list[dict]:
    return up(stack)


def names_on(node: lab.LabNode, *args: str) -> set[str]:
    return {n for n in lab.docker(node, *args).out.split() if n.startswith("qwen35-")}


def state_of(stack: Stack) -> dict:
    url = stack.run("stack", "output", "--json").json()["health"]["state_url"]
    with urllib.request.urlopen(url, timeout=5) as answer:
        return json.loads(answer.read())


def wait_state(stack: Stack, ok, timeout: float, what: str) -> dict:
    last: dict = {}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            last = state_of(stack)
            if ok(last):
                return last
        except (OSError, ValueError) as exc:
            last = {"error": str(exc)}
        time.sleep(1)
    pytest.fail(f"the watchdog did not reach {what} in {timeout:g} s: {last}", pytrace=False)


def container_id(node: lab.LabNode, name: str) -> str:
    return lab.docker(node, "inspect", "--format", "{{.Id}}", name).out.strip()


def test_up_creates_the_agent_then_the_watchdog_after_the_gate(first_up, stack, lab_nodes):
    order = [n for _, n, op in finished(first_up) if op == "create"]
    assert order.index("qwen35-ready") < order.index(R_AGENT) < order.index(WATCHDOG), order
    created = {(t, n) for t, n, op in finished(first_up) if op == "create"}
    assert {(CONTAINER, WATCHDOG), (CONTAINER, R_AGENT), (VOLUME, VOLUME_NAME)} <= created
    assert any(t == HEALTH_SECRET for t, _ in created), created
    assert {WATCHDOG, SERVER} <= names_on(lab_nodes["node-a"], "ps", "--format", "{{.Names}}")
    assert AGENT in names_on(lab_nodes["node-b"], "ps", "--format", "{{.Names}}")
    assert VOLUME_NAME in names_on(lab_nodes["node-a"], "volume", "ls", "--format", "{{.Name}}")
    state = wait_state(stack, lambda s: s.get("state") == "healthy", 120, "healthy")
    assert state["mode"] == "enforce" and state["budget_left"] == 3, state


def test_refresh_is_clean_while_they_run(first_up, stack):
    clean = stack.run("refresh", "--yes", "--skip-preview", "--expect-no-changes", "--json", check=False)
    assert clean.returncode == 0, changes(clean.events()) or clean.err[-3000:]


@pytest.fixture(scope="module")
def recovered(first_up, stack, lab_nodes, secrets) -> dict:
    """The server crashed once (the stand-in's fault), and the watchdog restarted it."""
    endpoint = stack.run("stack", "output", "endpoint").out.strip().removesuffix("/v1")
    request = urllib.request.Request(
        endpoint + FAULT_PATH, data=json.dumps({"mode": "crash"}).encode(), method="POST"
    )
    request.add_header("Content-Type", "application/json")
    try:
        urllib.request.urlopen(request, timeout=10).close()
    except urllib.error.URLError as exc:
        pytest.fail(f"the stand-in refused the crash fault: {exc}", pytrace=False)
    state = wait_state(
        stack,
        lambda s: s.get("state") == "healthy" and sum((s.get("restarts_total") or {}).values()) >= 1,
        240,
        "healthy again after one restart",
    )
    answers(stack, secrets["api_key"])
    return state


def test_an_upgrade_that_replaces_the_watchdog_keeps_its_restart_history(
    recovered, stack, lab_config, lab_nodes
):
    before_id = container_id(lab_nodes["node-a"], WATCHDOG)
    history = recovered["restarts_total"]
    # A changed watchdog setting: its config (an env variable) changes, so the container is replaced.
    write_config(stack.config, health_config(lab_config, interval_s=2, deadline_s=1))
    events = up(stack)
    ops = {m["op"] for m in steps(events) if urn_name(m["urn"]) == WATCHDOG}
    assert {"delete-replaced", "create-replacement"} <= ops, ops
    assert container_id(lab_nodes["node-a"], WATCHDOG) != before_id
    after = wait_state(stack, lambda s: s.get("state") in ("healthy", "starting"), 120, "up again")
    assert after["restarts_total"] == history, (history, after)
    assert after["budget_left"] == recovered["budget_left"] < 3, (recovered, after)
    assert [r["reason"] for r in after["restarts"]] == [r["reason"] for r in recovered["restarts"]]
    clean = stack.run("refresh", "--yes", "--skip-preview", "--expect-no-changes", "--json", check=False)
    assert clean.returncode == 0, changes(clean.events()) or clean.err[-3000:]


def test_destroy_removes_the_watchdog_the_agent_and_the_volume(first_up, stack, lab_nodes):
    # Last in this module (pytest keeps file order): it needs the stack up once, nothing more.
    stack.run("destroy", "--yes", timeout=900)
    assert not {WATCHDOG} & names_on(lab_nodes["node-a"], "ps", "-a", "--format", "{{.Names}}")
    assert not {AGENT} & names_on(lab_nodes["node-b"], "ps", "-a", "--format", "{{.Names}}")
    assert VOLUME_NAME not in names_on(lab_nodes["node-a"], "volume", "ls", "--format", "{{.Name}}")
