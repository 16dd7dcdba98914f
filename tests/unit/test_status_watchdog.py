"""`status`'s watchdog line: from the head's watchdog /state, each verdict with its next
step; and the node program's bounded read of /state on loopback."""

from __future__ import annotations

import copy
import http.server
import json
import re
import threading
import time

import pytest

from components.config import parse_stack_config
from components.node_programs import node_status
from status import render
from status.verdict import judge
from tests.support.ports import free_port
from tests.support.program import stack_config
from tests.unit.test_status import WATCHDOG_HEALTHY, healthy, running

NOW = 1_800_000_000.0
HEAD = "node-a"


@pytest.fixture(scope="module")
def config():
    return parse_stack_config({k.split(":", 1)[1]: v for k, v in stack_config("lab").items()})


def with_state(**state):
    gathered = healthy()
    gathered["nodes"][HEAD]["now"] = NOW
    gathered["nodes"][HEAD]["watchdog"] = {"state": {**WATCHDOG_HEALTHY, **state}}
    return gathered


def problems(verdict):
    return [(p.node, p.what, p.next) for p in verdict.problems]


def test_healthy_is_one_line_and_no_problem(config):
    verdict = judge(config, with_state())
    assert verdict.cluster["watchdog"] == "healthy (mode report, budget 3/3 left)"
    assert verdict.ok, verdict.problems
    assert re.search(r"\nwatchdog +healthy \(mode report", render.text(verdict, "lab"))


def test_report_mode_shows_what_it_would_have_done(config):
    would = {"at": NOW - 125, "step": "restart_server", "reason": "hang"}
    cell = judge(config, with_state(would=would)).cluster["watchdog"]
    assert "would have restart server (hang) 2027-01-15" in cell and "(2m05s ago)" in cell, cell


def test_recovering_names_the_step_and_says_to_wait(config):
    verdict = judge(
        config,
        with_state(state="recovering", step="restart_server", since=NOW - 30, budget_left=2, next_step=""),
    )
    assert verdict.cluster["watchdog"] == "recovering (restart server, budget 2/3 left)"
    ((node, what, step),) = problems(verdict)
    assert node == "cluster" and "step restart_server since" in what and "(30s ago)" in what
    assert step == "wait: each restart gets health.ready_s (120 s) to be ready"


def test_a_spent_budget_says_when_why_and_how_to_reset(config):
    spent = {"at": NOW - 3600, "why": "3 restarts in 600 s spent; the server needed another (hang)"}
    verdict = judge(config, with_state(state="budget_spent", spent=spent, budget_left=0, next_step=None))
    cell = verdict.cluster["watchdog"]
    assert cell.startswith("budget spent 2027-01-15") and "(1h00m ago)" in cell and "(hang)" in cell
    ((node, what, step),) = problems(verdict)
    assert node == "cluster" and "stopped the server and the cluster" in what and spent["why"] in what
    assert "`pulumi up --refresh`" in step and "resets its budget" in step


def test_the_watchdog_s_own_next_step_is_used_when_it_gives_one(config):
    said = "the restart budget is spent: find the cause, then start them again"
    verdict = judge(config, with_state(state="budget_spent", spent={"at": NOW, "why": "x"}, next_step=said))
    assert problems(verdict)[0][2] == said


def test_memory_held_names_the_node_the_figures_and_the_reboot(config):
    held = {
        "node": "node-b",
        "available_bytes": 61 * 10**9,
        "need_bytes": 70 * 10**9,
        "message": "node-b: MemAvailable 61 GB, 70 GB needed: unified memory is held; reboot node-b",
    }
    verdict = judge(config, with_state(state="memory_held", held=held))
    assert verdict.cluster["watchdog"] == "memory held on node-b: MemAvailable 61 GB, 70 GB needed"
    ((node, what, step),) = problems(verdict)
    assert node == "node-b" and held["message"] in what
    assert step.startswith("reboot node-b") and "`pulumi up --refresh`" in step


def test_memory_that_could_not_be_read_is_no_reason_to_reboot(config):
    held = {"node": "node-b", "available_bytes": None, "need_bytes": 70 * 10**9,
            "message": "node-b: MemAvailable unknown (no answer), 70 GB needed: check the node"}  # fmt: skip
    ((node, _what, step),) = problems(judge(config, with_state(state="memory_held", held=held)))
    assert node == "node-b" and step.startswith("check node-b and its health agent"), step
    assert "reboot" not in step


def test_starting_and_failing_are_shown_not_judged(config):
    starting = judge(config, with_state(state="starting", next_step="wait: no verdict yet"))
    assert starting.cluster["watchdog"] == "starting (wait: no verdict yet)" and starting.ok
    failing = judge(config, with_state(state="failing", consecutive_failures=2, next_step="2 of 3 failed"))
    assert failing.cluster["watchdog"] == "failing (2 of 3 probes in a row; 2 of 3 failed)" and failing.ok


def test_not_deployed_is_the_missing_container_s_problem_alone(config):
    gathered = with_state()
    gathered["nodes"][HEAD]["containers"]["qwen35-watchdog"] = {"present": False}
    gathered["nodes"][HEAD]["watchdog"] = {"error": "http://127.0.0.2:29592/state: [Errno 111] refused"}
    verdict = judge(config, gathered)
    assert verdict.cluster["watchdog"].startswith("not deployed; next: `pulumi up`")
    assert [(p.node, p.what) for p in verdict.problems] == [
        (HEAD, "container qwen35-watchdog does not exist")
    ]


def test_a_running_watchdog_that_does_not_answer_is_a_problem(config):
    gathered = with_state()
    gathered["nodes"][HEAD]["containers"]["qwen35-watchdog"] = running()
    gathered["nodes"][HEAD]["watchdog"] = {"error": "http://127.0.0.2:29592/state: timed out"}
    ((node, what, step),) = problems(judge(config, gathered))
    assert node == HEAD and "does not answer /state: http://127.0.0.2:29592/state: timed out" in what
    assert "docker logs qwen35-watchdog" in step


def test_off_says_so_and_asks_nothing(config):
    raw = {k.split(":", 1)[1]: copy.deepcopy(v) for k, v in stack_config("lab").items()}
    raw["health"] = {"mode": "off"}
    for node in raw["nodes"]:
        node.pop("docker_socket")
    off = parse_stack_config(raw)
    gathered = healthy()
    gathered["nodes"][HEAD]["containers"].pop("qwen35-watchdog")
    gathered["nodes"]["node-b"]["containers"].pop("qwen35-health-agent")
    gathered["nodes"][HEAD].pop("watchdog")
    verdict = judge(off, gathered)
    assert verdict.cluster["watchdog"].startswith("off (health.mode off") and verdict.ok, verdict.problems


def test_an_unreachable_head_is_not_checked(config):
    gathered = with_state()
    gathered["nodes"][HEAD] = {"reachable": False, "error": "timed out"}
    assert judge(config, gathered).cluster["watchdog"].startswith("not checked")


# ---- the node program's read of /state, on loopback ----------------------------------------------


@pytest.fixture
def serve():
    servers = []

    def start(body: bytes, delay_s: float = 0.0) -> str:
        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (the stdlib's name)
                time.sleep(delay_s)
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_args):
                return None

        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}/state"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def test_the_node_program_reads_the_state(serve):
    url = serve(json.dumps(WATCHDOG_HEALTHY).encode())
    assert node_status.watchdog_facts(url) == {"state": WATCHDOG_HEALTHY}


@pytest.mark.parametrize(
    ("body", "error"),
    [
        (b"not json", "answered no JSON"),
        (b'{"x": 1}', "JSON without a `state`"),
        (b"[]", "without a `state`"),
    ],
)
def test_the_node_program_refuses_what_is_not_a_state(serve, body, error):
    assert error in node_status.watchdog_facts(serve(body))["error"]


def test_the_node_program_is_bounded(serve):
    url = serve(b"{}", delay_s=3.0)
    started = time.monotonic()
    found = node_status.watchdog_facts(url, timeout=0.5)
    assert time.monotonic() - started < 2.5 and "timed out" in found["error"], found


def test_nothing_listening_is_an_error_not_an_exception():
    found = node_status.watchdog_facts(f"http://127.0.0.1:{free_port()}/state", timeout=2)
    assert found["error"].startswith("http://127.0.0.1:") and "refused" in found["error"].lower(), found


def test_failing_completions_and_a_skewed_clock_are_named(config):
    """Issue 41: a hang /health hides shows as failed completions; an agent's clock beyond the window
    is a problem of its own (every request to that agent is refused)."""
    skew = "node-b's clock is 75 s ahead of the head's, beyond the agents' 60 s window: …"
    verdict = judge(
        config,
        with_state(
            state="failing", consecutive_failures=0, consecutive_completion_failures=2, next_step="x",
            clock_skew=[skew],
        ),
    )  # fmt: skip
    assert verdict.cluster["watchdog"].startswith("failing (2 of 3 completions in a row")
    step = "synchronise the nodes' clocks (chrony or systemd-timesyncd)"
    assert ("cluster", skew, step) in problems(verdict)


def test_a_memory_guard_trip_is_named_with_its_node_and_figures(config):
    message = (
        "node-b: MemAvailable 1.5 GB below the memory floor 2.0 GB for 6 s: stopped qwen35-ray-worker "
        "before the kernel's OOM killer or a hang"
    )
    trip = {"node": "node-b", "at": NOW - 65, "acted": True, "message": message}
    verdict = judge(config, with_state(memory_guard={"node-b": trip}))
    ((node, what, step),) = problems(verdict)
    assert node == "node-b" and "the memory guard stopped the serving containers" in what
    assert "(1m05s ago)" in what and message in what and "health.memory_floor_gb" in step
    old = {**trip, "at": NOW - 2 * 86400}  # outside the budget's window: history, not a problem
    assert problems(judge(config, with_state(memory_guard={"node-b": old}))) == []


@pytest.mark.parametrize(
    ("fault", "cell", "next_says"),
    [
        ({"kind": "memory", "says": "node-b: qwen35-ray-worker was OOM-killed (Docker's OOMKilled)"},
         "memory fault", "serve.gpu_memory_utilization"),
        ({"kind": "gpu", "says": "node-b: NVRM Xid 79 (GPU has fallen off the bus)"}, "gpu fault", "Xid 79"),
    ],
)  # fmt: skip
def test_a_diagnosed_memory_or_gpu_fault_is_named_instead_of_a_crash(config, fault, cell, next_says):
    state = {"state": "recovering", "step": "restart_cluster", "since": NOW - 5, "budget_left": 2}
    verdict = judge(config, with_state(**state, last_diagnosis={"fault": fault}))
    assert verdict.cluster["watchdog"].endswith(f"; {cell}")
    named = [p for p in problems(verdict) if "last diagnosis names" in p[1]]
    assert named and fault["says"] in named[0][1] and next_says in named[0][2]
