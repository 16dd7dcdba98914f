"""The readiness probe for real: shipped over SSH to a lab node (`python3 -`, as the gate does on the
head), probing a stand-in OpenAI-compatible server on the node's address, with the log tail read by
`docker logs` on the node's own daemon. Ray is skipped explicitly here (tests/lab/test_e2e.py runs
the real Ray path)."""

from __future__ import annotations

import time
import uuid

import pytest

import lab
from components.node_programs.readiness import LOG_TAIL_LINES, Exit
from components.readiness_gate import GateFailed, ReadinessGateProvider, ensure
from tests.support.lab_nodes import node_dict
from tests.support.standin_openai import StandinServer, probe_props

pytestmark = pytest.mark.lab

MODEL = "qwen3.5-lab"
API_KEY = "sk-lab-readiness"


@pytest.fixture
def server(node_a):
    # Bound to node-a's own address: the probe on node-a reaches it as a server on the head.
    srv = StandinServer(node_a.host, 0, MODEL, api_key=API_KEY).start()
    yield srv
    srv.shutdown()
    srv.server_close()


@pytest.fixture
def server_log(node_a):
    """A running container on node-a whose log has 40 numbered lines (stands in for the vLLM server)."""
    lab.busybox_image(node_a)
    name = f"qwen35-readiness-{uuid.uuid4().hex[:8]}"
    script = "i=1; while [ $i -le 40 ]; do echo engine-log-line-$i; i=$((i+1)); done; exec sleep 600"
    lab.docker(
        node_a, "run", "-d", "--name", name, "--network", "host", lab.images.BUSYBOX_TAG, "sh", "-c", script
    )
    # The log is complete before the probe reads it.
    deadline = time.monotonic() + 10
    while "engine-log-line-40" not in lab.docker(node_a, "logs", name).out and time.monotonic() < deadline:
        time.sleep(0.1)
    yield name
    lab.docker(node_a, "rm", "-f", name, check=False)


def props(node, server, log_container: str | None = None, api_key: str | None = API_KEY) -> dict:
    return probe_props(node_dict(node), server, api_key=api_key, log_container=log_container)


def test_healthy_server_passes_on_the_node(node_a, server):
    report = ensure(props(node_a, server))["report"]
    assert report["completion_tokens"] == 2 and report["model"] == MODEL
    assert server.requests == ["GET /health", "GET /v1/models", "POST /v1/chat/completions"]


def test_gate_create_and_read(node_a, server):
    provider = ReadinessGateProvider()
    p = props(node_a, server)
    created = provider.create(p)
    assert created.outs["ready"] is True and created.id.startswith("node-a-")
    assert provider.read(created.id, created.outs).id == created.id
    # A server that stops answering makes refresh report the gate gone (drift).
    server.mode = "unhealthy"
    p_short = {**created.outs, "deadline_s": 2}
    assert provider.read(created.id, p_short).id in ("", None)


def test_unhealthy_server_times_out_naming_the_stage(node_a, server, server_log):
    server.mode = "unhealthy"
    with pytest.raises(GateFailed) as caught:
        ensure({**props(node_a, server, server_log), "deadline_s": 3})
    message = str(caught.value)
    assert caught.value.returncode == Exit.TIMEOUT
    assert "stuck at stage 'health'" in message and "/health answered 500" in message


def test_never_ready_times_out_with_the_log_tail(node_a, server, server_log):
    server.mode = "loading"
    with pytest.raises(GateFailed) as caught:
        ensure({**props(node_a, server, server_log), "deadline_s": 3})
    message = str(caught.value)
    assert "not ready after 3 s" in message
    assert f"last {LOG_TAIL_LINES} lines of the server log" in message
    assert "engine-log-line-40" in message and "engine-log-line-11" in message
    assert "engine-log-line-10\n" not in message
    assert "next:" in message


def test_wrong_key_is_rejected_at_once(node_a, server):
    with pytest.raises(GateFailed) as caught:
        ensure({**props(node_a, server, api_key="sk-wrong"), "deadline_s": 60})
    assert caught.value.returncode == Exit.REJECTED
    assert "API key does not match" in str(caught.value)


def test_the_key_never_reaches_the_nodes_process_list(node_a, server):
    # The key travels on stdin; argv (visible in `ps` on the node) carries none of it.
    from components.readiness_gate import probe_argv

    assert API_KEY not in " ".join(probe_argv(props(node_a, server), 20))


def test_exited_server_fails_at_once_with_its_log_tail(node_a, server, server_log):
    server.mode = "unhealthy"
    lab.docker(node_a, "kill", server_log)
    with pytest.raises(GateFailed) as caught:
        ReadinessGateProvider().create(props(node_a, server, log_container=server_log) | {"deadline_s": 60})
    message = str(caught.value)
    # It stopped on the exit instead of waiting out its deadline (the deadline message never appears).
    assert "not ready after" not in message, message
    assert "the server container has exited (exit code 137)" in message, message
    assert "engine-log-line-40" in message, message
