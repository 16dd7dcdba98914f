"""A destination whose tag points at a *different* image is not done: NodeImage copies or re-tags,
never skips. Driven as the engine drives it (tests/support/provider_host.py), node-a -> node-b."""

from __future__ import annotations

import os

import pytest

import lab
from components.node_image import NodeImage
from tests.support.lab_nodes import node_dict
from tests.support.node_image_lab import build, image_id, remove
from tests.support.program import registered_by
from tests.support.provider_host import Engine, ProviderHost

pytestmark = pytest.mark.lab

TAG = "ni-elsewhere:1"
TWIN = "ni-elsewhere-twin:1"


@pytest.mark.parametrize("wanted_on_destination", [False, True], ids=["copy", "retag"])
def test_a_tag_pointing_at_another_image_is_replaced_never_skipped(node_a, node_b, wanted_on_destination):
    lab.busybox_image(node_a)
    other = lab.busybox_image(node_b)
    wanted = build(node_a, TAG, "lab-busybox:1", os.urandom(200_000))
    remove(node_b, TAG, TWIN)
    if wanted_on_destination:  # the wanted image is there, under another tag only
        lab.on_node(node_a, lab.pipeline(["docker", "save", TAG], lab.ssh_argv(node_b, ["docker", "load"])))
        lab.docker(node_b, "tag", TAG, TWIN)
        remove(node_b, TAG)
    else:
        lab.docker(node_b, "image", "rm", "--force", wanted, check=False)
    lab.docker(node_b, "tag", "lab-busybox:1", TAG)  # the tag points at another image
    assert image_id(node_b, TAG) == other != wanted

    source, destination = node_dict(node_a), node_dict(node_b)
    (placed,) = registered_by(lambda: NodeImage("elsewhere", TAG, source, destination), "lab")
    with ProviderHost() as host:
        engine = Engine(host)
        state = engine.create(placed.typ, placed.name, placed.inputs, timeout=300)
        outs = state.public_outputs()
        assert outs["image_id"] == wanted == image_id(node_b, TAG), outs
        # Nothing to send when the image is there under another tag: then it re-tags; else it copies.
        if wanted_on_destination:
            assert outs["retagged"] is True and outs["bytes_sent"] == 0, outs
        else:
            assert outs["skipped"] is False and outs["retagged"] is False and outs["layers_sent"] >= 1, outs
        assert outs["placed_tag"] is True, outs
        # It placed the tag, so its delete removes it; the image the tag pointed at before is untouched.
        engine.delete(state)
    assert image_id(node_b, TAG) is None
    assert image_id(node_b, "lab-busybox:1") == other
    remove(node_b, TWIN)
