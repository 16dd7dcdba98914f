"""bench.engine.Prober's judgements over stamped answers, without an endpoint: the outage around
the first unanswered request, and the longest gap between answered completions in a window."""

from __future__ import annotations

import math

import pytest

from bench.engine import Prober


def prober(answers: list[tuple[float, bool]]) -> Prober:
    made = Prober("http://127.0.0.1:9/v1", "model", "key")  # never started: no request is sent
    made.answers = answers
    return made


@pytest.mark.parametrize(
    ("answers", "begin", "end", "gap"),
    [
        ([(0.0, True), (1.0, True), (1.5, True)], 0.0, 2.0, 1.0),
        # the gap spans failures; its edges reach past the window to the answers around it
        ([(0.0, True), (1.0, False), (2.0, False), (5.0, True), (5.1, True)], 0.5, 4.0, 5.0),
        ([(0.0, True), (0.2, True), (3.0, False), (4.0, True)], 1.0, 2.0, 3.8),
        ([(0.0, True), (1.0, False)], 0.5, 2.0, math.inf),  # the new server never answered
        ([], 0.0, 1.0, math.inf),
    ],
)
def test_longest_gap(answers, begin, end, gap):
    assert prober(answers).longest_gap(begin, end) == pytest.approx(gap)


def test_outage_is_the_window_around_the_first_failure_after_a_moment():
    answers = [(0.0, True), (0.5, False), (1.0, True), (2.0, True), (2.5, False), (3.0, False), (4.0, True)]
    assert prober(answers).outage() == (0.0, 1.0)
    assert prober(answers).outage(after=2.2) == (2.0, 4.0)
    assert prober(answers[:6]).outage(after=2.2) == (2.0, math.inf)
    assert prober([(0.0, True), (1.0, True)]).outage() is None


def test_the_bench_s_start_figures_and_their_ratio_to_the_first():
    from bench.engine import start_figures

    first = {
        "weights_loaded_s": 40.0,
        "engine_ready_s": 42.0,
        "api_ready_s": 44.0,
        "first_completion_s": 50.0,
    }
    second = {
        "weights_loaded_s": 30.0,
        "engine_ready_s": 31.5,
        "api_ready_s": None,
        "first_completion_s": 40.0,
    }
    assert start_figures(first) == "weights 40.0 s, engine 42.0 s, API 44.0 s, first completion 50.0 s"
    assert start_figures(second, first) == (
        "weights 30.0 s (0.75x the first), engine 31.5 s (0.75x the first), API -, "
        "first completion 40.0 s (0.80x the first)"
    )
