"""AnswerCheck's provider without a node: which changes check again (and which judge against the last
accepted receipt), refresh and a no-op `up` run nothing, report records and goes on, enforce fails
`up` naming what was refused, and the continuations the program is given."""

from __future__ import annotations

import pytest

from components.answer_check import (
    AnswerCheckProvider,
    CheckFailed,
    WrongAnswers,
    against_receipt,
    answer_spec,
    checks_again,
    forced,
    plan_change,
)
from components.answer_check import execute as answers_execute
from tests.unit.test_answer_check_program import KEY, MODEL, SETTINGS

RECEIPT = {
    "id": "story",
    "prompt_tokens": 12,
    "prompt_digest": "abc",
    "prompt_nll": 2.5,
    "generated": [5, 6],
    "generated_logprobs": [-0.05, -0.05],
    "text": " w5 w6",
    "scored": [
        {"tokens": [5, 6], "logprobs": [-0.05, -0.05], "top_ids": [5, 6], "top_logprobs": [-0.05, -0.05]}
    ],
}
BROKEN = {
    **RECEIPT,
    "generated": [9, 9],
    "scored": [
        {"tokens": [9, 9], "logprobs": [-0.05, -0.05], "top_ids": [9, 9], "top_logprobs": [-0.05, -0.05]},
        {"tokens": [5, 6], "logprobs": [-9.0, -9.0], "top_ids": [9, 9], "top_logprobs": [-0.05, -0.05]},
    ],
}
RECORDED = {
    "node": {"name": "spark-1", "host": "10.1.230.180"},
    "url": "http://127.0.0.1:8000",
    "model": MODEL,
    "mode": "report",
    "settings": dict(SETTINGS),
    "prompt_set": {"version": "answers-v1", "digest": "0123"},
    "reference": None,
    "image_ids": {"spark-1": "sha256:" + "a" * 64, "spark-2": "sha256:" + "b" * 64},
    "server_argv": ["vllm", "serve", "Qwen/Qwen3.5-122B-A10B-FP8", "--max-num-seqs", "4"],
    "nodes": ["spark-1", "spark-2"],
    "fabric": {"spark-1": {"ib_hca": ["rocep1s0f0"], "gid_index": 3}},
    "api_key": KEY,
    "receipts": [RECEIPT],
    "verdict": "pass",
    "accepted": None,
}


@pytest.mark.parametrize(
    ("key", "value", "checks", "against_receipt_too"),
    [
        ("image_ids", {**RECORDED["image_ids"], "spark-2": "sha256:" + "c" * 64}, True, True),
        ("server_argv", [*RECORDED["server_argv"][:-1], "8"], True, True),
        ("nodes", ["spark-1", "spark-2", "spark-3"], True, True),
        ("fabric", {"spark-1": {"ib_hca": ["rocep1s0f0"], "gid_index": 1}}, True, True),
        ("prompt_set", {"version": "answers-v2", "digest": "4567"}, True, False),
        ("reference", {"version": "answers-v1", "prompts": {}}, True, False),
        ("settings", {**SETTINGS, "max_tokens": 8}, True, False),
        ("mode", "enforce", True, False),
        ("url", "http://127.0.0.1:8001", True, False),
        ("model", "other", True, False),
        ("node", {"name": "spark-1", "host": "10.1.230.190"}, False, False),
    ],
)
def test_what_checks_again_and_what_is_judged_against_the_receipt(key, value, checks, against_receipt_too):
    news = {**RECORDED, key: value}
    change = plan_change(RECORDED, news)
    assert change.updates == (key,) and change.replaces == ()
    assert checks_again(change) is checks
    assert (against_receipt(RECORDED, news) == [RECEIPT]) is against_receipt_too


@pytest.mark.parametrize(("key", "value"), [("api_key", "sk-rotated"), ("receipts", None), ("verdict", None)])
def test_a_rotated_key_or_the_outputs_change_nothing(key, value):
    assert not plan_change(RECORDED, {**RECORDED, key: value}).changes


def test_a_no_op_up_changes_nothing():
    inputs = {k: v for k, v in RECORDED.items() if k not in ("receipts", "verdict", "accepted")}
    assert not plan_change(RECORDED, inputs).changes


def test_after_a_failed_run_the_last_accepted_receipt_is_the_baseline():
    failed = {**RECORDED, "verdict": "fail", "receipts": [BROKEN], "accepted": [RECEIPT]}
    news = {**failed, "image_ids": {"spark-1": "sha256:" + "d" * 64}}
    assert against_receipt(failed, news) == [RECEIPT]


def test_the_program_scores_the_reference_s_and_the_receipt_s_continuations():
    reference = {"version": "answers-v1", "prompts": {"story": {"prompt_ids": [1, 2], "tokens": [7, 8]}}}
    props = {**RECORDED, "reference": reference}
    assert forced(props, [RECEIPT]) == {"story": [[7, 8], [5, 6]]}
    spec = answer_spec(props, forced(props, [RECEIPT]))
    story = next(p for p in spec["prompts"] if p["id"] == "story")
    assert story["prompt_ids"] == [1, 2] and story["force"] == [[7, 8], [5, 6]]
    others = [p for p in spec["prompts"] if p["id"] != "story"]
    assert all("prompt_ids" not in p and p["force"] == [] for p in others)


# ---- the provider's verbs ---------------------------------------------------------------------------------


@pytest.fixture
def runs(monkeypatch):
    """The check's runs on the head, each answered by the next of `answers` (a report or an error)."""
    calls: list[tuple[dict, list | None]] = []
    answers: list = []

    def run(props, accepted):
        calls.append((dict(props), accepted))
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    monkeypatch.setattr(answers_execute, "_run", run)
    return calls, answers


def report(*receipts: dict) -> dict:
    return {
        "version": "answers-v1",
        "receipts": list(receipts),
        "elapsed_s": 3.0,
        "checked_at": 1_800_000_000,
    }


def test_refresh_runs_nothing_and_gives_back_the_recorded_answers(runs):
    calls, _ = runs
    read = AnswerCheckProvider().read("spark-1-answers", dict(RECORDED))
    assert read.outs == RECORDED and read.id == "spark-1-answers" and calls == []


def test_an_update_that_changes_nothing_judged_records_without_running(runs):
    calls, _ = runs
    news = {**RECORDED, "node": {"name": "spark-1", "host": "10.1.230.190"}, "receipts": None}
    outs = AnswerCheckProvider().update("id", dict(RECORDED), news).outs
    assert calls == [] and outs["node"]["host"] == "10.1.230.190" and outs["receipts"] == [RECEIPT]


def test_an_upgrade_is_checked_against_the_last_accepted_receipt(runs):
    calls, answers = runs
    answers.append(report(BROKEN))
    news = {**RECORDED, "image_ids": {"spark-1": "sha256:" + "d" * 64}}
    outs = AnswerCheckProvider().update("id", dict(RECORDED), news).outs
    assert calls[0][1] == [RECEIPT]
    assert outs["verdict"] == "fail" and outs["judged_against"] == ["receipt", "self"]
    assert outs["problems"][0].startswith("prompt 'story' token 0: expected token 5, served token 9")
    assert outs["accepted"] == [RECEIPT]


def test_enforce_fails_up_naming_the_prompt_position_tokens_and_gap(runs):
    _, answers = runs
    answers.append(report(BROKEN))
    news = {**RECORDED, "mode": "enforce", "image_ids": {"spark-1": "sha256:" + "d" * 64}}
    with pytest.raises(WrongAnswers) as info:
        AnswerCheckProvider().update("id", dict(RECORDED), news)
    message = str(info.value)
    assert "answer check on spark-1: 1 problem(s), judged against receipt, self" in message
    assert (
        "prompt 'story' token 0: expected token 5, served token 9; the expected token's served logprob is "
        "8.950 below the served top's" in message
    )
    assert "(and 1 more position(s) there)" in message and "next:" in message and KEY not in message


def test_report_records_a_failure_to_run_and_goes_on(runs):
    _, answers = runs
    answers.append(CheckFailed("spark-1", ["python3", "-"], 3, "answer check: prompt story: generate: 500"))
    outs = AnswerCheckProvider().create({**RECORDED, "receipts": None, "verdict": None}).outs
    assert outs["verdict"] == "error" and outs["receipts"] is None and "generate: 500" in outs["error"]


def test_enforce_fails_up_when_the_check_could_not_run(runs):
    _, answers = runs
    answers.append(
        CheckFailed("spark-1", ["python3", "-"], 3, "answer check: prompt story: the deadline passed")
    )
    with pytest.raises(CheckFailed, match="could not record the answers"):
        AnswerCheckProvider().create({**RECORDED, "mode": "enforce"})


def test_a_first_run_that_passes_is_accepted(runs):
    calls, answers = runs
    answers.append(report(RECEIPT))
    outs = (
        AnswerCheckProvider().create({**RECORDED, "receipts": None, "verdict": None, "mode": "enforce"}).outs
    )
    assert calls[0][1] is None and outs["verdict"] == "pass" and outs["receipts"] == [RECEIPT]
    assert outs["judged_against"] == ["self"] and outs["accepted"] is None
