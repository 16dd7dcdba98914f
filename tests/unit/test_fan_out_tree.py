"""fan_out_tree: the fan-out tree (pure)."""

from __future__ import annotations

import math

import pytest

from components.provider_kit.fan_out_tree import fan_out_tree


@pytest.mark.parametrize("count", [1, 2, 3, 4, 7, 8, 15, 20])
def test_rounds_grow_as_log2(count):
    workers = [f"w{i}" for i in range(count)]
    rounds = fan_out_tree("head", workers)
    assert len(rounds) == math.ceil(math.log2(count + 1))
    received = [dst for round_ in rounds for _, dst in round_]
    assert sorted(received) == sorted(workers)


def test_a_source_has_the_image_before_it_serves():
    have = {"head"}
    for round_ in fan_out_tree("head", [f"w{i}" for i in range(10)]):
        assert all(src in have for src, _ in round_)
        assert len({src for src, _ in round_}) == len(round_)  # one copy per source per round
        have |= {dst for _, dst in round_}


def test_nodes_that_cannot_reexport_never_serve():
    rounds = fan_out_tree("head", ["d1", "w1", "d2", "w2", "w3"], can_reexport={"w1", "w2", "w3"})
    sources = {src for round_ in rounds for src, _ in round_}
    assert not sources & {"d1", "d2"}
    assert sorted(dst for round_ in rounds for _, dst in round_) == ["d1", "d2", "w1", "w2", "w3"]
    assert rounds[0] == [("head", "w1")]  # serving nodes receive first


def test_only_the_head_serves_when_no_worker_can():
    rounds = fan_out_tree("head", ["a", "b", "c"], can_reexport=lambda node: False)
    assert rounds == [[("head", "a")], [("head", "b")], [("head", "c")]]


def test_bad_worker_lists_are_refused():
    with pytest.raises(ValueError):
        fan_out_tree("head", ["a", "a"])
    with pytest.raises(ValueError):
        fan_out_tree("head", ["head"])
    assert fan_out_tree("head", []) == []
