"""The answer check's judgement, by teacher forcing: the position rules as tables (a near-tie passes,
a broken kernel fails naming the prompt, position, tokens and gap; drift beyond the tolerance fails),
then whole runs against the stand-in server judged against a reference, a receipt and themselves,
and the known answers against `answers.min_correct`."""

from __future__ import annotations

import math

import pytest

from components.answer_check import Tolerances, answer_spec, forced, judge_position, judged, prompt_set
from components.answer_check.judge import known_answer_correct, runner_up_bound
from components.node_programs import answer_check as program
from tests.support.answers_server import AnswersServer, word_id
from tests.unit.test_answer_check_program import KEY, MODEL, SETTINGS, props_for

TOL = Tolerances(logprob=0.5, tie=0.5)


@pytest.mark.parametrize(
    ("case", "expected", "served", "kind"),
    [
        ("the same token, the same logprob", (5, -0.1, None), (-0.1, 5, -0.1), None),
        ("the same token, drift within the tolerance", (5, -0.1, None), (-0.5, 5, -0.5), None),
        ("the same token, drift beyond the tolerance", (5, -0.1, None), (-0.9, 5, -0.9), "drift"),
        # The reference saw two tokens 0.04 apart; the served model flips them, 0.05 apart: legitimate.
        ("a near-tie flipped", (5, -0.70, [[5, -0.70], [6, -0.74]]), (-0.74, 6, -0.69), "tie"),
        # Served close, but the reference was sure: the served model moved mass it should not have.
        ("close served, sure reference", (5, -0.01, [[5, -0.01], [6, -5.0]]), (-0.60, 6, -0.40), "diverged"),
        # A broken kernel: the expected token far below the served top.
        ("a broken kernel", (5, -0.05, [[5, -0.05], [6, -3.2]]), (-9.0, 6, -0.05), "diverged"),
        # No alternatives: p(e) = 0.55 leaves at most 0.45 to any other token, a gap of 0.2 at least.
        (
            "a possible tie, no alternatives",
            (5, math.log(0.55), None),
            (math.log(0.45), 6, math.log(0.55)),
            "tie",
        ),
        ("a sure baseline, no alternatives", (5, math.log(0.99), None), (-0.8, 6, -0.6), "diverged"),
        # A served gap beyond the tie tolerance fails even where the baseline had a tie.
        ("a wide served gap", (5, -0.70, [[5, -0.70], [6, -0.74]]), (-2.0, 6, -0.2), "diverged"),
        # A near-tie with its logprob drifted beyond the tolerance still fails, as drift.
        ("a tie that drifted", (5, -0.70, [[5, -0.70], [6, -0.74]]), (-1.3, 6, -1.0), "drift"),
    ],
)
def test_position_rules(case, expected, served, kind):
    finding = judge_position("p", "reference", 3, expected, served, TOL)
    assert (finding.kind if finding else None) == kind, case


def test_a_broken_kernel_is_named_by_prompt_position_tokens_and_gap():
    finding = judge_position("capital-france", "reference", 2, (791, -0.05, None), (-9.0, 412, -0.05), TOL)
    assert finding.fails
    line = finding.line(TOL, ["The", " capital", " Paris"])
    assert line.startswith("prompt 'capital-france' token 2: expected token 791 (' Paris'), served token 412")
    assert "8.950 below the served top's (beyond answers.tie_logprob 0.5)" in line
    assert "against the reference" in line


def test_a_drift_is_named_with_both_logprobs():
    finding = judge_position("story", "receipt", 0, (9, -0.2, None), (-1.7, 9, -1.7), TOL)
    assert finding.line(TOL) == (
        "prompt 'story' token 0: the served logprob of token 9 is -1.700, the last accepted receipt has "
        "-0.200: a drift of 1.500 (answers.logprob_tolerance 0.5)"
    )


@pytest.mark.parametrize(
    ("alternatives", "served_top", "bound"),
    [
        ([[5, -0.1], [6, -2.0], [7, -3.0]], 6, -2.0),  # listed: its own figure
        ([[5, -0.1], [6, -2.0], [7, -3.0]], 8, -3.0),  # not listed: no likelier than the least listed
        (None, 6, math.log(1 - math.exp(-0.1))),  # none listed: what e leaves
    ],
)
def test_the_baseline_s_logprob_of_the_served_top_is_bounded(alternatives, served_top, bound):
    assert runner_up_bound(5, -0.1, alternatives, served_top) == pytest.approx(bound)


@pytest.mark.parametrize(
    ("text", "answer", "right"),
    [
        (" Paris, the city of light.", "Paris", True),
        ("\n\n paris\nLondon", "Paris", True),
        (" 42", "42", True),
        (" 142", "42", False),
        (" London.\nParis", "Paris", False),
        ("", "Au", False),
    ],
)
def test_a_known_answer_is_a_whole_word_of_the_first_line(text, answer, right):
    assert known_answer_correct(text, answer) is right


# ---- whole runs against the stand-in -----------------------------------------------------------------------


@pytest.fixture
def server():
    with AnswersServer(KEY) as running:
        yield running


def record(server, props: dict, accepted: list | None = None) -> dict:
    """The program's report, run in this process against the stand-in."""
    client = program.Client(server.url, KEY, float("inf"), 10, lambda: 0.0)
    spec = answer_spec(props, forced(props, accepted))
    receipts = program.run(client, MODEL, spec, SETTINGS["max_tokens"], SETTINGS["top"], lambda _line: None)
    return {"version": spec["version"], "receipts": receipts, "elapsed_s": 1.0, "checked_at": 1_800_000_000}


def reference_from(report: dict) -> dict:
    """A reference as another implementation would give it: each prompt's ids, tokens, logprobs and
    top tokens (the right model's, here the stand-in's before it broke)."""
    prompts = {}
    for receipt in report["receipts"]:
        [own] = [s for s in receipt["scored"] if s["tokens"] == receipt["generated"]]
        prompts[receipt["id"]] = {
            "tokens": own["tokens"],
            "logprobs": own["logprobs"],
            "alternatives": own["alternatives"],
        }
    return {"version": "answers-v1", "prompts": prompts}


def test_a_right_server_passes_against_the_reference_and_itself(server):
    reference = reference_from(record(server, props_for(server.url)))
    props = props_for(server.url, reference=reference, prompt_set={"version": "answers-v1"})
    outs = judged(props, record(server, props))
    assert outs["verdict"] == "pass" and outs["problems"] == [], outs["problems"]
    assert outs["judged_against"] == ["reference", "self"]
    assert outs["known_answers"]["of"] == 5 and outs["known_answers"]["min_correct"] is None


def test_a_broken_kernel_fails_naming_the_first_divergent_token(server):
    reference = reference_from(record(server, props_for(server.url)))
    server.model.broken = True
    props = props_for(server.url, reference=reference)
    outs = judged(props, record(server, props))
    assert outs["verdict"] == "fail"
    first = next(p for p in outs["problems"] if "'capital-france'" in p and "reference" in p)
    expected = reference["prompts"]["capital-france"]["tokens"][0]
    assert first.startswith(f"prompt 'capital-france' token 0: expected token {expected}, served token ")
    assert "below the served top's (beyond answers.tie_logprob 0.5)" in first
    assert first.endswith(f"(and {SETTINGS['max_tokens'] - 1} more position(s) there)")
    # Its own generation is consistent (decode and prefill agree on the broken model): only the
    # reference sees it.
    assert not [p for p in outs["problems"] if "its own generation" in p]
    assert {f["kind"] for f in outs["findings"]} == {"diverged"}


def test_a_near_tie_decided_the_other_way_passes(server):
    # After capital-france's last prompt token the model has two tokens 0.04 nats apart; the
    # reference's implementation picked one, the served model picks the other.
    last = word_id(prompt_set(64)[0]["text"].split()[-1])
    server.model.ties = {last}
    reference = reference_from(record(server, props_for(server.url)))
    server.model.flips = {last}
    props = props_for(server.url, reference=reference)
    outs = judged(props, record(server, props))
    assert outs["verdict"] == "pass", outs["problems"]
    [tie] = [f for f in outs["findings"] if f["against"] == "reference"]
    assert (tie["prompt"], tie["position"], tie["kind"]) == ("capital-france", 0, "tie")
    assert tie["served"] != tie["expected"] and tie["gap"] == pytest.approx(0.04)
    # The served model sure of the other token (no tie served): that fails.
    server.model.ties = set()
    outs = judged(props, record(server, props))
    assert outs["verdict"] == "fail"


def test_logprobs_drifted_beyond_the_tolerance_fail(server):
    reference = reference_from(record(server, props_for(server.url)))
    server.model.drift = -0.8
    props = props_for(server.url, reference=reference)
    outs = judged(props, record(server, props))
    assert outs["verdict"] == "fail"
    assert any("a drift of 0.800 (answers.logprob_tolerance 0.5)" in p for p in outs["problems"])


def test_an_upgrade_is_judged_against_the_last_accepted_receipt(server):
    props = props_for(server.url)
    first = judged(props, record(server, props))
    assert first["verdict"] == "pass" and first["judged_against"] == ["self"]
    server.model.broken = True
    accepted = first["receipts"]
    outs = judged(props, record(server, props, accepted), accepted)
    assert outs["judged_against"] == ["receipt", "self"] and outs["verdict"] == "fail"
    assert any("against the last accepted receipt" in p for p in outs["problems"])
    # A failed run keeps the receipts that passed as the next run's baseline.
    assert outs["accepted"] == accepted


def test_too_few_known_answers_fail_under_min_correct(server):
    props = props_for(server.url, settings={**SETTINGS, "min_correct": 1})
    outs = judged(props, record(server, props))
    assert outs["known_answers"]["correct"] == 0 and outs["verdict"] == "fail"
    [line] = outs["problems"]
    assert line.startswith(
        "known answers: 0 of 5 right, below answers.min_correct 1: capital-france answered"
    )
    assert "expected 'Paris'" in line


def test_a_run_that_could_not_check_keeps_the_last_accepted_receipts():
    outs = judged(props_for("http://x"), None, [{"id": "story"}], error="the deadline passed")
    assert outs["verdict"] == "error" and outs["problems"] == ["the deadline passed"]
    assert outs["accepted"] == [{"id": "story"}] and outs["receipts"] is None


def test_the_own_generation_is_held_to_its_teacher_forced_scores():
    receipt = {
        "id": "story",
        "prompt_digest": "d",
        "generated": [5, 6],
        "generated_logprobs": [-0.05, -0.05],
        "text": "",
        # Prefill ranks the decoded second token far below another: a decode-only fault.
        "scored": [
            {"tokens": [5, 6], "logprobs": [-0.05, -7.0], "top_ids": [5, 9], "top_logprobs": [-0.05, -0.1]}
        ],
    }
    outs = judged(props_for("http://x"), {"receipts": [receipt]})
    assert outs["verdict"] == "fail"
    assert outs["problems"][0].startswith("prompt 'story' token 1: expected token 6, served token 9")
    assert outs["problems"][0].endswith("against its own generation (decode against prefill)")
