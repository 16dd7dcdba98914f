"""The `answers` section typed: report by default with bounded counts, did-you-mean, keys the mode
ignores refused, `min_correct` within the known answers the set scores, requests that fit
`serve.max_model_len`."""

from __future__ import annotations

import pytest

from components.answer_check import known_answers
from components.config import CheckMode, ConfigError, parse_stack_config
from components.config.answers import KNOWN_ANSWERS
from tests.support.program import dev_raw


def with_answers(answers: dict | None, stack: str = "dev") -> dict:
    raw = dev_raw(stack)
    if answers is None:
        raw.pop("answers", None)
    else:
        raw["answers"] = answers
    return raw


def refusal(raw: dict) -> str:
    with pytest.raises(ConfigError) as info:
        parse_stack_config(raw)
    return str(info.value)


def test_a_spark_stack_reports_by_default_with_bounded_counts():
    answers = parse_stack_config(with_answers(None)).answers
    assert answers.mode is CheckMode.REPORT and answers.reference is None
    assert answers.settings() == {
        "max_tokens": 16,
        "top": 5,
        "long_prompt_tokens": 4096,
        "deadline_s": 300,
        "request_timeout_s": 120,
        "logprob_tolerance": 1.0,
        "tie_logprob": 0.5,
        "min_correct": None,
    }


@pytest.mark.parametrize(
    ("answers", "expected"),
    [
        ({"mode": False, "max_tokens": 8}, ["answers.max_tokens: is not read with answers.mode off"]),
        ({"mode": "off", "reference": "ref.json"}, ["answers.reference: is not read with answers.mode off"]),
        ({"min_corect": 2}, ["answers.min_corect: unknown key (did you mean 'min_correct'?)"]),
        ({"min_correct": 6}, ["answers.min_correct: the prompt set scores 5 known answers: give at most 5"]),
        ({"min_correct": 0}, ["answers.min_correct:"]),
        ({"tie_logprob": -0.1}, ["answers.tie_logprob:"]),
        ({"logprob_tolerance": 0}, ["answers.logprob_tolerance:"]),
        ({"max_tokens": 1000}, ["answers.max_tokens:"]),
        ({"top": 1}, ["answers.top:"]),
        ({"deadline_s": 60, "request_timeout_s": 90}, ["answers.request_timeout_s: 90 s is longer than"]),
        ({"mode": "always"}, ["answers.mode:"]),
        ({"reference": ""}, ["answers.reference:"]),
        # The dev stack's serve.max_model_len is 32768.
        (
            {"long_prompt_tokens": 32768},
            ["answers.long_prompt_tokens: the long prompt and its generation, about"],
        ),
    ],
)
def test_bad_answers_sections_are_refused_naming_the_key(answers, expected):
    message = refusal(with_answers(answers))
    for part in expected:
        assert part in message, message


def test_off_enforce_and_a_reference_load():
    assert parse_stack_config(with_answers({"mode": False})).answers.mode is CheckMode.OFF
    enforce = parse_stack_config(with_answers({"mode": "enforce", "min_correct": 3, "reference": "r.json"}))
    assert enforce.answers.settings()["min_correct"] == 3 and enforce.answers.reference == "r.json"


def test_the_lab_stand_in_stack_runs_no_check():
    # The stand-in vLLM answers no logprobs: nothing to judge there.
    assert parse_stack_config(dev_raw("lab")).answers.mode is CheckMode.OFF


def test_the_config_s_count_of_known_answers_is_the_prompt_set_s():
    assert len(known_answers()) == KNOWN_ANSWERS
