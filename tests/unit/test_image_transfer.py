"""The save-stream filter and layer identity, on synthetic `docker save` streams of both layouts."""

from __future__ import annotations

import pytest

from components.node_image import image_transfer as t
from tests.unit.test_layer_filter import DIFF_IDS, digest


def test_chain_ids_and_present_prefix():
    chains = t.chain_ids(DIFF_IDS)
    assert chains[0] == DIFF_IDS[0]
    assert chains[1] == digest(f"{DIFF_IDS[0]} {DIFF_IDS[1]}".encode())
    assert t.present_prefix(DIFF_IDS, set(chains[:2])) == 2
    assert t.present_prefix(DIFF_IDS, {chains[1]}) == 0  # a chain without its base is not a prefix
    assert t.present_chains([DIFF_IDS[:1]]) == {chains[0]}


def test_references():
    assert t.split_reference("reg:5000/a/b:1") == ("reg:5000/a/b", "1")
    with pytest.raises(ValueError):
        t.split_reference("reg:5000/a")
    assert t.full_reference("x:1") == "docker.io/library/x:1"
    assert t.full_reference("u/x:1") == "docker.io/u/x:1"
    assert t.full_reference("reg.io/x:1") == "reg.io/x:1"
    assert t.familiar_reference("docker.io/library/x:1") == "x:1"
