"""ServeBench without a node: the bench program's figures from canned SSE streams, the program
against a streaming stand-in on this machine (its key on stdin, never argv), the floors' verdicts
and likely causes, which changes measure again, and the provider's verbs (refresh runs nothing)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from components.node_programs import serve_bench as program
from components.node_programs import wire
from components.node_programs.serve_bench import StreamFigures, parse_sse, stream_figures
from components.serve_bench import (
    BelowFloor,
    BenchFailed,
    ServeBenchProvider,
    bench_argv,
    bench_program,
    figures_line,
    judged,
    likely_causes,
    measures_again,
    plan_change,
    shortfalls,
)
from components.serve_bench import execute as bench_execute
from components.serve_bench.plan import Action, update_action

MODEL = "qwen3.5-test"
KEY = "sk-bench-secret-789"


def sse(*payloads: dict | str) -> list[bytes]:
    """Server-sent event lines as vLLM writes them: `data: …`, a blank line after each."""
    lines = []
    for payload in payloads:
        data = payload if isinstance(payload, str) else json.dumps(payload)
        lines += [f"data: {data}\n".encode(), b"\n"]
    return lines


def token(text: str = "x", finish: str | None = None) -> dict:
    """A completion chunk as vLLM streams one: its last carries the finish_reason (`length` under
    ignore_eos), every other None."""
    return {"choices": [{"index": 0, "text": text, "finish_reason": finish}], "usage": None}


def usage(prompt: int, completion: int) -> dict:
    return {"choices": [], "usage": {"prompt_tokens": prompt, "completion_tokens": completion}}


def timed(lines: list[bytes], times: list[float]) -> list[tuple[float, bytes]]:
    """Each event's lines at its time (the blank line after it at the same time)."""
    return [(times[i // 2], line) for i, line in enumerate(lines)]


# ---- the program's figures from canned streams -------------------------------------------------------


@pytest.mark.parametrize(
    ("case", "payloads", "times", "expected"),
    [
        (
            # 1 s to the first token, then 4 more in 2 s: 2 tokens/s of decode.
            "usage counts",
            [token(), token(), token(), token(), token(), usage(12, 5), "[DONE]"],
            [1.0, 1.5, 2.0, 2.5, 3.0, 3.0, 3.0],
            {"ttft_s": 1.0, "completion_tokens": 5, "prompt_tokens": 12, "counted": "usage", "decode": 2.0},
        ),
        (
            # MTP speculative decoding sends several tokens in one chunk: usage says 9, chunks 3.
            "chunks carrying several tokens",
            [token("abc"), token("def"), token("ghi"), usage(7, 9), "[DONE]"],
            [0.5, 1.5, 2.5, 2.5, 2.5],
            {"ttft_s": 0.5, "completion_tokens": 9, "prompt_tokens": 7, "counted": "usage", "decode": 4.0},
        ),
        (
            "no usage sent: chunks counted",
            [token(), token(), token(), "[DONE]"],
            [0.25, 0.75, 1.25, 1.25],
            {
                "ttft_s": 0.25,
                "completion_tokens": 3,
                "prompt_tokens": None,
                "counted": "chunks",
                "decode": 2.0,
            },
        ),
        (
            # vLLM sends usage in a chunk of its own after the last token: decode ends at the last token
            # (as `vllm bench serve` times it), not at the usage chunk a second later.
            "usage after the last token",
            [token(), token(), token(), usage(12, 3), "[DONE]"],
            [1.0, 1.5, 2.0, 3.0, 3.0],
            {"ttft_s": 1.0, "completion_tokens": 3, "prompt_tokens": 12, "counted": "usage", "decode": 2.0},
        ),
        (
            "one token (prefill): no decode figure",
            [token(), usage(2048, 1), "[DONE]"],
            [2.0, 2.0, 2.0],
            {
                "ttft_s": 2.0,
                "completion_tokens": 1,
                "prompt_tokens": 2048,
                "counted": "usage",
                "decode": None,
            },
        ),
        (
            "events after [DONE] are not read",
            [token(), token(), "[DONE]", token(), token()],
            [1.0, 2.0, 2.0, 9.0, 9.0],
            {
                "ttft_s": 1.0,
                "completion_tokens": 2,
                "prompt_tokens": None,
                "counted": "chunks",
                "decode": 1.0,
            },
        ),
    ],
)
def test_stream_figures_from_canned_streams(case, payloads, times, expected):
    figures = stream_figures(0.0, parse_sse(timed(sse(*payloads), times), "decode").events)
    assert figures.ttft_s == pytest.approx(expected["ttft_s"]), case
    assert figures.completion_tokens == expected["completion_tokens"], case
    assert figures.prompt_tokens == expected["prompt_tokens"], case
    assert figures.counted == expected["counted"], case
    if expected["decode"] is None:
        assert figures.decode_tps is None, case
    else:
        assert figures.decode_tps == pytest.approx(expected["decode"]), case


def test_prefill_is_prompt_tokens_over_the_time_to_first_token():
    figures = stream_figures(
        10.0, parse_sse(timed(sse(token(), usage(2000, 1)), [12.5, 12.5]), "prefill").events
    )
    assert figures.ttft_s == pytest.approx(2.5)
    assert figures.prefill_tps == pytest.approx(800.0)


@pytest.mark.parametrize(
    ("line", "said"),
    [
        ('data: {"error": {"message": "out of KV cache", "code": 400}}', "out of KV cache"),
        ("data: not json", "not JSON"),
    ],
)
def test_an_error_event_or_garbage_fails_the_stream_naming_its_stage(line, said):
    with pytest.raises(program.BenchError, match=f"serve bench: prefill: .*{said}"):
        parse_sse([(0.0, line.encode())], "prefill")


def test_aggregate_is_every_token_over_the_wall_time():
    streams = [
        StreamFigures(
            0.5, elapsed_s=4.0, completion_tokens=100, prompt_tokens=9, counted="usage", started_at=10
        ),
        StreamFigures(
            0.5, elapsed_s=5.0, completion_tokens=100, prompt_tokens=9, counted="usage", started_at=11
        ),
    ]
    # 200 tokens from 10.0 to 16.0.
    assert program.aggregate_tps(streams) == pytest.approx(200 / 6)
    assert program.aggregate_tps([]) is None


def test_the_report_names_how_tokens_were_counted():
    used = StreamFigures(0.2, 2.2, 21, 9, "usage")
    chunked = StreamFigures(0.2, 2.2, 21, None, "chunks")
    assert program.figures(used, used, [used])["counted"] == "usage"
    assert program.figures(used, used, [used, chunked])["counted"] == "chunks"
    report = program.figures(used, StreamFigures(1.0, 1.0, 1, 2048, "usage"), [used, used])
    assert report["decode_tps"] == 10.0 and report["ttft_s"] == 0.2
    assert report["prefill_tps"] == 2048.0 and report["prompt_tokens"] == 2048
    assert report["concurrency"] == 2


@pytest.mark.parametrize(
    ("log", "network"),
    [
        (["vllm INFO loading", "h:1:2 [0] NCCL INFO Using network IB", "ready"], "IB"),
        (["h:1 [0] NCCL INFO NET/Socket : Using [0]lo", "h:1 [0] NCCL INFO Using network Socket"], "Socket"),
        (["NCCL INFO Using network IB", "NCCL INFO Using network Socket", "NCCL INFO Using network IB"],
         "IB,Socket"),
        (["no NCCL_DEBUG here"], None),
    ],
)  # fmt: skip
def test_nccl_network_from_the_server_log(log, network):
    assert program.nccl_network(log) == network


def test_long_prompts_start_with_a_fresh_nonce():
    first, second = program.long_prompt(100), program.long_prompt(100)
    assert first != second and first.split()[1:] == second.split()[1:]
    assert 90 <= len(first.split()) <= 100


# ---- the program against a streaming stand-in ------------------------------------------------------------


class Streamer(BaseHTTPRequestHandler):
    """A /v1/completions that streams `max_tokens` one-token chunks and the usage, as vLLM does."""

    def log_message(self, *_args) -> None:
        pass

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        server = self.server
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/tokenize":  # vLLM's: the prompt's count by the server's tokenizer (a word a token)
            server.counted.append(body)
            self.send_response(200)
            self.end_headers()
            self.wfile.write(json.dumps({"count": len(str(body["prompt"]).split())}).encode())
            return
        server.seen.append({"auth": self.headers.get("Authorization"), "body": body})
        if self.headers.get("Authorization") != f"Bearer {server.key}":
            self.send_response(401)
            self.end_headers()
            self.wfile.write(b'{"error": "invalid key"}')
            return
        cut = server.cut(len(server.seen) - 1, body)
        if cut == "mid-chunk":
            self.break_mid_chunk()
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        tokens = int(body["max_tokens"])
        if isinstance(cut, tuple):  # ("stop", N): ends as vLLM does, but after N tokens (no ignore_eos)
            tokens = cut[1]
        sent = cut if isinstance(cut, int) else tokens
        for i in range(sent):
            finish = None if isinstance(cut, int) or i < sent - 1 else ("stop" if cut else "length")
            self.wfile.write(f"data: {json.dumps(token(finish=finish))}\n\n".encode())
            self.wfile.flush()
        if isinstance(cut, int):  # closed cleanly after `cut` tokens, as a dying server or proxy does
            return
        prompt = len(str(body["prompt"]).split())
        if body.get("stream_options", {}).get("include_usage"):
            self.wfile.write(f"data: {json.dumps(usage(prompt, tokens))}\n\n".encode())
        self.wfile.write(b"data: [DONE]\n\n")

    def break_mid_chunk(self) -> None:
        """An HTTP/1.1 chunked stream (as uvicorn sends one) whose connection closes inside a chunk."""
        self.protocol_version = "HTTP/1.1"
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        first = f"data: {json.dumps(token())}\n\n".encode()
        self.wfile.write(b"%x\r\n%s\r\n" % (len(first), first))
        self.wfile.write(b"64\r\n" + first[:20])  # 100 bytes announced, 20 sent
        self.wfile.flush()
        self.close_connection = True


@pytest.fixture
def streamer():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Streamer)
    server.seen, server.counted, server.key = [], [], KEY
    # (request index, body) -> None: stream in full; N: close cleanly after N tokens; "mid-chunk".
    server.cut = lambda _index, _body: None
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def props_for(url: str, **extra) -> dict:
    settings = {"output_tokens": 32, "prompt_tokens": 200, "concurrency": 3, "deadline_s": 30}
    return {"url": url, "model": MODEL, "settings": settings, "log_container": None, **extra}


def test_the_shipped_program_measures_with_its_key_from_stdin(streamer):
    url = f"http://127.0.0.1:{streamer.server_address[1]}"
    argv = bench_argv(props_for(url))
    assert KEY not in " ".join(argv)
    env = {k: v for k, v in os.environ.items() if k != wire.PROBE_API_KEY_ENV}
    run = {"capture_output": True, "env": env, "cwd": "/", "timeout": 60}
    done = subprocess.run([sys.executable, *argv[1:]], input=bench_program(KEY), **run)
    assert done.returncode == 0, done.stderr
    assert KEY.encode() not in done.stdout + done.stderr
    report = json.loads(done.stdout.decode().strip().splitlines()[-1])
    figures = report["figures"]
    assert figures["output_tokens"] == 32 and figures["concurrency"] == 3 and figures["counted"] == "usage"
    assert 190 <= figures["prompt_tokens"] <= 201
    assert all(
        isinstance(figures[k], float) for k in ("decode_tps", "ttft_s", "prefill_tps", "aggregate_tps")
    )
    # A warm-up, decode, prefill, then three at once: each streamed, lengths forced, usage asked for.
    bodies = [seen["body"] for seen in streamer.seen]
    assert [b["max_tokens"] for b in bodies] == [program.WARMUP_TOKENS, 32, 1, 32, 32, 32]
    assert all(
        b["stream"] and b["ignore_eos"] and b["stream_options"] == {"include_usage": True} for b in bodies
    )
    assert {seen["auth"] for seen in streamer.seen} == {f"Bearer {KEY}"}
    # The prefill prompt was sized by the server's own count (once: it was within 5 %).
    assert len(streamer.counted) == 1 and streamer.counted[0]["model"] == MODEL
    # Every prompt is new to the prefix cache.
    assert len({b["prompt"] for b in bodies}) == len(bodies)
    assert b"bench decode" in done.stderr and b"bench aggregate" in done.stderr


def test_a_wrong_key_exits_rejected_at_the_first_request(streamer, capsys, monkeypatch):
    monkeypatch.setenv(wire.PROBE_API_KEY_ENV, "sk-wrong")
    url = f"http://127.0.0.1:{streamer.server_address[1]}"
    argv = bench_argv(props_for(url))[2:]
    assert program.main(argv) == program.Exit.REJECTED
    assert "warm-up" in capsys.readouterr().err and len(streamer.seen) == 1


def test_a_deadline_passed_fails_the_stage_it_cut(streamer, capsys, monkeypatch):
    monkeypatch.setenv(wire.PROBE_API_KEY_ENV, KEY)
    ticks = iter(range(0, 10_000, 1))
    client = program.Client(f"http://127.0.0.1:{streamer.server_address[1]}", KEY, 20, lambda: next(ticks))
    with pytest.raises(program.BenchError, match="decode: the bench's deadline passed"):
        program.run(client, MODEL, 64, 100, 2, lambda _line: None)


@pytest.mark.parametrize(
    ("case", "payloads", "asked", "said"),
    [
        ("as vLLM ends one", [token(), token(finish="length"), usage(9, 2), "[DONE]"], 2, None),
        ("no usage: finish_reason length", [token(), token(finish="length"), "[DONE]"], 2, None),
        ("closed after 5 of 32, no [DONE]", [token()] * 5, 32,
         "ended after 5 token chunk(s) without `data: [DONE]`"),
        ("[DONE] but no finish_reason", [token(), usage(9, 1), "[DONE]"], 1, "without a finish_reason"),
        ("usage short of what was asked", [token(), token(finish="stop"), usage(9, 2), "[DONE]"], 32,
         "generated 2 of the 32 tokens asked (finish_reason 'stop')"),
        ("no usage and a stop", [token(), token(finish="stop"), "[DONE]"], 32,
         "finish_reason 'stop', not 'length'"),
    ],
)  # fmt: skip
def test_a_stream_must_end_as_vllm_ends_one(case, payloads, asked, said):
    problem = program.end_problem(parse_sse(timed(sse(*payloads), [1.0] * len(payloads)), "decode"), asked)
    if said is None:
        assert problem is None, case
    else:
        assert problem is not None and said in problem, (case, problem)


def run_against(streamer, monkeypatch, cut) -> tuple[int, str, float]:
    """The program against `streamer` with `cut` deciding each request's stream: exit, stderr, seconds."""
    monkeypatch.setenv(wire.PROBE_API_KEY_ENV, KEY)
    streamer.cut = cut
    argv = bench_argv(props_for(f"http://127.0.0.1:{streamer.server_address[1]}"))
    env = {**os.environ, wire.PROBE_API_KEY_ENV: KEY}
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, *argv[1:]],
        input=bench_program(KEY),
        capture_output=True,
        env=env,
        cwd="/",
        timeout=60,
    )
    return done.returncode, done.stderr.decode(), time.monotonic() - started


def decode_only(value):
    """A cut for the decode stage alone (the second request)."""
    return lambda index, _body: value if index == 1 else None


def concurrent_only(value):
    """A cut for one stream of the parallel stage (after warm-up, decode and prefill)."""
    return lambda index, _body: value if index == 4 else None


@pytest.mark.parametrize(
    ("cut", "said"),
    [
        (decode_only(5), "serve bench: decode: the stream ended after 5 token chunk(s) without `data:"),
        (decode_only(("stop", 5)), "serve bench: decode: the server generated 5 of the 32 tokens asked"),
        (concurrent_only(5), "serve bench: concurrent: the stream ended after 5 token chunk(s)"),
    ],
)  # fmt: skip
def test_a_stream_cut_short_fails_its_stage_with_no_figures(streamer, monkeypatch, cut, said):
    code, err, _ = run_against(streamer, monkeypatch, cut)
    assert code == program.Exit.FAILED and said in err, err


@pytest.mark.parametrize(
    ("cut", "stage"), [(decode_only("mid-chunk"), "decode"), (concurrent_only("mid-chunk"), "concurrent")]
)
def test_a_disconnect_inside_a_chunk_names_the_stage_and_the_cause(streamer, monkeypatch, cut, stage):
    code, err, seconds = run_against(streamer, monkeypatch, cut)
    assert code == program.Exit.FAILED and "Traceback" not in err, err
    assert f"serve bench: {stage}: the connection broke before the stream ended (IncompleteRead" in err, err
    # Reported at once, not as a stream that "did not end by the bench's deadline" (30 s).
    assert "deadline" not in err and seconds < 20


def test_nothing_listening_fails_naming_the_stage(capsys, monkeypatch):
    monkeypatch.setenv(wire.PROBE_API_KEY_ENV, KEY)
    assert program.main(bench_argv(props_for("http://127.0.0.1:9"))[2:]) == program.Exit.FAILED
    assert "serve bench: warm-up:" in capsys.readouterr().err


def test_bench_program_carries_the_key_in_its_prelude_only():
    text = bench_program(KEY).decode()
    assert text.splitlines()[1] == f"os.environ[{wire.PROBE_API_KEY_ENV!r}] = {KEY!r}"
    assert not bench_program(None).decode().startswith("import os")


# ---- the floors and the likely causes ------------------------------------------------------------------

FIGURES = {
    "decode_tps": 12.5,
    "ttft_s": 0.8,
    "prefill_tps": 900.0,
    "prompt_tokens": 2048,
    "aggregate_tps": 40.0,
    "concurrency": 4,
}


@pytest.mark.parametrize(
    ("floors", "missed"),
    [
        ({}, []),
        ({"min_decode_tps": 12.5}, []),
        ({"min_decode_tps": 18}, ["decode 12.5 tokens/s is below bench.min_decode_tps 18 tokens/s"]),
        ({"min_prefill_tps": 860}, []),
        ({"min_prefill_tps": 1000}, ["prefill 900 tokens/s is below bench.min_prefill_tps 1000 tokens/s"]),
        ({"min_aggregate_tps": 50}, ["aggregate 40 tokens/s is below bench.min_aggregate_tps 50 tokens/s"]),
        ({"max_ttft_s": 1.0}, []),
        ({"max_ttft_s": 0.5}, ["time to first token 0.8 s is above bench.max_ttft_s 0.5 s"]),
        (
            {"min_decode_tps": 20, "max_ttft_s": 0.5},
            [
                "decode 12.5 tokens/s is below bench.min_decode_tps 20 tokens/s",
                "time to first token 0.8 s is above bench.max_ttft_s 0.5 s",
            ],
        ),
    ],
)
def test_floor_verdicts(floors, missed):
    assert shortfalls(FIGURES, floors) == missed


def test_a_floor_missed_by_tokens_counted_from_chunks_says_so():
    """Without usage the program counts chunks; under MTP a chunk carries several tokens, so the
    figure is low by that factor: the message says which count was used."""
    chunked = {**FIGURES, "counted": "chunks"}
    (decode,) = shortfalls(chunked, {"min_decode_tps": 18})
    assert decode.startswith("decode 12.5 tokens/s is below bench.min_decode_tps 18 tokens/s")
    assert "counted from chunks" in decode and "MTP" in decode
    # TTFT and prefill do not depend on the count of generated tokens.
    assert shortfalls(chunked, {"max_ttft_s": 0.5}) == [
        "time to first token 0.8 s is above bench.max_ttft_s 0.5 s"
    ]
    assert "chunks" not in shortfalls({**FIGURES, "counted": "usage"}, {"min_decode_tps": 18})[0]


def test_a_figure_not_measured_misses_its_floor():
    assert shortfalls({**FIGURES, "decode_tps": None}, {"min_decode_tps": 1}) == [
        "decode was not measured (bench.min_decode_tps 1 tokens/s)"
    ]


FABRIC = {
    "check": "report",
    "nodes": {
        "spark-1": {"mtu": 9000, "throughput": None, "verdict": "pass", "problems": []},
        "spark-2": {"mtu": 1500, "throughput": {"line": "spark-2 → spark-1 1.1 GB/s over enp1s0f1np1"},
                    "verdict": "pass", "problems": []},
    },
}  # fmt: skip


def test_likely_causes_name_what_the_stack_sees():
    causes = "\n".join(likely_causes(FABRIC, "Socket", ["spark-1", "spark-2"], ["vllm", "serve"]))
    assert "NCCL used network Socket (TCP sockets, not RDMA)" in causes
    assert "MTUs differ (spark-1 9000, spark-2 1500)" in causes
    assert "spark-2 → spark-1 1.1 GB/s over enp1s0f1np1" in causes
    assert "speculative decoding is off" in causes


def test_likely_causes_name_what_to_check_when_the_stack_cannot_see_it():
    causes = "\n".join(
        likely_causes({"check": "off", "nodes": {}}, None, ["a", "b"], ["--speculative-config"])
    )
    assert "whether NCCL used RDMA is not known" in causes and "NCCL_DEBUG=INFO" in causes
    assert "fabric.check is off" in causes and "`ip link`" in causes
    assert "speculative decoding is off" not in causes
    one = "\n".join(likely_causes(None, None, ["a"], ["--enforce-eager", "--speculative-config"]))
    assert "NCCL" not in one and "fabric" not in one and "serve.enforce_eager is on" in one


@pytest.mark.parametrize(
    ("floors", "report", "verdict"),
    [
        ({}, {"figures": FIGURES}, "measured"),
        ({"min_decode_tps": 10}, {"figures": FIGURES}, "pass"),
        ({"min_decode_tps": 20}, {"figures": FIGURES}, "below"),
        ({"min_decode_tps": 20}, None, "failed"),
    ],
)
def test_judged_verdicts(floors, report, verdict):
    outs = judged({"floors": floors, "nodes": ["a", "b"]}, report, error=None if report else "boom")
    assert outs["verdict"] == verdict
    assert bool(outs["causes"]) == (verdict in ("below", "failed"))


def test_figures_line():
    assert figures_line(FIGURES) == (
        "decode 12.5 tok/s (TTFT 0.80 s), prefill 900 tok/s (2048 tokens), 4 streams 40.0 tok/s"
    )
    assert figures_line(None) == "not measured"
    assert figures_line({**FIGURES, "counted": "usage"}) == figures_line(FIGURES)
    assert figures_line({**FIGURES, "counted": "chunks"}) == figures_line(FIGURES) + (
        "; tokens counted from chunks, not the server's usage (low under MTP)"
    )


# ---- what makes it measure again -------------------------------------------------------------------------

RECORDED = {
    "node": {"name": "spark-1", "host": "10.1.230.180"},
    "url": "http://127.0.0.1:8000",
    "model": MODEL,
    "mode": "report",
    "settings": {"output_tokens": 256, "prompt_tokens": 2048, "concurrency": 4, "deadline_s": 600},
    "floors": {},
    "image_ids": {"spark-1": "sha256:" + "a" * 64, "spark-2": "sha256:" + "b" * 64},
    "server_argv": ["vllm", "serve", "Qwen/Qwen3.5-122B-A10B-FP8", "--max-num-seqs", "4"],
    "nodes": ["spark-1", "spark-2"],
    "log_container": "qwen35-vllm",
    "api_key": KEY,
    "fabric": FABRIC,
    # What each node's serving containers give NCCL (layout.nccl_transport of containers.fabric_env).
    "nccl_env": {
        "spark-1": {"NCCL_IB_DISABLE": "0", "NCCL_IB_HCA": "rocep1s0f0", "NCCL_IB_GID_INDEX": "3"},
        "spark-2": {"NCCL_IB_DISABLE": "0", "NCCL_IB_HCA": "rocep1s0f0", "NCCL_IB_GID_INDEX": "3"},
    },
    "figures": FIGURES,
    "nccl_network": "IB",
    "measured_at": 1_800_000_000,
    "elapsed_s": 41.0,
    "verdict": "measured",
}


def nccl_env(node: str, **env: str) -> dict:
    """RECORDED's `nccl_env` with `node`'s variables changed."""
    return {**RECORDED["nccl_env"], node: {**RECORDED["nccl_env"][node], **env}}


@pytest.mark.parametrize(
    ("key", "value", "action"),
    [
        ("image_ids", {**RECORDED["image_ids"], "spark-2": "sha256:" + "c" * 64}, Action.MEASURE),
        ("server_argv", [*RECORDED["server_argv"][:-1], "8"], Action.MEASURE),
        ("nodes", ["spark-1", "spark-2", "spark-3"], Action.MEASURE),
        ("settings", {**RECORDED["settings"], "concurrency": 8}, Action.MEASURE),
        ("url", "http://127.0.0.1:8001", Action.MEASURE),
        ("model", "other", Action.MEASURE),
        # A fabric fixed (or broken) changes what the serving ranks' NCCL runs over.
        ("nccl_env", nccl_env("spark-2", NCCL_IB_HCA="rocep1s0f0,roceP2p1s0f0"), Action.MEASURE),
        ("nccl_env", nccl_env("spark-2", NCCL_IB_GID_INDEX="1"), Action.MEASURE),
        ("nccl_env", nccl_env("spark-1", NCCL_IB_DISABLE="1"), Action.MEASURE),
        # The same figures held to other floors, or under another mode: judged again, not measured.
        ("floors", {"min_decode_tps": 18}, Action.JUDGE),
        ("mode", "enforce", Action.JUDGE),
        ("node", {"name": "spark-1", "host": "10.1.230.190"}, Action.RECORD),
        ("log_container", "other-vllm", Action.RECORD),
    ],
)
def test_what_a_change_does(key, value, action):
    news = {**RECORDED, key: value}
    change = plan_change(RECORDED, news)
    assert change.updates == (key,) and change.replaces == ()
    assert measures_again(change) is (action is Action.MEASURE)
    assert update_action(RECORDED, news) is action


def test_a_new_floor_over_a_run_that_measured_nothing_measures():
    failed = {**RECORDED, "figures": None, "verdict": "failed", "error": "serve bench: decode: answered 500"}
    assert update_action(failed, {**failed, "floors": {"min_decode_tps": 18}}) is Action.MEASURE
    assert update_action(failed, {**failed, "mode": "enforce"}) is Action.MEASURE
    # A floor changed beside what is measured: measured (the new figures are judged on the new floor).
    both = {
        **RECORDED,
        "floors": {"min_decode_tps": 18},
        "settings": {**RECORDED["settings"], "concurrency": 8},
    }
    assert update_action(RECORDED, both) is Action.MEASURE


@pytest.mark.parametrize(
    ("key", "value"),
    [("api_key", "sk-rotated"), ("fabric", {"check": "report", "nodes": {}}), ("figures", None)],
)
def test_a_rotated_key_or_new_fabric_figures_change_nothing(key, value):
    assert not plan_change(RECORDED, {**RECORDED, key: value}).changes


def test_a_no_op_up_changes_nothing():
    inputs = {k: v for k, v in RECORDED.items() if k not in ("figures", "verdict")}
    assert not plan_change(RECORDED, inputs).changes


# ---- the provider's verbs ---------------------------------------------------------------------------------


@pytest.fixture
def runs(monkeypatch):
    """The bench's runs on the head, each answered by the next of `answers` (a report or an error)."""
    calls: list[dict] = []
    answers: list = []

    def run(props):
        calls.append(dict(props))
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    monkeypatch.setattr(bench_execute, "_run", run)
    return calls, answers


REPORT = {"figures": FIGURES, "nccl_network": "IB", "elapsed_s": 41.0, "measured_at": 1_800_000_000}


def test_refresh_runs_nothing_and_gives_back_the_recorded_figures(runs):
    calls, _ = runs
    read = ServeBenchProvider().read("spark-1-bench", dict(RECORDED))
    assert read.outs == RECORDED and read.id == "spark-1-bench"
    assert calls == []


def test_an_update_that_changes_nothing_measured_records_without_running(runs):
    calls, _ = runs
    news = {**RECORDED, "node": {"name": "spark-1", "host": "10.1.230.190"}, "figures": None}
    outs = ServeBenchProvider().update("id", dict(RECORDED), news).outs
    assert calls == [] and outs["node"]["host"] == "10.1.230.190" and outs["figures"] == FIGURES


def test_an_update_of_the_fabric_measures_again(runs):
    calls, answers = runs
    answers.append({**REPORT, "figures": {**FIGURES, "decode_tps": 21.0}})
    news = {**RECORDED, "nccl_env": nccl_env("spark-2", NCCL_IB_DISABLE="0", NCCL_IB_HCA="rocep1s0f1")}
    outs = ServeBenchProvider().update("id", dict(RECORDED), news).outs
    assert len(calls) == 1 and outs["figures"]["decode_tps"] == 21.0 and outs["nccl_env"] == news["nccl_env"]


@pytest.mark.parametrize(
    ("change", "verdict", "shortfall"),
    [
        (
            {"floors": {"min_decode_tps": 18}},
            "below",
            "decode 12.5 tokens/s is below bench.min_decode_tps 18",
        ),
        ({"floors": {"min_decode_tps": 12}}, "pass", None),
        ({"floors": {}}, "measured", None),
        ({"mode": "enforce", "floors": {"min_decode_tps": 12}}, "pass", None),
    ],
)
def test_an_update_of_floors_or_mode_judges_the_recorded_figures_again(runs, change, verdict, shortfall):
    calls, _ = runs  # no answer queued: a run would fail the test
    olds = {**RECORDED, "floors": {"min_decode_tps": 10}, "verdict": "pass"}
    news = {**olds, **change, "figures": None, "verdict": None}
    outs = ServeBenchProvider().update("id", olds, news).outs
    assert calls == []
    assert outs["verdict"] == verdict and outs["figures"] == FIGURES
    assert (outs["measured_at"], outs["elapsed_s"], outs["nccl_network"]) == (1_800_000_000, 41.0, "IB")
    assert outs["floors"] == news["floors"] and outs["mode"] == news["mode"]
    assert outs["shortfalls"][0].startswith(shortfall) if shortfall else outs["shortfalls"] == []
    assert bool(outs["causes"]) is (verdict == "below")


def test_enforce_refuses_recorded_figures_below_a_new_floor_without_measuring(runs):
    calls, _ = runs
    news = {**RECORDED, "mode": "enforce", "floors": {"min_decode_tps": 18}, "figures": None}
    with pytest.raises(BelowFloor, match="decode 12.5 tokens/s is below bench.min_decode_tps 18"):
        ServeBenchProvider().update("id", dict(RECORDED), news)
    assert calls == []


def test_an_update_of_the_image_measures_again_with_the_new_inputs(runs):
    calls, answers = runs
    answers.append({**REPORT, "figures": {**FIGURES, "decode_tps": 20.0}})
    news = {**RECORDED, "image_ids": {"spark-1": "sha256:" + "d" * 64, "spark-2": "sha256:" + "e" * 64}}
    outs = ServeBenchProvider().update("id", dict(RECORDED), news).outs
    assert len(calls) == 1 and calls[0]["image_ids"] == news["image_ids"]
    assert outs["figures"]["decode_tps"] == 20.0 and outs["nccl_network"] == "IB"


def test_report_records_a_miss_and_a_failure_and_goes_on(runs):
    calls, answers = runs
    answers += [REPORT, BenchFailed("spark-1", ["python3", "-"], 3, "serve bench: decode: answered 500")]
    below = ServeBenchProvider().create({**RECORDED, "floors": {"min_decode_tps": 18}}).outs
    assert below["verdict"] == "below" and below["shortfalls"][0].startswith("decode 12.5 tokens/s is below")
    assert any("NCCL used network IB" in c for c in below["causes"])
    failed = ServeBenchProvider().create(dict(RECORDED)).outs
    assert failed["verdict"] == "failed" and failed["figures"] is None and "answered 500" in failed["error"]


def test_enforce_fails_up_naming_the_figure_the_floor_and_the_causes(runs):
    _, answers = runs
    answers.append({**REPORT, "nccl_network": "Socket"})
    with pytest.raises(BelowFloor) as info:
        ServeBenchProvider().create({**RECORDED, "mode": "enforce", "floors": {"min_decode_tps": 18}})
    message = str(info.value)
    assert "decode 12.5 tokens/s is below bench.min_decode_tps 18 tokens/s" in message
    assert "NCCL used network Socket" in message and "MTUs differ" in message
    assert KEY not in message


def test_enforce_fails_up_when_nothing_could_be_measured(runs):
    _, answers = runs
    answers.append(BenchFailed("spark-1", ["python3", "-"], 3, "serve bench: prefill: the deadline passed"))
    with pytest.raises(BenchFailed, match="could not measure"):
        ServeBenchProvider().create({**RECORDED, "mode": "enforce", "floors": {"min_decode_tps": 1}})


def test_enforce_passes_at_or_above_every_floor(runs):
    _, answers = runs
    answers.append(REPORT)
    outs = ServeBenchProvider().create({**RECORDED, "mode": "enforce", "floors": {"min_decode_tps": 12}}).outs
    assert outs["verdict"] == "pass" and outs["shortfalls"] == [] and outs["causes"] == []


class CountingClient:
    """A server whose tokenizer makes one token of every byte (the lab's tiny checkpoint's)."""

    def __init__(self, per_token: float | None):
        self.per_token = per_token
        self.asked = 0

    def count_tokens(self, model: str, prompt: str) -> int | None:
        self.asked += 1
        return None if self.per_token is None else int(len(prompt.encode()) / self.per_token)


def test_the_prefill_prompt_is_sized_by_the_server_s_own_tokenizer():
    from components.node_programs.serve_bench import sized_prompt

    byte_level = CountingClient(per_token=1.0)
    prompt = sized_prompt(byte_level, "m", 256)
    assert abs(byte_level.count_tokens("m", prompt) - 256) <= 12, len(prompt)
    # A word a token where the server cannot count: the old estimate, asked once.
    none = CountingClient(per_token=None)
    assert len(sized_prompt(none, "m", 256).split()) == 249 and none.asked == 1
