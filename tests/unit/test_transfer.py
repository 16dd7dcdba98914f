"""The transfer layer without nodes: the source-side program run on this machine with stand-in
producers and consumers, the orchestrator's backstop, and the failure classification."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from components import transfer
from components.node_programs import program_argv
from components.node_programs.transfer_sink import Exit as SinkExit
from components.node_programs.transfer_source import Exit as SourceExit
from components.node_programs.wire import NUDGE
from components.remote import SshTarget
from components.transfer import Endpoint, Failure, Stage, Transfer

SOURCE = Endpoint("node-a", SshTarget("10.0.0.1", "ops", "/kh"), "192.168.0.1")
DESTINATION = Endpoint("node-b", SshTarget("10.0.0.2", "ops", "/kh"), "192.168.0.2")
PY = sys.executable

COUNT_INPUT = "import json,sys; n=len(sys.stdin.buffer.read()); print('noise'); print(json.dumps({'got': n}))"


def py(code: str) -> list[str]:
    return [PY, "-c", code]


def spec_for(job: Transfer, stall_s: float = 30, deadline_s: float = 60, peer: dict | None = None) -> dict:
    return {
        "operation": job.operation,
        "node": "node-a",
        "peer_label": "node-b",
        "bytes_total": job.bytes_total,
        "stall_s": stall_s,
        "deadline_s": deadline_s,
        "interval_s": 0.2,
        "stages": [{"name": s.name, "argv": list(s.argv)} for s in job.producers],
        "consumer": {"name": job.consumer.name, "argv": list(job.consumer.argv)},
        "peer": peer,
    }


def run_here(job: Transfer, margin_s: float = 30, **spec_args) -> transfer.TransferResult:
    """`transfer_source run` on this machine (the part run_transfer runs over SSH), then interpreted."""
    spec = spec_for(job, **spec_args)
    argv = program_argv("transfer_source", ["run", json.dumps(spec)], PY)
    outcome = transfer.run_watched(argv, spec["deadline_s"], spec["stall_s"], margin_s=margin_s)
    return transfer.interpret(outcome, SOURCE, DESTINATION, None, job)


def test_a_transfer_counts_bytes_and_returns_every_report(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    job = Transfer(
        "op-ok",
        (
            Stage("make", py("import sys; sys.stdout.buffer.write(b'x' * 3_000_000)")),
            Stage(
                "pass",
                py(
                    "import sys; d=sys.stdin.buffer.read(); sys.stdout.buffer.write(d); "
                    "sys.stderr.write('qwen35-report {\"seen\": %d}\\n' % len(d))"
                ),
            ),  # fmt: skip
        ),
        Stage("count", py(COUNT_INPUT)),
        bytes_total=3_000_000,
    )
    result = run_here(job)
    assert result.ok and result.failure is Failure.NONE, result
    assert result.bytes_sent == 3_000_000 and result.consumer_report == {"got": 3_000_000}
    assert [(s.name, s.status) for s in result.stages] == [("make", 0), ("pass", 0), ("count", 0)]
    assert result.stage("pass").report == {"seen": 3_000_000}
    assert not (tmp_path / ".qwen35" / "progress" / "op-ok.json").exists()  # removed at the end


def test_progress_file_while_running(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    slow = (
        "import sys,time;"
        "[(sys.stdout.buffer.write(b'y'*1000),sys.stdout.flush(),time.sleep(0.6)) for _ in range(5)]"
    )
    job = Transfer("op-slow", (Stage("slow", py(slow)),), Stage("count", py(COUNT_INPUT)), bytes_total=5000)
    done: list[transfer.TransferResult] = []
    runner = threading.Thread(target=lambda: done.append(run_here(job)))
    runner.start()
    path = tmp_path / ".qwen35" / "progress" / "op-slow.json"
    seen = []
    while runner.is_alive():
        # The transfer removes its file once it ends, between any look and read here: a file gone is
        # the end, not a failure (it is replaced whole while it lives, never read half-written).
        with contextlib.suppress(FileNotFoundError):
            seen.append(json.loads(path.read_text()))
        time.sleep(0.1)
    runner.join()
    assert done[0].ok and done[0].bytes_sent == 5000
    assert seen, "no progress file was written while the transfer ran"
    last = seen[-1]
    keys = {"operation", "node", "peer", "stage", "bytes_done", "bytes_total", "rate_bps", "eta_s"}
    assert keys | {"started_at", "updated_at", "pid"} == set(last)
    assert (last["operation"], last["node"], last["peer"], last["bytes_total"]) == (
        "op-slow",
        "node-a",
        "node-b",
        5000,
    )
    assert (
        0 < last["bytes_done"] <= 5000 and last["rate_bps"] > 0 and last["updated_at"] >= last["started_at"]
    )
    assert not path.exists()


def test_a_stalled_producer_is_ended_by_the_watch_on_the_source():
    stuck = "import sys,time; sys.stdout.buffer.write(b'z'*100); sys.stdout.flush(); time.sleep(60)"
    job = Transfer("op-stall", (Stage("stuck", py(stuck)),), Stage("count", py(COUNT_INPUT)))
    result = run_here(job, stall_s=1)
    assert result.failure is Failure.TRANSPORT and result.why.startswith("stalled"), result


def test_a_consumer_still_at_work_after_the_last_byte_is_not_stalled():
    """Every byte sent, the consumer (a destination's `docker load` unpacking) busy longer than the
    stall limit: only the deadline applies then, and the orchestrator's backstop (margin below the
    consumer's work) keeps hearing progress lines."""
    producer = "import sys; sys.stdout.buffer.write(b'y'*1000)"
    slow = COUNT_INPUT.replace("print('noise')", "__import__('time').sleep(3)")
    job = Transfer("op-finishing", (Stage("send", py(producer)),), Stage("slow", py(slow)))
    result = run_here(job, margin_s=1, stall_s=1)
    assert result.ok, result
    assert result.bytes_sent == 1000 and result.consumer_report == {"got": 1000}, result


def test_the_deadline_still_ends_a_consumer_that_never_finishes():
    producer = "import sys; sys.stdout.buffer.write(b'y'*1000)"
    stuck = "import sys,time; sys.stdin.buffer.read(); time.sleep(60)"
    job = Transfer("op-never", (Stage("send", py(producer)),), Stage("stuck", py(stuck)))
    result = run_here(job, stall_s=1, deadline_s=3)
    assert result.failure is Failure.TRANSPORT and result.why.startswith("deadline"), result


def test_the_orchestrators_backstop_ends_a_silent_source():
    """A source that stops answering altogether (no progress line, no report) is killed by the
    orchestrator after the stall limit plus the margin, whatever the source's own watchdog does."""
    outcome = transfer.run_watched(["sleep", "30"], deadline_s=100, stall_s=0.5, margin_s=0.5)
    assert outcome.killed.startswith("no progress from the source") and outcome.returncode != 0
    result = transfer.interpret(outcome, SOURCE, DESTINATION, None, None)
    assert result.failure is Failure.TRANSPORT and "no progress" in result.why
    deadline = transfer.run_watched(
        py("import sys,time\nwhile 1: print(1, file=sys.stderr, flush=True); time.sleep(0.1)"),
        deadline_s=0.5,
        stall_s=30,
        margin_s=0.5,
    )
    assert deadline.killed.startswith("the transfer passed its deadline")


@pytest.mark.parametrize(
    ("producer_code", "consumer_code", "failure", "words"),
    [
        (
            "import sys; sys.stderr.write('disk gone\\n'); sys.exit(3)",
            COUNT_INPUT,
            Failure.STAGE,
            ["make exited 3"],
        ),
        ("print('data')", "import sys; sys.stdin.read(); sys.exit(5)", Failure.STAGE, ["load exited 5"]),
        (
            "print('data')",
            "import sys; sys.stdin.read(); sys.exit(255)",
            Failure.TRANSPORT,
            ["node-a to node-b"],
        ),
    ],
    ids=["producer", "consumer", "link"],
)
def test_failures_are_classified_and_name_both_nodes(producer_code, consumer_code, failure, words):
    job = Transfer("op-fail", (Stage("make", py(producer_code)),), Stage("load", py(consumer_code)))
    result = run_here(job)
    assert result.failure is failure and not result.ok
    message = result.error("copy of x", "nothing was placed", "run again")
    assert all(word in message for word in words + ["node-a", "node-b", "next: run again"]), message
    if failure is Failure.STAGE and "make" in words[0]:
        assert "disk gone" in message  # the failed stage's stderr tail


def test_a_failed_connection_to_the_destination_sends_nothing(tmp_path):
    peer = transfer.Peer(SshTarget("192.168.0.2", "ops", "/kh", name="node-b"), str(tmp_path / "p"))
    fake = {
        "folder": peer.folder,
        "connect_timeout": 1,
        "check": ["false"],
        "connect": py("import sys; sys.stderr.write('Connection refused\\n'); sys.exit(255)"),
        "exit": ["true"],
    }
    marker = tmp_path / "ran"  # the consumer's: it never runs (the producers may have started)
    job = Transfer(
        "op-peer",
        (Stage("make", py("import sys; sys.stdout.write('x' * 1000)")),),
        Stage("count", py(f"open({str(marker)!r}, 'w')")),
    )
    spec = spec_for(job, peer=fake)
    argv = program_argv("transfer_source", ["run", json.dumps(spec)], PY)
    outcome = transfer.run_watched(argv, 60, 30)
    with pytest.raises(transfer.PeerUnreachable) as caught:
        transfer.interpret(outcome, SOURCE, DESTINATION, peer, job)
    message = str(caught.value)
    assert "node-a cannot SSH to destination node-b" in message and "Connection refused" in message
    assert "nothing was sent" in message and not marker.exists()
    time.sleep(0.3)  # the close runs detached
    assert not Path(peer.folder).exists()


def test_the_private_folder_must_be_ours(tmp_path):
    from components.node_programs import transfer_source

    folder = tmp_path / "mine"
    assert transfer_source.own_folder(str(folder)) is True and (folder.stat().st_mode & 0o777) <= 0o700
    assert transfer_source.own_folder(str(folder)) is False  # a retry: an existing folder of ours
    (tmp_path / "link").symlink_to(folder)
    assert transfer_source.own_folder(str(tmp_path / "link")) is None
    status, _ = transfer_source.connect(
        {"folder": str(tmp_path / "link"), "check": ["true"], "connect": ["true"]}
    )
    assert status == SourceExit.PEER_FOLDER


def test_stage_refuses_what_cannot_travel_to_a_node():
    with pytest.raises(ValueError):
        Stage("bad", ["echo", "two\nlines"])
    assert Stage("ok", ("docker", "save", "x:1")).argv == ("docker", "save", "x:1")


SINK = program_argv("transfer_sink", [], PY)


def test_the_sink_becomes_the_consumer_named_in_the_stream():
    header = json.dumps({"argv": py(COUNT_INPUT)}).encode()
    stream = b"%d\n" % len(header) + header + b"x" * 70_000
    done = subprocess.run(SINK, input=stream, capture_output=True, timeout=60)
    assert done.returncode == 0 and json.loads(done.stdout.decode().splitlines()[-1]) == {"got": 70_000}
    nothing = subprocess.run(SINK, input=b"", capture_output=True, timeout=60)
    assert nothing.returncode == 0 and nothing.stdout == b""  # nothing to send: ends quietly


def serve(spec: dict, request: dict | None) -> tuple[list[dict], subprocess.CompletedProcess]:
    argv = program_argv("transfer_source", ["serve", json.dumps(spec)], PY)
    stdin = (json.dumps(request) + "\n").encode() if request is not None else b""
    done = subprocess.run(argv, input=stdin, capture_output=True, timeout=60)
    return [json.loads(line) for line in done.stdout.decode().splitlines() if line.startswith("{")], done


def fake_peer(tmp_path, sink: list[str] | None) -> dict:
    return {
        "folder": str(tmp_path / "peer"),
        "connect_timeout": 1,
        "check": ["false"],
        "connect": ["true"],
        "exit": ["true"],
    }


def counted_run(name: str, size: int, early_sink: bool = True) -> dict:
    """The run request of a transfer of `size` bytes to a counting consumer; with `early_sink`, the
    consumer is the early sink's (the late argv exits 7, so using it fails the test)."""
    job = Transfer(
        name,
        (Stage("make", py(f"import sys; sys.stdout.buffer.write(b'q' * {size})")),),
        Stage("count", py(COUNT_INPUT)),
    )
    run = spec_for(job)
    if early_sink:
        run["consumer"]["sink_argv"] = py(COUNT_INPUT)
        run["consumer"]["argv"] = py("import sys; sys.exit(7)")  # must not be used: the sink is there
    run.pop("peer")
    return run


def test_one_session_inspects_then_transfers_through_the_early_sink(tmp_path):
    spec = {"before": py("print('facts here')"), "peer": fake_peer(tmp_path, SINK), "sink": SINK}
    lines, done = serve(spec, {"run": counted_run("op-serve", 50_000)})
    assert done.returncode == 0, done.stderr
    before, report = lines
    assert before == {"before": {"status": 0, "stdout": "facts here\n", "stderr": ""}}
    assert report["bytes"] == 50_000 and report["consumer_report"] == {"got": 50_000}
    assert [s["status"] for s in report["stages"]] == [0, 0]


def test_a_session_ended_unused_sends_nothing(tmp_path):
    marker = tmp_path / "ran"
    spec = {
        "before": py("print('facts')"),
        "peer": fake_peer(tmp_path, None),
        "sink": py(f"open({str(marker)!r}, 'w').write(open(0).read())"),
    }
    spec["peer"]["exit"] = py("import time; time.sleep(1)")  # a master slow to end
    lines, done = serve(spec, {})
    assert done.returncode == 0 and lines == [{"before": {"status": 0, "stdout": "facts\n", "stderr": ""}}]
    # The connection was ended and its folder removed before the session ended (a skip leaves no
    # master behind when create returns).
    assert not (tmp_path / "peer").exists()
    time.sleep(0.3)
    assert marker.read_text() == ""  # the early sink got end of input: nothing was sent


def becomes_master_then(control: Path, then: list[str]) -> list[str]:
    """A stand-in for the sink's `ssh -o ControlMaster=auto …`: once "authenticated" it has its
    control socket (as a backgrounded master has), then runs `then` as the session's command."""
    code = (
        "import os,socket,sys; s=socket.socket(socket.AF_UNIX); "
        f"s.bind({str(control)!r}); os.execv(sys.argv[1], sys.argv[1:])"
    )
    return [PY, "-c", code, *then]


def test_a_new_connection_and_the_sink_are_one_step(tmp_path):
    """A fresh folder holds no master: the sink's own ssh becomes it; no `-O check`, no separate
    master start (each an ssh start-up on the copy's path)."""
    ran = tmp_path / "two-step"
    peer = fake_peer(tmp_path, None)
    peer["control"] = str(tmp_path / "peer" / "m")
    peer["check"] = py(f"open({str(ran)!r}, 'a').write('check'); raise SystemExit(1)")
    peer["connect"] = py(f"open({str(ran)!r}, 'a').write('connect')")
    sink = becomes_master_then(Path(peer["control"]), SINK)
    lines, done = serve(
        {"before": None, "peer": peer, "sink": sink}, {"run": counted_run("op-one-step", 40_000)}
    )
    assert done.returncode == 0, done.stderr
    assert lines[-1]["preflight"] == 0 and lines[-1]["consumer_report"] == {"got": 40_000}
    assert not ran.exists(), ran.read_text()


def test_a_one_step_connection_that_fails_reports_the_ssh_error(tmp_path):
    from components.node_programs import transfer_source

    peer = {"folder": str(tmp_path / "p"), "control": str(tmp_path / "p" / "m"), "connect_timeout": 1}
    (tmp_path / "p").mkdir()
    refused = py("import sys; sys.stderr.write('Permission denied (publickey).\\n'); sys.exit(255)")
    status, err, sink = transfer_source.connect_with_sink(peer, refused)
    assert (status, sink) == (255, None) and "Permission denied (publickey)" in err
    hangs = py("import time; time.sleep(30)")
    started = time.monotonic()
    peer["connect_timeout"] = 0.1
    status, err, sink = transfer_source.connect_with_sink(peer, hangs)
    assert status == SourceExit.PEER_TIMEOUT and sink is None and time.monotonic() - started < 20


def test_a_failed_one_step_connection_is_tried_again_as_a_master_then_refused(tmp_path):
    """The one-step attempt failed, then the second (two-step) one: nothing is sent (no consumer
    runs), and the run's report carries the second attempt's status and error for PeerUnreachable."""
    marker, retried = tmp_path / "sent", tmp_path / "retried"
    peer = fake_peer(tmp_path, None)
    peer["control"] = str(tmp_path / "peer" / "m")
    peer["connect"] = py(
        f"import sys; open({str(retried)!r}, 'w'); sys.stderr.write('No route to host\\n'); sys.exit(254)"
    )
    sink = py("import sys; sys.stderr.write('Permission denied (publickey).\\n'); sys.exit(255)")
    job = Transfer(  # the consumer never runs (the producers may have started)
        "op-refused",
        (Stage("make", py("import sys; sys.stdout.write('x' * 1000)")),),
        Stage("count", py(f"open({str(marker)!r}, 'w')")),
    )
    run = spec_for(job)
    run.pop("peer")
    lines, done = serve({"before": None, "peer": peer, "sink": sink}, {"run": run})
    assert retried.exists(), "the failed one-step connection was not tried again"
    assert lines[-1]["preflight"] == 254 and "No route to host" in lines[-1]["preflight_stderr"], lines
    assert not marker.exists() and lines[-1]["bytes"] == 0


def test_a_failed_one_step_connection_that_succeeds_the_second_time_still_transfers(tmp_path):
    """A retry that connects: the consumer then runs over the new master (its own session), and
    every byte arrives."""
    peer = fake_peer(tmp_path, None)
    peer["control"] = str(tmp_path / "peer" / "m")
    sink = py("import sys; sys.stderr.write('Connection reset by peer\\n'); sys.exit(255)")
    run = counted_run("op-retried", 30_000, early_sink=False)
    run["consumer"]["sink_argv"] = py("import sys; sys.exit(7)")  # the early sink is gone: not used
    lines, done = serve({"before": None, "peer": peer, "sink": sink}, {"run": run})
    assert done.returncode == 0, done.stderr
    assert lines[-1]["preflight"] == 0 and lines[-1]["consumer_report"] == {"got": 30_000}, lines


def test_the_producers_start_while_the_connection_comes_up(tmp_path):
    """The producers do not wait for the connection to the destination: here the connection comes
    up only once the producer has started (it fails if it waits 20 s for that), and every byte
    arrives."""
    started = tmp_path / "producer-started"
    peer = fake_peer(tmp_path, None)
    peer["connect"] = py(
        "import os, sys, time\n"
        "deadline = time.monotonic() + 20\n"
        f"while not os.path.exists({str(started)!r}) and time.monotonic() < deadline:\n"
        "    time.sleep(0.01)\n"
        f"sys.exit(0 if os.path.exists({str(started)!r}) else 1)"
    )
    job = Transfer(
        "op-overlap",
        (Stage("make", py(f"import sys; open({str(started)!r}, 'w'); sys.stdout.write('q' * 50_000)")),),
        Stage("count", py(COUNT_INPUT)),
    )
    run = spec_for(job)
    run.pop("peer")
    lines, done = serve({"before": None, "peer": peer}, {"run": run})
    assert done.returncode == 0, done.stderr
    assert lines[-1]["preflight"] == 0 and lines[-1]["consumer_report"] == {"got": 50_000}, lines


def test_producers_blocked_on_a_full_pipe_are_ended_when_the_connection_fails(tmp_path):
    pid_file = tmp_path / "producer.pid"
    peer = fake_peer(tmp_path, None)
    peer["connect"] = py(
        "import os, sys, time\n"
        f"while not os.path.exists({str(pid_file)!r}):\n"
        "    time.sleep(0.01)\n"
        "sys.stderr.write('Connection timed out\\n'); sys.exit(255)"
    )
    code = (  # blocks on the full pipe; would outlive a closed pipe (as a slow `docker save` may)
        f"import os, sys, time; open({str(pid_file)!r}, 'w').write(str(os.getpid()))\n"
        "try:\n    sys.stdout.buffer.write(b'q' * (10 << 20))\n"
        "except BrokenPipeError:\n    time.sleep(30)"
    )
    producer = f"exec({code!r})"  # one line: stage arguments carry no newline
    job = Transfer("op-blocked", (Stage("make", py(producer)),), Stage("count", py(COUNT_INPUT)))
    run = spec_for(job)
    run.pop("peer")
    lines, done = serve({"before": None, "peer": peer}, {"run": run})
    assert lines[-1]["preflight"] == 255 and lines[-1]["bytes"] == 0, lines
    pid = int(pid_file.read_text())
    assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text().lower()


# ---- the destination's end started by the orchestrator (`transfer_sink listen`) -------------------------

TOKEN = "t" * 32


class Listening:
    """`transfer_sink listen` run on this machine, as the orchestrator runs it on the destination."""

    def __init__(self, tmp_path: Path, before: list[str] | None = None):
        self.folder = tmp_path / "end"
        spec = {"folder": str(self.folder), "token": TOKEN, "before": before, "deadline_s": 60}
        argv = program_argv("transfer_sink", ["listen", json.dumps(spec)], PY)
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        self.first = json.loads(self.proc.stdout.readline())

    @property
    def socket(self) -> str:
        return str(self.folder / "s")

    def start(self, consumer: list[str]) -> None:
        self.proc.stdin.write((json.dumps({"consumer": consumer}) + "\n").encode())
        self.proc.stdin.flush()

    def end(self) -> list[dict]:
        """Close its stdin (the orchestrator's session ends); what else it said."""
        out, _ = self.proc.communicate(timeout=30)
        return [json.loads(line) for line in out.decode().splitlines() if line.strip()]


def connect(path: str, token: str = TOKEN) -> socket.socket:
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.settimeout(20)
    conn.connect(path)
    conn.sendall((token + "\n").encode())
    return conn


def received(conn: socket.socket) -> bytes:
    data = b""
    while more := conn.recv(65536):
        data += more
    return data


def stream_counted(end: Listening, conn: socket.socket, data: bytes) -> None:
    """Through `conn`, answered `+`: `data` into the end's counting consumer (COUNT_INPUT), which
    reports every byte, as does the end once its session ends."""
    assert conn.recv(1) == b"+"
    conn.sendall(data)
    conn.shutdown(socket.SHUT_WR)
    assert json.loads(received(conn))["stdout"].endswith(json.dumps({"got": len(data)}) + "\n")
    assert end.end()[-1]["served"]["bytes"] == len(data)


def test_the_listening_end_inspects_then_serves_the_stream_into_a_consumer_started_before_it(tmp_path):
    started = tmp_path / "started"
    end = Listening(tmp_path, py("print('facts of the destination')"))
    assert end.first == {
        "before": {"status": 0, "stdout": "facts of the destination\n", "stderr": ""},
        "listening": True,
        "error": "",
    }
    assert stat.S_IMODE(end.folder.stat().st_mode) == 0o700
    # the consumer runs before any byte arrives (it records that, then counts its input)
    end.start(py(f"open({str(started)!r}, 'w'); {COUNT_INPUT}"))
    deadline = time.monotonic() + 20
    while not started.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert started.exists(), "the consumer was not started before the connection"
    conn = connect(end.socket)
    assert conn.recv(1) == b"+"
    conn.sendall(b"z" * 300_000)
    conn.shutdown(socket.SHUT_WR)
    outcome = json.loads(received(conn))
    assert outcome["status"] == 0 and outcome["stdout"].splitlines()[-1] == '{"got": 300000}'
    assert end.end() == [{"served": {"bytes": 300_000, "stopped": "", "status": 0}}]
    assert not end.folder.exists()  # socket and folder removed


def test_a_connection_first_waits_for_its_consumer_and_a_wrong_token_is_refused(tmp_path):
    end = Listening(tmp_path)
    stranger = connect(end.socket, "x" * 32)
    assert stranger.recv(1) == b"-"
    conn = connect(end.socket)
    time.sleep(0.3)
    end.start(py(COUNT_INPUT))  # named after the source connected
    stream_counted(end, conn, b"12345")


def test_an_end_never_reached_ends_its_consumer_unfed(tmp_path):
    """A skip, a retag, or a source that fell back to a session of its own: the orchestrator ends the
    session; the consumer started for nothing gets end of input, nothing else."""
    fed = tmp_path / "fed"
    end = Listening(tmp_path)
    end.start(py(f"import sys; open({str(fed)!r}, 'w').write(str(len(sys.stdin.buffer.read())))"))
    time.sleep(0.3)
    assert end.end() == [{"served": None}]  # its stdin closed: the orchestrator's session ended
    assert fed.read_text() == "0" and not end.folder.exists()


def test_with_nothing_to_serve_the_end_runs_the_last_command_for_the_node_in_its_session(tmp_path):
    end = Listening(tmp_path)
    end.proc.stdin.write((json.dumps({"run": py("print('retagged'); raise SystemExit(4)")}) + "\n").encode())
    end.proc.stdin.flush()
    assert end.end() == [{"ran": {"status": 4, "stdout": "retagged\n", "stderr": ""}}]
    assert not end.folder.exists()


def test_an_end_that_cannot_listen_says_so_and_still_inspects(tmp_path):
    (tmp_path / "end").write_text("in the way")
    end = Listening(tmp_path, py("print('facts')"))
    assert end.first["listening"] is False and "cannot listen" in end.first["error"]
    assert end.first["before"]["stdout"] == "facts\n"
    assert end.proc.wait(timeout=30) == SinkExit.CANNOT_LISTEN


def forwarded_peer(tmp_path, local: str) -> dict:
    peer = fake_peer(tmp_path, None)
    peer["forward"] = {"local": local, "token": TOKEN}
    return peer


def test_the_source_streams_through_the_forward_into_the_listening_end(tmp_path):
    """What the source's master forwards (here: the end's socket itself) carries the stream; the
    consumer the source would run in a session of its own is not used."""
    end = Listening(tmp_path)
    end.start(py(COUNT_INPUT))
    run = counted_run("op-forward", 2_000_000, early_sink=False)
    run["consumer"]["argv"] = py("import sys; sys.exit(7)")  # must not be used: the end serves
    run["use_forward"] = True
    lines, done = serve({"before": None, "peer": forwarded_peer(tmp_path, end.socket)}, {"run": run})
    assert done.returncode == 0, done.stderr
    report = lines[-1]
    assert report["forward"] == "used" and report["bytes"] == 2_000_000
    assert report["consumer_report"] == {"got": 2_000_000}
    assert [s["status"] for s in report["stages"]] == [0, 0]
    assert end.end()[-1]["served"]["bytes"] == 2_000_000


def test_a_refused_forward_falls_back_to_the_consumer_in_a_session_before_anything_is_sent(tmp_path):
    """Nothing listens where the forward leads (as when the destination's sshd refuses stream-local
    forwarding, the connection closes at once): the consumer runs the other way, every byte arrives."""
    gone = tmp_path / "nothing-here"
    gone.mkdir()
    run = counted_run("op-no-forward", 70_000, early_sink=False)
    run["use_forward"] = True
    lines, done = serve({"before": None, "peer": forwarded_peer(tmp_path, str(gone / "s"))}, {"run": run})
    assert done.returncode == 0, done.stderr
    assert lines[-1]["forward"].startswith("not used: ") and lines[-1]["consumer_report"] == {"got": 70_000}


def forwarded_load(tmp_path, end_socket: str, size: int) -> transfer.TransferResult:
    """A transfer of `size` bytes in a source session whose forward leads to `end_socket`, the consumer
    there named "docker load (destination)" (the one the source would run itself exits 7), interpreted."""
    job = Transfer(
        "op-forwarded",
        (Stage("make", py(f"import sys; sys.stdout.buffer.write(b'q' * {size})")),),
        Stage("docker load (destination)", py("import sys; sys.exit(7)")),
    )
    run = spec_for(job)
    run.pop("peer")
    run["use_forward"] = True
    peer = forwarded_peer(tmp_path, end_socket)
    argv = program_argv("transfer_source", ["serve", json.dumps({"before": None, "peer": peer})], PY)
    outcome = transfer.run_watched(argv, 60, 30, stdin=(json.dumps({"run": run}) + "\n").encode())
    return transfer.interpret(outcome, SOURCE, DESTINATION, None, job)


def test_a_consumer_that_fails_at_the_end_is_reported_as_the_stage_that_failed(tmp_path):
    end = Listening(tmp_path)
    fails = (
        "import sys; sys.stdin.buffer.read(10); sys.stderr.write('load failed: bad archive\\n'); sys.exit(3)"
    )
    end.start(py(fails))
    result = forwarded_load(tmp_path, end.socket, 500_000)
    assert result.forward == "used"
    assert result.failure is Failure.STAGE and result.why == "docker load (destination) exited 3"
    assert "load failed: bad archive" in result.error("copy", "nothing was tagged", "run again")
    end.end()


def unix_listener(path: str) -> socket.socket:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(8)
    return listener


def accepted(listener: socket.socket):
    """Each connection the listener takes, until it is closed."""
    while True:
        try:
            yield listener.accept()[0]
        except OSError:
            return


class FakeEnd:
    """A stand-in for what the source meets at the forward's end: `mode` "close" (what ssh does when
    the destination's sshd refuses the forward: the connection closes at once), "refuse" (the end
    answers `-`), or "vanish" (it answers `+`, takes the stream, then closes without an outcome)."""

    def __init__(self, tmp_path: Path, mode: str):
        self.path = str(tmp_path / "fake-end.sock")
        self.listener = unix_listener(self.path)
        self.mode = mode
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self) -> None:
        for conn in accepted(self.listener):
            with conn:
                if self.mode == "close":
                    continue
                token = conn.recv(len(TOKEN) + 1)
                if token.strip() in (b"", NUDGE.encode()):
                    continue  # the source's throwaway first channel
                if self.mode == "refuse":
                    conn.sendall(b"-")
                    continue
                conn.sendall(b"+")
                while conn.recv(65536):
                    pass
                return  # vanish: no outcome


@pytest.mark.parametrize("mode", ["close", "refuse"])
def test_a_forward_closed_at_once_or_refused_falls_back_to_the_consumer_in_a_session(tmp_path, mode):
    end = FakeEnd(tmp_path, mode)
    run = counted_run(f"op-{mode}", 90_000, early_sink=False)
    run["use_forward"] = True
    lines, done = serve({"before": None, "peer": forwarded_peer(tmp_path, end.path)}, {"run": run})
    assert done.returncode == 0, done.stderr
    assert lines[-1]["forward"].startswith("not used: ") and lines[-1]["consumer_report"] == {"got": 90_000}


def test_an_end_that_closes_without_the_consumers_outcome_is_a_failed_link(tmp_path):
    end = FakeEnd(tmp_path, "vanish")
    result = forwarded_load(tmp_path, end.path, 200_000)
    assert result.forward == "used" and result.failure is Failure.TRANSPORT
    assert result.why == "the SSH connection from node-a to node-b failed"


def test_ending_the_ends_session_mid_stream_ends_its_consumer(tmp_path):
    """The orchestrator gave up (its session to the destination ends): the consumer, fed or not,
    is ended there, so it can never promote what nobody waits for any more."""
    ran = tmp_path / "consumer-finished"
    end = Listening(tmp_path)
    end.start(py(f"import sys, time; sys.stdin.buffer.read(10); time.sleep(30); open({str(ran)!r}, 'w')"))
    conn = connect(end.socket)
    assert conn.recv(1) == b"+"
    conn.sendall(b"x" * 100)
    time.sleep(0.3)
    served = end.end()  # closes its stdin
    assert served[-1]["served"]["status"] == -signal.SIGKILL  # ended, not left to finish
    assert not ran.exists() and not end.folder.exists()


class RecordingEnd:
    """An end that records the token of every connection and answers `+` on one only once `go` is
    set (as the real end does once it holds the consumer), then counts the stream and sends the
    consumer's outcome."""

    def __init__(self, tmp_path: Path):
        self.release = threading.Event()  # the connection stays open after the outcome until set
        self.path = str(tmp_path / "recording-end.sock")
        self.listener = unix_listener(self.path)
        self.tokens: list[str] = []
        self.nudges: list[socket.socket] = []
        self.go = threading.Event()
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self) -> None:
        for conn in accepted(self.listener):
            token = conn.recv(len(TOKEN) + 1).decode().strip()
            if token in ("", NUDGE):
                self.nudges.append(conn)  # the source's throwaway first channel: held open
                continue
            self.tokens.append(token)
            self.go.wait(30)
            conn.sendall(b"+")
            got = len(received(conn))
            outcome = {"status": 0, "stdout": json.dumps({"got": got}) + "\n", "stderr": []}
            conn.sendall(json.dumps(outcome).encode() + b"\n")
            self.release.wait(60)
            conn.close()
            return


def test_the_forward_is_opened_while_the_caller_decides_and_its_outcome_taken_on_its_line(tmp_path):
    """The channel to the end is opened (and the token said) as soon as the master is up, before the
    caller's request: that wait is not on the transfer's path; the transfer uses that one connection,
    and its outcome is taken once its line is in."""
    end = RecordingEnd(tmp_path)
    spec = {"before": py("print('facts')"), "peer": forwarded_peer(tmp_path, end.path)}
    argv = program_argv("transfer_source", ["serve", json.dumps(spec)], PY)
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert json.loads(proc.stdout.readline())["before"]["stdout"] == "facts\n"
        deadline = time.monotonic() + 20
        while not end.tokens and time.monotonic() < deadline:
            time.sleep(0.02)
        assert end.tokens == [TOKEN], "the forward was not opened before the caller's request"
        end.go.set()
        run = counted_run("op-early", 400_000, early_sink=False)
        run["consumer"]["argv"] = py("import sys; sys.exit(7)")  # must not be used: the end serves
        run["use_forward"] = True
        # The end keeps the connection open after its outcome line (as sshd may, ~40 ms, for a delayed
        # ACK): the source reports on the line, not on the connection's end.
        out, err = proc.communicate((json.dumps({"run": run}) + "\n").encode(), timeout=30)
    finally:
        end.release.set()
        if proc.poll() is None:
            proc.kill()
    report = json.loads(out.decode().splitlines()[-1])
    assert report["forward"] == "used" and report["consumer_report"] == {"got": 400_000}, err
    assert end.tokens == [TOKEN]  # one connection: the early one


def test_an_end_reached_early_still_runs_the_command_of_a_skip_and_refuses_the_connection(tmp_path):
    end = Listening(tmp_path)
    conn = connect(end.socket)  # the source's early connection: no consumer named yet
    time.sleep(0.2)
    end.proc.stdin.write((json.dumps({"run": py("print('retagged')")}) + "\n").encode())
    end.proc.stdin.flush()
    assert end.end() == [{"ran": {"status": 0, "stdout": "retagged\n", "stderr": ""}}]
    assert conn.recv(1) == b"-" and not end.folder.exists()


def test_the_end_holds_the_nudge_open_unanswered(tmp_path):
    end = Listening(tmp_path)
    nudge = connect(end.socket, NUDGE)
    conn = connect(end.socket)  # the real one, accepted after the nudge
    nudge.settimeout(0.5)
    with pytest.raises(TimeoutError):
        nudge.recv(1)  # neither answered nor closed while the end waits for its consumer
    end.start(py(COUNT_INPUT))
    stream_counted(end, conn, b"abc")
    nudge.settimeout(20)
    assert nudge.recv(1) == b""  # closed, unanswered, once the end has served


def test_an_early_connection_whose_source_gave_up_is_dropped_and_the_next_attempt_served(tmp_path):
    """A retried attempt forwards to the same end with the same token: the first attempt's connection,
    held before the consumer was named, must not take the end with it."""
    end = Listening(tmp_path)
    first = connect(end.socket)
    time.sleep(0.2)
    first.close()  # that attempt died
    time.sleep(0.2)
    second = connect(end.socket)
    end.start(py(COUNT_INPUT))
    stream_counted(end, second, b"xy")


def test_the_masters_folder_is_removed_even_when_the_process_ends_right_after_the_operation(tmp_path):
    """Masters are asked to exit at the end of an operation and their answers waited for off its
    path; a process ending at once (the provider at the end of `pulumi up`) still removes the folder."""
    fake_ssh = tmp_path / "bin" / "ssh"
    fake_ssh.parent.mkdir()
    fake_ssh.write_text(f"#!{PY}\nimport time; time.sleep(0.3)\n")  # a master slow to answer
    fake_ssh.chmod(0o755)
    script = (
        "from components.transfer import ssh_sessions\n"
        "with ssh_sessions() as path:\n"
        "    open(path('s'), 'w').close()  # a master's socket\n"
        "    print(path('s').rsplit('/', 1)[0], flush=True)\n"
    )
    env = {**os.environ, "PATH": f"{fake_ssh.parent}:{os.environ['PATH']}"}
    done = subprocess.run([PY, "-c", script], capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    folder = Path(done.stdout.strip())
    assert folder.name.startswith("qni-") and not folder.exists()


def test_the_sources_ssh_dials_with_the_python_running_it_not_a_shim_first_on_path(tmp_path, monkeypatch):
    """A version manager's `python3` shim first on the login PATH is passed over: the connection's
    ssh finds `python3` in its private folder, linked to the interpreter running transfer_source;
    every other program (ssh, docker) is found as before."""
    from components.node_programs import transfer_source

    shims = tmp_path / "shims"
    shims.mkdir()
    (shims / "python3").write_text("#!/bin/sh\nexit 99\n")
    (shims / "python3").chmod(0o755)
    monkeypatch.setenv("PATH", f"{shims}:/usr/bin:/bin")
    found = tmp_path / "found.json"
    program = (
        "import json, shutil, sys; json.dump({n: shutil.which(n) for n in ('python3', 'sh')}, "
        f"open({str(found)!r}, 'w'))"
    )
    peer = {"folder": str(tmp_path / "peer"), "check": ["false"], "connect": [sys.executable, "-c", program]}
    assert transfer_source.connect(peer) == (0, "")
    which = json.loads(found.read_text())
    assert which["python3"] == str(tmp_path / "peer" / "python3")
    assert os.path.realpath(which["python3"]) == os.path.realpath(sys.executable)
    assert which["sh"] in ("/usr/bin/sh", "/bin/sh")  # found where it was
    transfer_source.close({**peer, "exit": ["true"]})
    assert not (tmp_path / "peer").exists()  # the link goes with the folder
