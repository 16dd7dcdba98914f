"""`known` (components/provider_kit/inputs.py): a value not known yet, in either form the engine or the
mock runtime's provider host sends it, is told apart without the module importing Pulumi."""

from __future__ import annotations

import pulumi.output
import pulumi.runtime.rpc
import pytest

from components.provider_kit.inputs import UNKNOWN, known


def test_the_marker_is_the_sdk_s():
    assert UNKNOWN == pulumi.runtime.rpc.UNKNOWN


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, False),
        (pulumi.runtime.rpc.UNKNOWN, False),
        (pulumi.output.Unknown(), False),
        ("", True),
        (0, True),
        ({"name": "spark-1"}, True),
        (["a"], True),
    ],
)
def test_known(value, expected):
    assert known(value) is expected
