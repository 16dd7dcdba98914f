"""Docker's event log as the watchdog and the agents read it (`health_wire.events`): one bounded read
of `GET /events` that never streams, parsed from the JSON Docker 20.10 writes, against a stand-in
Engine API on a unix socket."""

from __future__ import annotations

import json
import time
import urllib.parse

import pytest

from components.health.containers import health_config
from components.node_programs import health_wire
from components.node_programs.watchdog_settings import Settings
from components.node_programs.watchdog_world import RealWorld
from tests.support.program import config_from
from tests.support.standin_engine import StandinEngine

NAMES = ("qwen35-vllm", "qwen35-ray-head")
AT = 1_796_000_000


def docker_event(action: str, name: str, at: float, cid: str = "c" * 64, **attributes: str) -> dict:
    """One container event as Docker 20.10 writes it on `GET /events` (its `docker events` JSON)."""
    nano = round(at * 1e6) * 1000  # exact to the microsecond
    return {
        "status": action,
        "id": cid,
        "from": "sha256:" + "b" * 64,
        "Type": "container",
        "Action": action,
        "Actor": {"ID": cid, "Attributes": {**attributes, "image": "sha256:" + "b" * 64, "name": name}},
        "scope": "local",
        "time": int(at),
        "timeNano": nano,
    }


def stream(*messages: dict) -> bytes:
    return b"".join(json.dumps(m).encode() + b"\n" for m in messages)


@pytest.fixture
def engine(tmp_path):
    made = StandinEngine(tmp_path)
    yield made
    made.close()


def test_events_are_read_once_for_the_names_and_parsed_from_docker_s_json(engine):
    body = stream(
        docker_event("kill", "qwen35-vllm", AT + 0.25, signal="15"),
        docker_event("die", "qwen35-vllm", AT + 44.5, exitCode="137"),
        docker_event("stop", "qwen35-vllm", AT + 44.6),
        # The daemon's `container` filter matches a prefix: another container's events come too.
        docker_event("die", "qwen35-vllm-memory-probe", AT + 45, exitCode="0"),
        docker_event("exec_start: sh -c true", "qwen35-vllm", AT + 46),  # not a lifecycle event
        {**docker_event("connect", "host", AT), "Type": "network"},  # not a container's
        docker_event("oom", "qwen35-ray-head", AT + 47, cid="d" * 64),
        docker_event("start", "qwen35-vllm", AT + 50, cid="e" * 64),
    )
    engine.routes[("GET", "/events")] = (200, body)
    found, error = health_wire.events(engine.path, AT - 0.5, AT + 60, NAMES, 5.0)
    assert error is None
    assert [(e["action"], e["name"]) for e in found] == [
        ("kill", "qwen35-vllm"),
        ("die", "qwen35-vllm"),
        ("stop", "qwen35-vllm"),
        ("oom", "qwen35-ray-head"),
        ("start", "qwen35-vllm"),
    ]
    kill, die = found[0], found[1]
    assert kill == {
        "at": AT + 0.25,
        "action": "kill",
        "name": "qwen35-vllm",
        "id": "c" * 64,
        "exit_code": None,
        "signal": "15",
    }
    assert die["exit_code"] == 137 and die["signal"] is None and die["at"] == pytest.approx(AT + 44.5)
    assert found[-1]["id"] == "e" * 64
    (asked,) = engine.requests
    path, _, query = asked.removeprefix("GET ").partition("?")
    params = dict(urllib.parse.parse_qsl(query))
    assert path == "/events" and params["since"] == str(AT - 1) and params["until"] == str(AT + 60)
    assert json.loads(params["filters"]) == {"type": ["container"], "container": sorted(NAMES)}


def test_an_until_in_the_future_is_cut_to_now_so_the_daemon_never_streams(engine):
    engine.routes[("GET", "/events")] = (200, b"")
    now = time.time()
    assert health_wire.events(engine.path, now - 30, now + 3600, NAMES, 5.0) == ([], None)
    (asked,) = engine.requests
    until = int(dict(urllib.parse.parse_qsl(asked.partition("?")[2]))["until"])
    assert until <= time.time()


@pytest.mark.parametrize(
    ("answer", "said"),
    [
        ((500, b'{"message": "broken"}'), "the daemon answered 500 for its events: broken"),
        ((400, b"not json"), "the daemon answered 400 for its events: not json"),
    ],
)
def test_a_refused_read_says_why_and_never_raises(engine, answer, said):
    engine.routes[("GET", "/events")] = answer
    assert health_wire.events(engine.path, AT, AT + 10, NAMES, 5.0) == ([], said)


def test_no_daemon_is_an_error_not_an_exception(tmp_path):
    found, error = health_wire.events(str(tmp_path / "none.sock"), AT, AT + 10, NAMES, 1.0)
    assert found == [] and "FileNotFoundError" in error


def test_a_cut_answer_keeps_the_events_before_the_cut():
    body = stream(docker_event("die", "qwen35-vllm", AT, exitCode="1")) + b'{"status": "sta'
    (only,) = health_wire.parse_events(body, NAMES)
    assert only["action"] == "die" and only["exit_code"] == 1


def test_the_watchdog_reads_the_head_s_events_itself_and_another_node_s_from_its_agent(engine):
    cfg = config_from("dev")
    settings = Settings.from_json(health_config(cfg, cfg.head))
    world = RealWorld(settings, "s3cret", None, "/proc/meminfo", engine.path)
    engine.routes[("GET", "/events")] = (200, stream(docker_event("oom", "qwen35-vllm", AT + 1)))
    found, error = world.events("spark-1", AT, AT + 10)
    assert error is None and [(e["action"], e["name"]) for e in found] == [("oom", "qwen35-vllm")]
    filters = json.loads(dict(urllib.parse.parse_qsl(engine.requests[0].partition("?")[2]))["filters"])
    assert filters["container"] == ["qwen35-ray-head", "qwen35-vllm"]  # the head's stack containers
    asked: list[tuple] = []

    def call(path, payload, timeout, skew):
        asked.append((path, payload))
        return {"events": [{"action": "die", "name": "qwen35-ray-worker"}], "error": None}

    world.agents["spark-2"].call = call  # type: ignore[method-assign]
    assert world.events("spark-2", AT, AT + 10) == ([{"action": "die", "name": "qwen35-ray-worker"}], None)
    assert asked == [(health_wire.AGENT_EVENTS, {"since": AT, "until": AT + 10})]

    def refused(path, payload, timeout, skew):
        raise OSError("agent 192.168.200.13:29593 answered 404: no endpoint /events")

    world.agents["spark-2"].call = refused  # type: ignore[method-assign]
    assert world.events("spark-2", AT, AT + 10) == (
        [],
        "its agent did not answer: agent 192.168.200.13:29593 answered 404: no endpoint /events",
    )
