"""Checkpoint's plan as tables: state and inputs in, replace / update / nothing out (no node I/O)."""

import pytest

from components.checkpoint.plan import REPLACE_KEYS, UPDATE_KEYS, Change, plan_change

SHA = "a" * 40
NODE = {"name": "spark-2", "host": "10.0.0.2", "port": 22, "known_hosts": "/k"}


def state(**changes) -> dict:
    base = {
        "node": NODE,
        "repo": "org/model",
        "requested_revision": "main",
        "source_mode": "hub",
        "cache_dir": "/data/hf",
        "manifest_digest": "f" * 64,
        "refresh": "sizes",
        "keep": True,
        "problems": {},
        "revision": SHA,
    }
    return {**base, **changes}


@pytest.mark.parametrize(
    ("news", "olds", "replaces", "updates"),
    [
        ({}, {}, (), ()),
        ({"requested_revision": "v2"}, {}, ("requested_revision",), ()),
        ({"source_mode": "cache"}, {}, ("source_mode",), ()),
        # A new revision on the source reaches this node as another manifest: a new checkpoint.
        ({"manifest_digest": "0" * 64}, {}, ("manifest_digest",), ()),
        # Another address, port or jump host for the same node: in place.
        ({"node": {**NODE, "host": "spark-2.lan"}}, {}, (), ("node",)),
        ({"node": {**NODE, "port": 2222}}, {}, (), ("node",)),
        ({"node": {**NODE, "proxy_jump": "ops@bastion"}}, {}, (), ("node",)),
        # Another node: a replacement (never also listed as an update).
        ({"node": {**NODE, "name": "spark-3"}}, {}, ("node",), ()),
        ({"source": {**NODE, "name": "spark-1"}}, {}, (), ("source",)),
        ({"keep": False, "reserve": 1}, {}, (), ("reserve", "keep")),
        # A refresh found damaged files: `up` sends them again.
        ({}, {"problems": {"model-1.safetensors": "damaged"}}, (), ("problems",)),
        ({"repo": "org/other", "refresh": "full"}, {}, ("repo",), ("refresh",)),
    ],
)
def test_plan_change_is_a_table(news, olds, replaces, updates):
    change = plan_change(state(**olds), state(**news))
    assert change == Change(replaces, updates)
    assert change.changes == bool(replaces or updates)


def test_every_input_is_either_replaced_or_updated_never_both():
    assert not set(REPLACE_KEYS) & set(UPDATE_KEYS)
