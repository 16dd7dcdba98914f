"""The answer check program on this machine, against a stand-in of vLLM's completions API with
logprobs (tests/support/answers_server.py, on 127.0.0.1): what it sends (greedy, token ids, the key
from stdin), what it records per prompt (generation, mean NLL, teacher-forced scores), and how it
fails (a wrong key, a deadline, an answer in another shape)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import urllib.error

import pytest

from components.answer_check import (
    VERSION,
    answer_argv,
    answer_program,
    answer_spec,
    parse_report,
    prompt_set,
)
from components.node_programs import answer_check as program
from components.node_programs import wire
from tests.support.answers_server import OTHER_LP, SECOND_LP, TOP_LP, AnswersServer, word_id

MODEL = "qwen3.5-test"
KEY = "sk-answers-secret-456"
SETTINGS = {
    "max_tokens": 4,
    "top": 3,
    "deadline_s": 30,
    "request_timeout_s": 10,
    "logprob_tolerance": 0.5,
    "tie_logprob": 0.5,
    "long_prompt_tokens": 64,
    "min_correct": None,
}


@pytest.fixture
def server():
    with AnswersServer(KEY) as running:
        yield running


def props_for(url: str, **extra) -> dict:
    return {"url": url, "model": MODEL, "settings": dict(SETTINGS), "reference": None, **extra}


def run_shipped(props: dict, forced: dict | None = None) -> subprocess.CompletedProcess:
    argv = answer_argv(props)
    assert KEY not in " ".join(argv)
    env = {k: v for k, v in os.environ.items() if k != wire.PROBE_API_KEY_ENV}
    source = answer_program(KEY, answer_spec(props, forced or {}))
    return subprocess.run(
        [sys.executable, *argv[1:]], input=source, capture_output=True, env=env, cwd="/", timeout=60
    )


def test_the_shipped_program_records_a_receipt_per_prompt_with_its_key_from_stdin(server):
    done = run_shipped(props_for(server.url))
    assert done.returncode == 0, done.stderr
    assert KEY.encode() not in done.stdout + done.stderr
    report = parse_report(done.stdout.decode())
    assert report["version"] == VERSION
    assert [r["id"] for r in report["receipts"]] == [p["id"] for p in prompt_set(64)]
    # Every request carried the key; completions are greedy, by token ids, with vLLM's logprobs.
    assert {seen["auth"] for seen in server.seen} == {f"Bearer {KEY}"}
    completions = [s["body"] for s in server.seen if s["path"] == "/v1/completions"]
    assert all(b["temperature"] == 0 and b["return_tokens_as_token_ids"] is True for b in completions)
    assert all(isinstance(b["prompt"], list) for b in completions)
    generations = [b for b in completions if b["max_tokens"] == 4]
    assert len(generations) == len(report["receipts"])
    assert all(b["logprobs"] == 1 and b["prompt_logprobs"] == 1 for b in generations)
    forcings = [b for b in completions if b["max_tokens"] == 1]
    assert all(b["prompt_logprobs"] == 3 and "logprobs" not in b for b in forcings)
    assert b"answers 1/" in done.stderr


def test_a_receipt_holds_the_generation_its_prompt_s_nll_and_the_forced_scores(server):
    done = run_shipped(props_for(server.url))
    receipt = parse_report(done.stdout.decode())["receipts"][0]
    ids = [1, *(word_id(w) for w in prompt_set(64)[0]["text"].split())]
    model = server.model
    expected, prev = [], ids[-1]
    for _ in range(4):
        prev = model.top_after(prev)
        expected.append(prev)
    assert receipt["generated"] == expected and receipt["generated_logprobs"] == [TOP_LP] * 4
    assert receipt["prompt_tokens"] == len(ids) and receipt["tokenizer_agrees"] is True
    # Every prompt token after the first, scored by the toy model: NLL is their mean.
    nll = sum(-model.logprob(ids[i - 1], ids[i]) for i in range(1, len(ids))) / (len(ids) - 1)
    assert receipt["prompt_nll"] == pytest.approx(nll, abs=1e-4)
    # The generation teacher-forced: its tokens are the served top at every position.
    [own] = receipt["scored"]
    assert own["tokens"] == expected and own["top_ids"] == expected
    assert own["logprobs"] == [TOP_LP] * 4 and own["top_logprobs"] == [TOP_LP] * 4
    assert [a[1][0] for a in own["alternatives"]] == [
        model.second_after(p) for p in [ids[-1], *expected[:-1]]
    ]


def test_a_chat_prompt_is_rendered_by_the_server_s_template(server):
    run_shipped(props_for(server.url))
    chats = [s["body"] for s in server.seen if s["path"] == "/tokenize" and "messages" in s["body"]]
    assert len(chats) == 2
    assert all(b["add_generation_prompt"] is True for b in chats)
    assert all(b["chat_template_kwargs"] == {"enable_thinking": False} for b in chats)


def test_the_reference_s_ids_are_sent_and_its_continuation_is_scored(server):
    first = prompt_set(64)[0]["id"]
    reference = {"prompts": {first: {"prompt_ids": [1, 500, 600], "tokens": [77, 78]}}}
    done = run_shipped(props_for(server.url, reference=reference), {first: [[77, 78]]})
    receipt = parse_report(done.stdout.decode())["receipts"][0]
    assert receipt["prompt_tokens"] == 3 and receipt["tokenizer_agrees"] is False
    forced = [s["body"]["prompt"] for s in server.seen if s["body"].get("max_tokens") == 1]
    assert [1, 500, 600, 77, 78] in forced
    scores = next(s for s in receipt["scored"] if s["tokens"] == [77, 78])
    model = server.model
    assert scores["logprobs"] == [model.logprob(600, 77), model.logprob(77, 78)] == [OTHER_LP, OTHER_LP]
    assert scores["top_ids"] == [model.top_after(600), model.top_after(77)]
    assert SECOND_LP in [a[1][1] for a in scores["alternatives"]]


def test_a_continuation_equal_to_the_generation_is_scored_once(server):
    first = prompt_set(64)[0]["id"]
    done = run_shipped(props_for(server.url))
    generated = parse_report(done.stdout.decode())["receipts"][0]["generated"]
    server.seen.clear()
    again = run_shipped(props_for(server.url), {first: [generated]})
    assert len(parse_report(again.stdout.decode())["receipts"][0]["scored"]) == 1


def test_a_wrong_key_exits_rejected_at_the_first_request(server, capsys, monkeypatch):
    monkeypatch.setenv(wire.PROBE_API_KEY_ENV, "sk-wrong")
    props = props_for(server.url)
    assert program.main(answer_argv(props)[2:], answer_spec(props, {})) == program.Exit.REJECTED
    assert "tokenize: the server answered 401" in capsys.readouterr().err and len(server.seen) == 1


def test_an_answer_in_another_shape_fails_naming_the_prompt(server, capsys, monkeypatch):
    monkeypatch.setenv(wire.PROBE_API_KEY_ENV, KEY)
    server.server.garbage = True
    props = props_for(server.url)
    assert program.main(answer_argv(props)[2:], answer_spec(props, {})) == program.Exit.FAILED
    err = capsys.readouterr().err
    assert "answer check: prompt capital-france: tokenize: " in err and "answered with no JSON" in err


def test_the_deadline_bounds_the_whole_check(server):
    ticks = iter(range(0, 10_000))
    client = program.Client(server.url, KEY, 3, 10, lambda: next(ticks))
    spec = answer_spec(props_for(server.url), {})
    with pytest.raises(program.AnswerError, match="deadline passed before this request"):
        program.run(client, MODEL, spec, 4, 3, lambda _line: None)


def test_nothing_listening_fails_naming_the_prompt_and_stage(capsys, monkeypatch):
    monkeypatch.setenv(wire.PROBE_API_KEY_ENV, KEY)
    props = props_for("http://127.0.0.1:9")
    assert program.main(answer_argv(props)[2:], answer_spec(props, {})) == program.Exit.FAILED
    assert "answer check: prompt capital-france: tokenize:" in capsys.readouterr().err


def test_the_program_carries_the_key_in_its_prelude_only():
    text = answer_program(KEY, {"version": VERSION, "prompts": []}).decode()
    assert text.splitlines()[1] == f"os.environ[{wire.PROBE_API_KEY_ENV!r}] = {KEY!r}"
    assert json.loads(text.splitlines()[2].split(" = ", 1)[1].strip("'")) == {
        "version": VERSION,
        "prompts": [],
    }


@pytest.mark.parametrize(
    ("entry", "said"),
    [
        ({"logprobs": {"tokens": ["hello"], "token_logprobs": [-1.0]}}, "not token_id:<n>"),
        ({"logprobs": {"tokens": ["token_id:3"], "token_logprobs": []}}, "1 tokens and 0 logprobs"),
    ],
)
def test_generation_in_another_shape_is_refused(entry, said):
    with pytest.raises(ValueError, match=said):
        program.generated({"prompt_logprobs": [None, {"5": {"logprob": -1.0, "rank": 1}}], **entry}, [4, 5])


def test_an_infinite_logprob_is_recorded_finite():
    entry = {"7": {"logprob": float("-inf"), "rank": 900}, "8": {"logprob": -0.1, "rank": 1}}
    assert program.prompt_token_logprob(entry, 7) == program.FLOOR_LOGPROB
    assert program.ranked(entry, 5) == [[8, -0.1], [7, program.FLOOR_LOGPROB]]


@pytest.mark.parametrize(
    ("error", "said", "rejected"),
    [
        (urllib.error.HTTPError("u", 401, "no", {}, io.BytesIO(b"")), "the API key does not match", True),
        (urllib.error.HTTPError("u", 403, "no", {}, io.BytesIO(b"")), "answered 403: the API key", True),
        (
            urllib.error.HTTPError("u", 500, "x", {}, io.BytesIO(b"engine dead")),
            "answered 500: engine dead",
            False,
        ),
        (
            urllib.error.URLError(ConnectionRefusedError(111, "refused")),
            "http://h:1: [Errno 111] refused",
            False,
        ),
        (TimeoutError("timed out"), "http://h:1: timed out", False),
    ],
)
def test_one_reading_of_a_failed_request_for_the_bench_and_the_check(error, said, rejected):
    detail, refused = wire.http_failure(error, "http://h:1")
    assert said in detail and refused is rejected


def test_the_long_prompt_is_cut_to_its_size_in_tokens_whatever_a_word_takes(server):
    # The stand-in's tokenizer spends a token a word; a byte-level one (the lab's) about six: the
    # long prompt is sized in tokens, so the server's ids are cut at `long_prompt_tokens`.
    props = props_for(server.url)
    (long,) = [p for p in answer_spec(props, {})["prompts"] if p["id"] == "long"]
    assert long["limit"] == SETTINGS["long_prompt_tokens"]
    report = parse_report(run_shipped({**props, "settings": {**SETTINGS, "long_prompt_tokens": 10}}).stdout)
    (receipt,) = [r for r in report["receipts"] if r["id"] == "long"]
    assert receipt["prompt_tokens"] == 10, receipt
