"""The node programs' packing (a program and the libraries it imports, after an optional prelude,
delivered in argv or on stdin) and their Engine API library, tested without a node or a daemon."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
import urllib.parse

import pytest

import components.node_programs as node_programs
from components.node_programs import engine_api, libraries, program_argv, program_stdin, stdin_argv


@pytest.fixture
def programs_in(tmp_path, monkeypatch):
    """Point the packing at a folder of test programs (its caches cleared before and after)."""

    def clear():
        for cached in (
            node_programs.program_text,
            node_programs.libraries,
            node_programs._bundle,
            node_programs._packed,
        ):
            cached.cache_clear()

    clear()
    monkeypatch.setattr(node_programs, "FOLDER", tmp_path)
    yield tmp_path
    clear()


def test_a_program_runs_with_the_libraries_it_imports_under_their_names_here(programs_in, tmp_path):
    (programs_in / "lib_low.py").write_text(
        "from __future__ import annotations\nfrom dataclasses import dataclass\n\n"
        "@dataclass(frozen=True)\nclass Point:\n    x: int\n\nWHERE = __name__\n"
    )
    (programs_in / "lib_high.py").write_text(
        "from components.node_programs import lib_low  # the one below\n\n"
        "def point(x):\n    return lib_low.Point(x)\n\n"
        "def fail():\n    raise RuntimeError('in the library')\n"
    )
    (programs_in / "prog.py").write_text(
        "import json, sys\n"
        "from components.node_programs import lib_high\n"
        "from components.node_programs import lib_low\n"
        "if __name__ == '__main__':\n"
        "    if sys.argv[1:] == ['fail']:\n"
        "        lib_high.fail()\n"
        "    names = ('LIBRARIES', 'PROGRAM', 'PROGRAM_NAME', '_module')\n"
        "    leaked = sorted(n for n in names if n in globals())\n"
        "    found = {'x': lib_high.point(3).x, 'where': lib_low.WHERE, 'args': sys.argv[1:]}\n"
        "    print(json.dumps({**found, 'leaked': leaked}))\n"
    )
    (programs_in / "plain.py").write_text("import sys\nprint(sys.argv[1:])\n")
    assert libraries("prog") == ("lib_low", "lib_high")  # each after what it imports, once
    assert libraries("plain") == ()
    empty = tmp_path / "elsewhere"  # no `components` package anywhere near the program
    empty.mkdir()
    done = subprocess.run(
        program_argv("prog", ["a b"], sys.executable), cwd=empty, capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {
        "x": 3,
        "where": "components.node_programs.lib_low",
        "args": ["a b"],
        "leaked": [],  # the packing's own names are gone before the program runs
    }
    failed = subprocess.run(
        program_argv("prog", ["fail"], sys.executable), cwd=empty, capture_output=True, text=True, timeout=30
    )
    assert failed.returncode == 1 and 'File "lib_high.py"' in failed.stderr  # tracebacks name the file
    plain = subprocess.run(program_argv("plain", ["x"], sys.executable), capture_output=True, text=True)
    assert plain.stdout.strip() == "['x']"


PRELUDE_PROGRAM = (
    "import json, os, sys\n"
    "from components.node_programs import lib_low\n"
    "found = {'key': os.environ.get('THE_KEY'), 'n': globals().get('N'), 'label': globals().get('LABEL')}\n"
    "print(json.dumps({**found, 'where': lib_low.WHERE, 'args': sys.argv[1:]}))\n"
)


def test_a_program_on_stdin_runs_after_its_prelude_which_stays_out_of_argv(programs_in, tmp_path):
    (programs_in / "lib_low.py").write_text("WHERE = __name__\n")
    (programs_in / "prog.py").write_text(PRELUDE_PROGRAM)
    secret = "sk-'quoted\"\n"
    stdin = program_stdin("prog", assign={"N": 2.5, "LABEL": "a'b"}, environ={"THE_KEY": secret})
    argv = stdin_argv(["x y"], sys.executable)
    assert argv == [sys.executable, "-", "x y"] and secret not in " ".join(argv)
    done = subprocess.run(argv, input=stdin, cwd=tmp_path, capture_output=True, timeout=30)
    assert done.returncode == 0, done.stderr
    expected = {"key": secret, "n": 2.5, "label": "a'b", "where": "components.node_programs.lib_low"}
    assert json.loads(done.stdout) == {**expected, "args": ["x y"]}
    # The same packing in argv: assignments only (no environment parameter to put a secret in).
    packed = program_argv("prog", ["z"], sys.executable, assign={"N": 1, "LABEL": None})
    done = subprocess.run(packed, cwd=tmp_path, capture_output=True, text=True, timeout=30)
    assert json.loads(done.stdout) == {**expected, "key": None, "n": 1, "label": None, "args": ["z"]}


def test_a_program_without_libraries_goes_on_stdin_as_its_own_text_after_the_prelude(programs_in):
    (programs_in / "plain.py").write_text('"""Doc."""\nimport sys\nprint(sys.argv[1:])\n')
    assert program_stdin("plain") == b'"""Doc."""\nimport sys\nprint(sys.argv[1:])\n'
    assert program_stdin("plain", assign={"A": 1}, environ={"B": "c"}).decode().splitlines()[:4] == [
        "import os",
        "os.environ['B'] = 'c'",
        "A = 1",
        '"""Doc."""',
    ]


def test_a_prelude_that_would_not_read_back_is_refused(programs_in):
    (programs_in / "plain.py").write_text("import sys\n")
    (programs_in / "future.py").write_text("from __future__ import annotations\n")
    for assign, environ in (({"A": [1]}, {}), ({"A-B": 1}, {}), ({}, {"KEY": 3}), ({}, {"A B": "x"})):
        with pytest.raises(ValueError, match="cannot set"):
            program_stdin("plain", assign, environ)
    with pytest.raises(ValueError, match="__future__"):
        program_stdin("future", {"A": 1})
    assert program_stdin("future") == b"from __future__ import annotations\n"  # no prelude: as it is


def test_an_import_the_packing_would_not_ship_is_refused(programs_in):
    (programs_in / "lib_low.py").write_text("WHERE = __name__\n")
    (programs_in / "named.py").write_text(
        "from components.node_programs.lib_low import WHERE\nprint(WHERE)\n"
    )
    assert libraries("named") == ("lib_low",)
    assert subprocess.run(program_argv("named", [], sys.executable), capture_output=True).returncode == 0
    for refused in (
        "import components.node_programs.lib_low\n",
        "from components.node_programs import lib_low, lib_high\n",
        "def f():\n    from components.node_programs import lib_low\n",
    ):
        (programs_in / "odd.py").write_text(refused)
        node_programs.libraries.cache_clear()
        with pytest.raises(ValueError, match="other forms are not shipped"):
            libraries("odd")


def test_the_docker_programs_carry_the_engine_api():
    # Every program that speaks the wire protocol carries `wire` as well (it imports nothing itself).
    assert libraries("docker_facts") == ("engine_api", "wire") and libraries("image_tag") == (
        "engine_api",
        "wire",
    )
    assert (
        libraries("transfer_sink") == ("wire",) and libraries("engine_api") == () and libraries("wire") == ()
    )


@pytest.mark.parametrize("safe", ["/:@", ""])
def test_quote_is_urllib_quote(safe):
    for text in (
        "app:1",
        "registry.lan:5000/team/vllm-node:qwen35-abc",
        "a b+c&d=e?f#g%h",
        "ünï/cödé",
        "~_.-",
    ):
        assert engine_api.quote(text, safe) == urllib.parse.quote(text, safe=safe)


def test_an_answer_is_read_by_its_length_or_chunks_and_refused_when_incomplete():
    assert engine_api.parse_answer(b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\n{}") == (200, b"{}")
    assert engine_api.parse_answer(b"HTTP/1.1 404 Not Found\r\n\r\n{}\n") == (404, b"{}\n")  # to the close
    chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\n[1,\r\n2;x=y\r\n2]\r\n0\r\n\r\n"
    assert engine_api.parse_answer(chunked) == (200, b"[1,2]")
    for broken in (
        b"HTTP/1.0 200 OK\r\nContent-Length: 10\r\n\r\n{}",  # cut short
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab",  # cut short, chunked
        b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n",  # no end of headers
        b"SSH-2.0-OpenSSH_9.2\r\n\r\n",  # not HTTP
        b"",
    ):
        with pytest.raises(engine_api.EngineError):
            engine_api.parse_answer(broken)


def serve_once(path: str, answer: bytes | None) -> tuple[threading.Thread, list[bytes]]:
    """A unix socket at `path` that reads one request and sends `answer` (None: closes at once)."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)
    asked: list[bytes] = []

    def run():
        conn, _ = listener.accept()
        with conn:
            request = b""
            while b"\r\n\r\n" not in request and answer is not None:
                request += conn.recv(4096)
            asked.append(request)
            if answer is not None:
                conn.sendall(answer)
        listener.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, asked


def test_a_request_is_one_http_1_0_exchange_and_a_dropped_one_is_a_failure(tmp_path):
    path = str(tmp_path / "engine.sock")
    thread, asked = serve_once(path, b'HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n{"ok": 1}')
    assert engine_api.get_json(path, "/images/app:1/json", timeout=10) == (200, {"ok": 1})
    thread.join(5)
    assert asked[0].startswith(b"GET /images/app:1/json HTTP/1.0\r\n")
    (tmp_path / "engine.sock").unlink()
    thread, _ = serve_once(path, None)
    with pytest.raises(engine_api.FAILED):
        engine_api.call(path, "DELETE", "/images/app:1", timeout=10)
    thread.join(5)
    with pytest.raises(engine_api.FAILED):  # nobody there
        engine_api.call(str(tmp_path / "none.sock"), "GET", "/info", timeout=10)


def test_a_request_with_a_body_sends_it_as_json_with_its_length(tmp_path):
    path = str(tmp_path / "engine.sock")
    thread, asked = serve_once(path, b'HTTP/1.0 201 Created\r\n\r\n{"Id": "c1"}')
    body = {"Image": "sha256:ab", "Cmd": ["print('é')"]}
    assert engine_api.call(path, "POST", "/containers/create?name=p", 10, body) == (201, b'{"Id": "c1"}')
    thread.join(5)
    head, _, sent = asked[0].partition(b"\r\n\r\n")
    assert b"Content-Type: application/json" in head.split(b"\r\n")
    assert f"Content-Length: {len(sent)}".encode() in head.split(b"\r\n") and json.loads(sent) == body


def test_an_answer_is_bounded_in_bytes_and_in_total_time(tmp_path):
    """`limit` and `total_s` (`health_wire.events` reads the daemon's event log with both): an answer
    too long, or one that keeps coming in small pieces past the bound, is a failure, not a hang."""
    path = str(tmp_path / "engine.sock")
    thread, _ = serve_once(path, b"HTTP/1.0 200 OK\r\n\r\n" + b"x" * 5000)
    with pytest.raises(engine_api.EngineError, match="over 1000 bytes"):
        engine_api.call(path, "GET", "/events", 10, limit=1000)
    thread.join(5)
    (tmp_path / "engine.sock").unlink()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)

    def dribble():
        conn, _ = listener.accept()
        with conn:
            conn.sendall(b"HTTP/1.0 200 OK\r\n\r\n")
            for _ in range(30):  # a byte every 0.1 s: no recv ever waits its own timeout
                try:
                    conn.sendall(b"{")
                except OSError:
                    break
                threading.Event().wait(0.1)
        listener.close()

    thread = threading.Thread(target=dribble, daemon=True)
    thread.start()
    started = time.monotonic()
    with pytest.raises(engine_api.EngineError, match="within 0.5 s"):
        engine_api.call(path, "GET", "/events", 1.0, total_s=0.5)
    assert time.monotonic() - started < 1.5
    thread.join(5)


def test_the_lines_built_from_the_apis_answers_are_the_formats_lines():
    found = {"Id": "sha256:ab", "RootFS": {"Layers": ["sha256:1", "sha256:2"]}, "Size": 7}
    assert engine_api.image_line(found) == '"sha256:ab"\t["sha256:1","sha256:2"]\t7'
    assert engine_api.image_line({"Id": "sha256:ab", "RootFS": {}}) == '"sha256:ab"\tnull\t0'  # as Go's
    info = {"DriverStatus": [["Backing Filesystem", "extfs"]], "DockerRootDir": "/d", "ServerVersion": "26"}
    assert (
        engine_api.info_line({**info, "Driver": "overlay2"})
        == '[["Backing Filesystem","extfs"]]\t/d\t26\toverlay2'
    )
    assert engine_api.info_line({**info, "DriverStatus": None}).startswith("null\t")
