"""HealthSecret: create draws a secret, nothing else changes it, it is a Pulumi secret, and the
provider the SDK pickles loads in the engine's own provider process (tests/support/provider_host.py)."""

from __future__ import annotations

import pickle

import pulumi
import pulumi.dynamic as dynamic
import pytest

from components.health_secret import (
    HealthSecret,
    HealthSecretProvider,
    SecretMissing,
    is_secret,
    kept_outputs,
    plan_change,
)
from tests.support.program import registered_by
from tests.support.provider_host import PROVIDER_KEY, CheckFailed, Engine, ProviderHost, reveal
from tests.support.provider_host import is_secret as unsecret_marker

TYPE = "pulumi-python:dynamic/qwen35:HealthSecret"
OWNER = "qwen35-spark/test"


def registered(owner=OWNER, prefix="qwen35") -> dict:
    (found,) = registered_by(lambda: HealthSecret("health-secret", owner=owner, prefix=prefix))
    assert found.typ == TYPE
    return found.inputs


@pytest.mark.parametrize(
    ("olds", "news", "updates"),
    [
        ({"owner": "a/b", "prefix": "q"}, {"owner": "a/b", "prefix": "q"}, ()),
        ({"owner": "a/b", "prefix": "q"}, {"owner": "a/c", "prefix": "q"}, ("owner",)),
        ({"owner": "a/b", "prefix": "q"}, {"owner": "a/b", "prefix": "r"}, ("prefix",)),
    ],
)
def test_a_change_is_recorded_in_place_never_a_new_secret(olds, news, updates):
    change = plan_change({**olds, "secret": "0" * 64}, news)
    assert change.replaces == () and change.updates == updates


def test_an_update_keeps_the_recorded_secret_and_refuses_a_state_without_one():
    assert kept_outputs({"owner": "a", "secret": "ab" * 32}, {"owner": "b", "prefix": "p"}) == {
        "owner": "b",
        "prefix": "p",
        "secret": "ab" * 32,
    }
    with pytest.raises(SecretMissing, match="state delete") as raised:
        kept_outputs({"owner": "a", "secret": None}, {"owner": "b"})
    # Still a ValueError, as it was before it had a type of its own.
    assert isinstance(raised.value, ValueError)


def test_create_draws_a_new_secret_each_time_and_diff_never_replaces():
    provider = HealthSecretProvider()
    first = provider.create({"owner": OWNER, "prefix": "q"})
    second = provider.create({"owner": OWNER, "prefix": "q"})
    assert is_secret(first.outs["secret"]) and is_secret(second.outs["secret"])
    assert first.outs["secret"] != second.outs["secret"]
    assert first.outs["secret"] not in first.id
    diff = provider.diff(first.id, first.outs, {"owner": "other/stack", "prefix": "z"})
    assert diff.changes and not diff.replaces
    assert provider.read(first.id, first.outs).outs == first.outs


def test_check_refuses_a_given_secret_naming_the_field():
    result = HealthSecretProvider().check({}, {"owner": OWNER, "prefix": "q", "secret": "x"})
    assert [(f.property, "generated" in f.reason) for f in result.failures] == [("secret", True)]


def test_the_secret_output_is_registered_secret(monkeypatch):
    # The mocks do not apply additional_secret_outputs (the engine does): read what is asked of it.
    seen = []
    original = dynamic.Resource.__init__

    def spy(self, provider, name, props, opts=None):
        seen.append(opts)
        original(self, provider, name, props, opts)

    monkeypatch.setattr(dynamic.Resource, "__init__", spy)
    keep = pulumi.ResourceOptions(protect=True)
    registered_by(lambda: HealthSecret("health-secret", owner=OWNER, prefix="q", opts=keep))
    assert seen[0].additional_secret_outputs == ["secret"] and seen[0].protect is True


def test_provider_pickles_by_reference_without_state():
    provider = pickle.loads(pickle.dumps(HealthSecretProvider()))
    assert isinstance(provider, HealthSecretProvider)
    assert b"components.health_secret" in pickle.dumps(HealthSecretProvider())
    # What stacks made before the package was split pickled still loads as the class.
    text = pickle.dumps(HealthSecretProvider(), protocol=0)
    legacy = text.replace(b"components.health_secret\n", b"components.health\n")
    assert legacy != text
    assert type(pickle.loads(legacy)) is HealthSecretProvider


@pytest.fixture(scope="module")
def engine():
    with ProviderHost() as host:
        yield Engine(host, stack="test")


def test_the_dill_pickled_provider_runs_in_a_fresh_process(engine):
    inputs = registered()
    assert PROVIDER_KEY in inputs
    # The `secret` input is registered secret: the engine then marks the output of that name secret
    # as the provider returns it (it accepts no secrets), before any event can show it.
    assert unsecret_marker(inputs["secret"]) and reveal(inputs["secret"]) == ""
    state = engine.create(TYPE, "health-secret", inputs)
    secret = state.outputs["secret"]
    assert is_secret(secret) and secret not in state.id
    assert "secret" in state.secret_keys and "owner" not in state.secret_keys
    # refresh reads the state back unchanged; an up with a new owner keeps the secret in place.
    assert engine.refresh(state).outputs["secret"] == secret
    moved = engine.up(state, registered(owner="qwen35-spark/other"))
    assert moved.op == "update" and moved.state.outputs["secret"] == secret
    assert engine.up(moved.state, registered(owner="qwen35-spark/other")).op == "same"
    engine.delete(moved.state)


def test_check_in_the_provider_process_refuses_a_given_secret(engine):
    inputs = {**registered(), "secret": "0" * 64}
    with pytest.raises(CheckFailed, match="secret"):
        engine.create(TYPE, "health-secret", inputs)
