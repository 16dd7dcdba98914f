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
