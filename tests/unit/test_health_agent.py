"""The health agent's decisions (components/node_programs/health_agent.py) and the signing scheme
(health_wire): who may ask, for what, and that a refusal changes nothing."""

from __future__ import annotations

import json

import pytest

from components.health.containers import health_config
from components.node_programs import health_wire
from components.node_programs.health_agent import Agent, AgentSettings
from tests.support.program import config_from

SECRET = "s3cret" * 8
NOW = 1_800_000_000.0


def agent_for(node_index: int = 1) -> tuple[Agent, list[tuple]]:
    cfg = config_from("dev")
    settings = AgentSettings.from_json(health_config(cfg, cfg.nodes[node_index]))
    calls: list[tuple] = []

    def docker(what: str, name: str, *args):
        calls.append((what, name, *args))
        if what == "inspect":
            return {"name": name, "state": "running"}
        if what == "logs":
            return ["a line"]
        if what == "events":
            return [{"at": args[0] + 1, "action": "oom", "name": name[0]}], None
        return {"ok": True}

    return Agent(settings, SECRET, docker, lambda: (42 * 10**9, None), clock=lambda: NOW), calls


def request(
    agent: Agent,
    path: str,
    payload: dict,
    secret: str | None = SECRET,
    at: float = NOW,
    node: str = "spark-2",
):
    body = json.dumps(payload).encode()
    headers = {}
    if secret is not None:
        signed = health_wire.signed_headers(secret, "POST", path, body, at, node=node)
        headers = {k.lower(): v for k, v in signed.items()}
    return agent.handle("POST", path, headers, body)


def test_the_agent_acts_on_its_own_node_s_stack_containers_only():
    agent, calls = agent_for()
    assert agent.s.node == "spark-2" and agent.s.containers == ("qwen35-ray-worker",)
    assert agent.s.host == "192.168.200.13" and agent.s.port == 29593
    answer = request(agent, health_wire.AGENT_STOP, {"name": "qwen35-ray-worker"})
    assert answer.status == 200 and calls == [("stop", "qwen35-ray-worker", 30)]


@pytest.mark.parametrize(
    ("secret", "at", "why"),
    [
        (None, NOW, "no signature"),
        ("wrong", NOW, "a wrong signature"),
        (SECRET, NOW - 120, "more than 60 s"),
        (SECRET, NOW + 61, "more than 60 s"),
    ],
)
def test_an_unsigned_wrongly_signed_or_stale_request_is_refused_counted_and_changes_nothing(secret, at, why):
    agent, calls = agent_for()
    answer = request(agent, health_wire.AGENT_RESTART, {"name": "qwen35-ray-worker"}, secret, at)
    assert answer.status == 401 and why in answer.body["error"]
    assert calls == [] and agent.refusals == 1
    assert 'qwen35_health_agent_refusals_total{node="spark-2"} 1' in agent.metrics()


def test_a_signature_covers_the_body_and_the_path():
    agent, calls = agent_for()
    body = json.dumps({"name": "qwen35-ray-worker"}).encode()
    signed = health_wire.signed_headers(SECRET, "POST", health_wire.AGENT_LOGS, body, NOW, node="spark-2")
    headers = {k.lower(): v for k, v in signed.items()}
    # The signature of a /logs request replayed against /stop, and a changed body: both refused.
    assert agent.handle("POST", health_wire.AGENT_STOP, headers, body).status == 401
    assert agent.handle("POST", health_wire.AGENT_LOGS, headers, body + b" ").status == 401
    assert calls == [] and agent.refusals == 2


@pytest.mark.parametrize("name", ["qwen35-vllm", "other-stack-ray-worker", "", None, "../x"])
def test_a_signed_request_for_another_container_is_refused(name):
    agent, calls = agent_for()
    answer = request(agent, health_wire.AGENT_STOP, {"name": name})
    assert answer.status == 403 and calls == []


def test_signed_reads_answer_memory_containers_and_logs():
    agent, _ = agent_for()
    assert request(agent, health_wire.AGENT_MEMINFO, {}).body["available_bytes"] == 42 * 10**9
    (found,) = request(agent, health_wire.AGENT_CONTAINERS, {}).body["containers"]
    assert found == {"name": "qwen35-ray-worker", "state": "running"}
    answer = request(agent, health_wire.AGENT_LOGS, {"name": "qwen35-ray-worker", "tail": 5})
    assert answer.body["lines"] == ["a line"]


def test_metrics_need_no_signature():
    agent, _ = agent_for()
    answer = agent.handle("GET", health_wire.METRICS_PATH, {}, b"")
    assert answer.status == 200 and "qwen35_health_agent_refusals_total" in answer.body["metrics"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("MemTotal: 128 kB\nMemAvailable:   61000000 kB\n", 61000000 * 1024),
        ("MemAvailable: 5\n", 5 * 1024),
        ("MemFree: 5 kB\n", None),
    ],
)
def test_mem_available(text, expected):
    assert health_wire.mem_available(text) == expected


def test_held_message_names_the_node_and_the_figures():
    assert health_wire.held_message("node-b", 61 * 10**9, 70 * 10**9) == (
        "node-b: MemAvailable 61 GB, 70 GB needed: unified memory is held; reboot node-b"
    )


def test_docker_log_frames_are_demultiplexed():
    frame = b"\x01\x00\x00\x00" + (6).to_bytes(4, "big") + b"one\ntw"
    frame += b"\x02\x00\x00\x00" + (3).to_bytes(4, "big") + b"o\n!"
    assert health_wire.demux_logs(frame) == ["one", "two", "!"]
    assert health_wire.demux_logs(b"plain\ntext\n") == ["plain", "text"]


def test_the_secret_is_read_from_its_file_before_the_environment(tmp_path, monkeypatch):
    from components.node_programs import health_wire

    monkeypatch.setenv(health_wire.SECRET_ENV, "from-the-environment")
    path = tmp_path / "secret"
    assert health_wire.read_secret(str(path)) == "from-the-environment"  # no file: the fallback
    path.write_text("from-the-file\n")
    assert health_wire.read_secret(str(path)) == "from-the-file"
    monkeypatch.delenv(health_wire.SECRET_ENV)
    path.unlink()
    assert health_wire.read_secret(str(path)) == ""


@pytest.mark.parametrize("length", ["-1", "abc"])
def test_a_bad_content_length_is_refused_before_any_read(length):
    import socket
    import threading

    from components.node_programs.health_agent import serve

    agent, calls = agent_for()
    with socket.socket() as probe:  # a free loopback port
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = serve(agent, "127.0.0.1", port)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
            conn.sendall(f"POST /stop HTTP/1.1\r\nHost: x\r\nContent-Length: {length}\r\n\r\n".encode())
            answer = conn.recv(200).decode(errors="replace")
        assert answer.startswith("HTTP/1.0 400") or answer.startswith("HTTP/1.1 400"), answer
        assert calls == []
    finally:
        server.shutdown()
        server.server_close()


# ---- issue 41 item 7: replays, the node a request is for, the clocks -------------------------------------


def test_a_replayed_signed_request_is_refused_within_the_window_and_changes_nothing():
    """One /stop replayed at +0, +30 and +59 s stopped the container three times before nonces."""
    agent, calls = agent_for()
    body = json.dumps({"name": "qwen35-ray-worker"}).encode()
    signed = health_wire.signed_headers(SECRET, "POST", health_wire.AGENT_STOP, body, NOW, node="spark-2")
    headers = {k.lower(): v for k, v in signed.items()}
    answers = []
    for later in (0, 30, 59, 61):
        agent.clock = lambda later=later: NOW + later
        answers.append(agent.handle("POST", health_wire.AGENT_STOP, headers, body))
    assert [a.status for a in answers] == [200, 401, 401, 401]
    assert "replayed" in answers[1].body["error"] and "replayed" in answers[2].body["error"]
    assert "more than 60 s" in answers[3].body["error"]  # past the window: the time check refuses it
    assert calls == [("stop", "qwen35-ray-worker", 30)] and agent.refusals == 3
    fresh = request(agent, health_wire.AGENT_MEMINFO, {}, at=NOW + 61)  # the next request prunes
    assert fresh.status == 200 and len(agent.nonces) == 1, "a nonce outlived the window it guards"


def test_a_request_replayed_to_a_restarted_agent_is_refused(tmp_path):
    """The agent keeps the nonces it accepted in its container's filesystem: Docker restarting it (a
    crash, its policy) does not make a request replayed within the window pass again."""
    cfg = config_from("dev")
    settings = AgentSettings.from_json(health_config(cfg, cfg.nodes[1]))
    calls: list[tuple] = []

    def docker(what, name, *args):
        calls.append((what, name, *args))
        return {"ok": True} if what != "inspect" else {"name": name, "state": "running"}

    kept = str(tmp_path / "nonces.json")
    first = Agent(settings, SECRET, docker, lambda: (1, None), clock=lambda: NOW, nonce_file=kept)
    body = json.dumps({"name": "qwen35-ray-worker"}).encode()
    signed = health_wire.signed_headers(SECRET, "POST", health_wire.AGENT_STOP, body, NOW, node="spark-2")
    headers = {k.lower(): v for k, v in signed.items()}
    assert first.handle("POST", health_wire.AGENT_STOP, headers, body).status == 200
    again = Agent(settings, SECRET, docker, lambda: (1, None), clock=lambda: NOW + 20, nonce_file=kept)
    replayed = again.handle("POST", health_wire.AGENT_STOP, headers, body)
    assert replayed.status == 401 and "replayed" in replayed.body["error"], replayed.body
    assert [c for c in calls if c[0] == "stop"] == [("stop", "qwen35-ray-worker", 30)]
    # Past the window the file holds nothing a later start needs: a start after it loads none.
    later = Agent(settings, SECRET, docker, lambda: (1, None), clock=lambda: NOW + 120, nonce_file=kept)
    assert later.nonces == {}
    # A file that cannot be read (truncated by a crash of the disk, say): the agent starts without.
    (tmp_path / "nonces.json").write_text("{not json")
    assert Agent(settings, SECRET, docker, lambda: (1, None), clock=lambda: NOW, nonce_file=kept).nonces == {}


@pytest.mark.parametrize("node", ["spark-1", "spark-3", ""])
def test_a_request_signed_for_another_node_is_refused(node):
    agent, calls = agent_for()
    answer = request(agent, health_wire.AGENT_STOP, {"name": "qwen35-ray-worker"}, node=node)
    assert answer.status == 401 and "another node" in answer.body["error"] and calls == []


@pytest.mark.parametrize("nonce", ["", "abc", "G" * 32, "a" * 33])
def test_a_request_without_a_well_formed_nonce_is_refused(nonce):
    agent, calls = agent_for()
    body = json.dumps({"name": "qwen35-ray-worker"}).encode()
    signed = health_wire.signed_headers(SECRET, "POST", health_wire.AGENT_STOP, body, NOW, node="spark-2")
    headers = {k.lower(): v for k, v in signed.items()}
    headers[health_wire.NONCE_HEADER.lower()] = nonce
    assert agent.handle("POST", health_wire.AGENT_STOP, headers, body).status == 401 and calls == []


def test_every_answer_carries_the_agent_s_clock_so_the_watchdog_can_name_a_skew():
    agent, _ = agent_for()
    assert request(agent, health_wire.AGENT_MEMINFO, {}).body["clock"] == NOW
    stale = request(agent, health_wire.AGENT_MEMINFO, {}, at=NOW - 75)
    assert stale.status == 401 and stale.body["clock"] == NOW
    assert "this node's clock is 75 s ahead of the caller's" in stale.body["error"]


def test_the_watchdog_s_client_measures_an_agent_s_clock_skew_from_a_refusal():
    import threading

    from components.node_programs.health_agent import serve
    from components.node_programs.watchdog_world import Agent as Client
    from tests.support.ports import free_port

    agent, calls = agent_for()
    agent.clock = lambda: __import__("time").time() + 75
    port = free_port()
    server = serve(agent, "127.0.0.1", port)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        client = Client(f"127.0.0.1:{port}", SECRET, "spark-2")
        with pytest.raises(OSError, match="401"):
            client.call(health_wire.AGENT_MEMINFO, {})
        assert client.skew_s is not None and 74 < client.skew_s < 76 and calls == []
    finally:
        server.shutdown()
        server.server_close()


# ---- the memory guard on an agent's node (issue 41 item 6) --------------------------------------------


class Node:
    """A fake node for the guard: MemAvailable, which of its containers run, a clock."""

    def __init__(self, available: int | None = 100 * 10**9) -> None:
        self.available, self.now, self.running = available, NOW, {"qwen35-ray-worker": True}
        # How each container ends when stopped: 0 on SIGTERM, 137 when SIGKILL had to end it.
        self.exit_code = {"qwen35-ray-worker": 0}

    def meminfo(self):
        return self.available, None if self.available is not None else "unreadable"


def guarded_agent(mode: str = "enforce", **health) -> tuple[Agent, Node, list[tuple]]:
    cfg = config_from("dev", health={"mode": mode, **health})
    node = Node()
    calls: list[tuple] = []

    def docker(what: str, name: str, *args):
        if what == "inspect":
            running = node.running.get(name)
            return {"name": name, "state": "running" if running else "exited",
                    "exit_code": None if running else node.exit_code.get(name)}  # fmt: skip
        calls.append((what, name, *args))
        node.running[name] = what != "stop"
        return {"ok": True}

    settings = AgentSettings.from_json(health_config(cfg, cfg.nodes[1]))
    return Agent(settings, SECRET, docker, node.meminfo, clock=lambda: node.now), node, calls


def test_the_agent_s_guard_stops_its_serving_container_once_and_reports_the_trip():
    agent, node, calls = guarded_agent()
    assert (agent.s.memory_floor_bytes, agent.s.memory_floor_s) == (2 * 10**9, 5)
    node.available = int(1.2 * 10**9)
    for second in range(12):  # one check a second, as its thread makes them
        agent.guard.check(NOW + second)
    # The guard's own bound (health.guard_stop_s, 10 s), not the container's 30 s grace.
    assert calls == [("stop", "qwen35-ray-worker", 10)]
    answer = request(agent, health_wire.AGENT_CONTAINERS, {})
    guard = answer.body["guard"]
    assert guard["trips"] == 1 and guard["last"]["at"] == NOW + 5 and guard["last"]["acted"]
    assert guard["last"]["stops"] == {"qwen35-ray-worker": {"stop_s": 10, "exit_code": 0, "killed": False}}
    assert guard["last"]["message"] == (
        "spark-2: MemAvailable 1.2 GB below the memory floor 2.0 GB for 5 s: stopped qwen35-ray-worker "
        "before the kernel's OOM killer or a hang"
    )
    assert 'qwen35_health_agent_memory_guard_trips_total{node="spark-2"} 1' in agent.metrics()
    assert 'qwen35_health_agent_actions_total{node="spark-2"} 1' in agent.metrics()


@pytest.mark.parametrize(
    ("guard_stop_s", "exit_code", "killed", "said"),
    [
        (10, 137, True, " (qwen35-ray-worker SIGKILLed after 10 s)"),  # still running after 10 s
        (3, 143, False, ""),  # ended by SIGTERM within its 3 s
    ],
)
def test_the_guard_s_stop_is_bounded_by_guard_stop_s_and_records_a_kill(
    guard_stop_s, exit_code, killed, said
):
    agent, node, calls = guarded_agent(guard_stop_s=guard_stop_s)
    node.exit_code["qwen35-ray-worker"] = exit_code
    node.available = int(1.2 * 10**9)
    for second in range(7):
        agent.guard.check(NOW + second)
    assert calls == [("stop", "qwen35-ray-worker", guard_stop_s)]
    last = agent.guard.report()["last"]
    assert last["stops"]["qwen35-ray-worker"] == {
        "stop_s": guard_stop_s,
        "exit_code": exit_code,
        "killed": killed,
    }
    assert last["message"].endswith("before the kernel's OOM killer or a hang" + said), last["message"]


@pytest.mark.parametrize(
    ("samples", "trip_at"),
    [
        # (second, MemAvailable GB) -> when the guard trips (None: it does not)
        ([(0, 1.0), (4, 1.0), (5, 1.0)], 5),
        ([(0, 1.0), (4, 1.0)], None),
        ([(0, 1.0), (3, 3.0), (4, 1.0), (8, 1.0), (9, 1.0)], 9),  # back above restarts the clock
        ([(0, 1.0), (3, None), (4, 1.0), (9, 1.0)], 9),  # an unreadable sample restarts it too
        ([(0, 2.0), (10, 2.0)], None),  # at the floor is not below it
    ],
)
def test_the_guard_trips_after_memory_floor_s_below_the_floor(samples, trip_at):
    agent, node, calls = guarded_agent()
    tripped = []
    for second, value in samples:
        node.available = None if value is None else int(value * 10**9)
        if agent.guard.check(NOW + second):
            tripped.append(second)
    assert tripped == ([] if trip_at is None else [trip_at])


def test_the_guard_stops_nothing_when_nothing_of_the_stack_runs_and_stays_armed():
    agent, node, calls = guarded_agent()
    node.running["qwen35-ray-worker"] = False
    node.available = 10**9
    assert [agent.guard.check(NOW + s) for s in range(8)] == [None] * 8 and calls == []
    node.running["qwen35-ray-worker"] = True  # started again while memory is still short
    assert agent.guard.check(NOW + 9) and calls == [("stop", "qwen35-ray-worker", 10)]


def test_under_report_the_agent_s_guard_records_and_stops_nothing():
    agent, node, calls = guarded_agent("report")
    node.available = 10**9
    for second in range(10):
        agent.guard.check(NOW + second)
    assert calls == [] and agent.guard.trips == 1
    assert "report mode: would stop qwen35-ray-worker" in agent.guard.last["message"]


def test_a_floor_of_0_turns_the_agent_s_guard_off():
    agent, node, calls = guarded_agent(memory_floor_gb=0)
    node.available = 0
    assert [agent.guard.check(NOW + s) for s in range(10)] == [None] * 10 and calls == []


# ---- what a diagnosis records: Docker's OOMKilled, the kernel's OOM kills and Xids (item 8) ----------

OOM_LINE = (
    "Out of memory: Killed process 1234 (python3) total-vm:131234567kB, anon-rss:98765432kB, "
    "file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:196608kB oom_score_adj:0"
)
OOM_TASK = (
    "oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=docker-0af3.scope,mems_allowed=0,"
    "global_oom,task_memcg=/system.slice/docker-0af3.scope,task=python3,pid=1234,uid=0"
)
XID_79 = "NVRM: Xid (PCI:000f:01:00): 79, pid=2345, name=python3, GPU has fallen off the bus."


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (
            f"6,1201,5678901234,-;{OOM_LINE}",
            {"kind": "oom_kill", "uptime_s": 5678.901234, "pid": 1234, "process": "python3", "scope": "node",
             "anon_rss_bytes": 98765432 * 1024},
        ),
        (
            f"[ 5678.901234] {OOM_LINE}",
            {"kind": "oom_kill", "uptime_s": 5678.901234, "pid": 1234, "process": "python3", "scope": "node",
             "anon_rss_bytes": 98765432 * 1024},
        ),
        (
            "[   12.500000] Memory cgroup out of memory: Killed process 77 (vllm) total-vm:1kB, "
            "anon-rss:2kB, file-rss:0kB",
            {"kind": "oom_kill", "uptime_s": 12.5, "pid": 77, "process": "vllm", "scope": "cgroup",
             "anon_rss_bytes": 2048},
        ),
        (
            f"[ 5679.000001] {XID_79}",
            {"kind": "xid", "uptime_s": 5679.000001, "xid": 79, "device": "PCI:000f:01:00", "pid": 2345,
             "process": "python3", "meaning": "GPU has fallen off the bus",
             "text": "GPU has fallen off the bus."},
        ),
        (
            "4,99,1500000,-;NVRM: Xid (PCI:0000:01:00): 31, pid='<unknown>', name=<unknown>, Ch 00000008, "
            "intr 10000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f12_34560000",
            {"kind": "xid", "uptime_s": 1.5, "xid": 31, "device": "PCI:0000:01:00", "pid": None,
             "process": "<unknown>", "meaning": "GPU memory page fault",
             "text": "Ch 00000008, intr 10000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ "
             "0x7f12_34560000"},
        ),
        (
            "NVRM: Xid (PCI:0000:01:00): 13, Graphics SM Warp Exception on (GPC 0, TPC 0, SM 0): "
            "Out Of Range",
            {"kind": "xid", "uptime_s": None, "xid": 13, "device": "PCI:0000:01:00", "pid": None,
             "process": None, "meaning": "graphics engine exception",
             "text": "Graphics SM Warp Exception on (GPC 0, TPC 0, SM 0): Out Of Range"},
        ),
        ("6,1,2,-;NET: Registered PF_INET6 protocol family", None),
        ("[    0.000000] Linux version 6.11.0-1016-nvidia", None),
    ],
)  # fmt: skip
def test_kernel_lines_parse_as_faults(line, expected):
    assert health_wire.kernel_fault(line) == expected


def test_an_oom_kill_names_the_killed_task_s_container_cgroup():
    text = f"6,1,5000000,-;{OOM_TASK}\n6,2,5000001,-;{OOM_LINE}\n6,3,6000000,-;{XID_79}\n"
    (oom, xid) = health_wire.kernel_faults(text)
    assert oom["memcg"] == "/system.slice/docker-0af3.scope" and oom["pid"] == 1234 and xid["xid"] == 79


def test_the_kernel_log_is_read_bounded_and_never_fails(tmp_path):
    missing = tmp_path / "kmsg"
    text, why = health_wire.read_kernel_log(str(missing))
    assert text is None and why.startswith(f"cannot read the kernel's log at {missing}")
    assert health_wire.recent_kernel_faults(str(missing), 0) == {"faults": [], "error": why}
    missing.write_text("x" * 100 + f"\n[ 10.0] {OOM_LINE}\n")
    text, why = health_wire.read_kernel_log(str(missing), limit=len(OOM_LINE) + 20)
    assert why is None and text.startswith("[ 10.0] Out of memory") and "x" not in text


def test_faults_are_kept_from_since_on_with_their_unix_time():
    faults = [{"kind": "xid", "uptime_s": 100.0}, {"kind": "xid", "uptime_s": 900.0}, {"kind": "xid"}]
    kept = health_wire.faults_since(faults, boot=1000.0, since=1500.0)
    assert [f.get("at") for f in kept] == [1900.0, None]
    assert len(health_wire.faults_since(faults, boot=None, since=1500.0)) == 3


def test_the_agent_answers_its_node_s_kernel_faults(tmp_path):
    log = tmp_path / "kmsg"
    log.write_text(f"[ 5.0] {XID_79}\n")
    agent, _, _ = guarded_agent()
    agent.kernel_log = str(log)
    answer = request(agent, health_wire.AGENT_KERNEL, {"since": 0})
    assert answer.status == 200 and answer.body["error"] is None
    assert [f["xid"] for f in answer.body["faults"]] == [79]
    agent.kernel_log = str(tmp_path / "absent")
    answer = request(agent, health_wire.AGENT_KERNEL, {"since": "not a time"})
    assert answer.status == 200 and answer.body["faults"] == [] and "cannot read" in answer.body["error"]


@pytest.mark.parametrize("oom", [True, False])
def test_inspect_reports_docker_s_oom_killed(monkeypatch, oom):
    from components.node_programs import engine_api

    found = {"Id": "abc", "RestartCount": 0, "State": {"Status": "exited", "ExitCode": 137, "OOMKilled": oom}}
    monkeypatch.setattr(engine_api, "get_json", lambda socket, url, timeout: (200, found))
    assert health_wire.inspect("/var/run/docker.sock", "qwen35-vllm")["oom_killed"] is oom


def test_the_memory_probe_runs_beside_a_stack_container_only_and_one_at_a_time():
    """`/memory_probe` (issue 41 item 4): the image of one of this stack's containers on this node,
    nothing else (a probe container takes the server's GPU access); a second one while one runs: 409."""
    agent, calls = agent_for()
    answer = request(agent, health_wire.AGENT_MEMORY_PROBE, {"name": "someone-elses"})
    assert answer.status == 403 and calls == []
    answer = request(agent, health_wire.AGENT_MEMORY_PROBE, {"name": "qwen35-ray-worker"})
    assert answer.status == 200 and calls == [("memory_probe", "qwen35-ray-worker")]
    assert agent.probing.acquire(blocking=False)  # a probe in flight
    try:
        answer = request(agent, health_wire.AGENT_MEMORY_PROBE, {"name": "qwen35-ray-worker"})
    finally:
        agent.probing.release()
    assert answer.status == 409 and "already runs on spark-2" in answer.body["error"]
    assert calls == [("memory_probe", "qwen35-ray-worker")]


def test_the_agent_answers_docker_s_events_of_its_own_stack_containers_only():
    """`/events` (issue 53): the node's Docker events for this node's stack containers, never another
    name, from the watchdog's `since` to its `until` (now when absent)."""
    agent, calls = agent_for()
    answer = request(agent, health_wire.AGENT_EVENTS, {"since": NOW - 30, "until": NOW - 1})
    assert answer.status == 200 and answer.body["error"] is None
    assert answer.body["events"] == [{"at": NOW - 29, "action": "oom", "name": "qwen35-ray-worker"}]
    assert calls == [("events", ("qwen35-ray-worker",), NOW - 30, NOW - 1)]
    request(agent, health_wire.AGENT_EVENTS, {"since": NOW - 10})
    assert calls[-1] == ("events", ("qwen35-ray-worker",), NOW - 10, NOW)
    assert request(agent, health_wire.AGENT_EVENTS, {"since": "yesterday"}).status == 400
    unsigned = request(agent, health_wire.AGENT_EVENTS, {"since": NOW - 10}, secret=None)
    assert unsigned.status == 401 and len(calls) == 2
