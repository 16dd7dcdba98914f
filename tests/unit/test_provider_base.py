"""The one provider base (components/provider_kit/provider_base.py): each engine call made of a
package's verbs, the SDK's read and delete where a package has no observe or release, and the
providers that stacks stored before the base (tests/unit/fixtures/stored_providers.txt) loading as
their classes."""

from __future__ import annotations

import base64
import importlib
import subprocess
import sys
from pathlib import Path
from typing import Any

import dill
import pulumi.dynamic as dynamic
import pytest
from pulumi.dynamic.dynamic import serialize_provider

from components.errors import PROVIDER_METHODS
from components.provider_kit.change import Change
from components.provider_kit.provider_base import NodeResourceProvider, Verbs

ROOT = Path(__file__).resolve().parents[2]
STORED = Path(__file__).with_name("fixtures") / "stored_providers.txt"


class Calls:
    """A package's verbs that record each call and answer as a table says."""

    def __init__(self, change: Change | None = None, observed: Any = "echo") -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self.change, self.observed = change or Change((), ()), observed

    def validate(self, props):
        self.calls.append(("validate", (props,)))
        return [("port", "not a port")] if props.get("port") == "x" else []

    def plan_change(self, olds, news):
        self.calls.append(("plan_change", (olds, news)))
        return self.change

    def ensure(self, props, olds=None):
        self.calls.append(("ensure", (props, olds)))
        return {**props, "made": True}

    def observe(self, props):
        self.calls.append(("observe", (props,)))
        return {**props, "seen": True} if self.observed == "echo" else self.observed

    def release(self, props):
        self.calls.append(("release", (props,)))

    def verbs(self, *, observe: bool = True, release: bool = True) -> Verbs:
        return Verbs(
            validate=self.validate,
            plan_change=self.plan_change,
            ensure=self.ensure,
            resource_id=lambda props, outs: f"{props['node']}/{outs['made']}",
            observe=self.observe if observe else None,
            release=self.release if release else None,
        )


def provider(verbs: Verbs) -> NodeResourceProvider:
    return type("Provider", (NodeResourceProvider,), {"verbs": verbs})()


PROPS = {"node": "spark-1", "port": 1}


def test_check_gives_validate_s_refusals_as_the_engine_s_failures():
    calls = Calls()
    ok = provider(calls.verbs()).check({}, PROPS)
    refused = provider(calls.verbs()).check({}, {**PROPS, "port": "x"})
    assert ok.inputs == PROPS and ok.failures == []
    assert [(f.property, f.reason) for f in refused.failures] == [("port", "not a port")]
    assert [name for name, _args in calls.calls] == ["validate", "validate"]


@pytest.mark.parametrize(
    ("change", "changes", "replaces", "first"),
    [
        (Change((), ()), False, [], False),
        (Change((), ("port",)), True, [], False),
        (Change(("node",), ("port",)), True, ["node"], False),
        (Change(("node",), (), delete_before_replace=True), True, ["node"], True),
    ],
)
def test_diff_is_plan_change_s_change(change, changes, replaces, first):
    calls = Calls(change)
    diff = provider(calls.verbs()).diff("id", {"port": 1}, {"port": 2})
    assert (diff.changes, diff.replaces, diff.delete_before_replace) == (changes, replaces, first)
    assert calls.calls == [("plan_change", ({"port": 1}, {"port": 2}))]


def test_create_and_update_ensure_and_the_id_is_made_from_inputs_and_outputs():
    calls = Calls()
    created = provider(calls.verbs()).create(PROPS)
    assert (created.id, created.outs) == ("spark-1/True", {**PROPS, "made": True})
    updated = provider(calls.verbs()).update("id", created.outs, {**PROPS, "port": 2})
    assert updated.outs == {**PROPS, "port": 2, "made": True}
    assert calls.calls == [("ensure", (PROPS, None)), ("ensure", ({**PROPS, "port": 2}, created.outs))]


def test_read_is_what_observe_sees_and_gone_when_it_sees_nothing():
    seen = provider(Calls().verbs()).read("id", PROPS)
    assert (seen.id, seen.outs) == ("id", {**PROPS, "seen": True})
    gone = provider(Calls(observed=None).verbs()).read("id", PROPS)
    assert (gone.id, gone.outs) == ("", {})


def test_without_observe_read_is_the_sdk_s_the_recorded_state():
    calls = Calls()
    read = provider(calls.verbs(observe=False)).read("id", PROPS)
    sdk = dynamic.ResourceProvider().read("id", PROPS)
    assert (read.id, read.outs) == (sdk.id, sdk.outs) == ("id", PROPS)
    assert calls.calls == []


def test_delete_releases_and_without_release_does_nothing():
    calls = Calls()
    assert provider(calls.verbs()).delete("id", PROPS) is None
    assert calls.calls == [("release", (PROPS,))]
    calls.calls.clear()
    assert provider(calls.verbs(release=False)).delete("id", PROPS) is None
    assert calls.calls == []


# ---- the pickles stacks hold ------------------------------------------------------------------------


def stored() -> list[tuple[str, str, str]]:
    """(module, class, pickle) of each provider stored before the base (the fixture's lines)."""
    lines = [line.split() for line in STORED.read_text().splitlines() if line and not line.startswith("#")]
    return [(module, name, encoded) for module, name, encoded in lines]


@pytest.mark.parametrize(("module", "name", "encoded"), stored(), ids=lambda v: v[:40])
def test_a_provider_stored_before_the_base_loads_as_its_class_with_the_base_s_methods(module, name, encoded):
    cls = getattr(importlib.import_module(module), name)
    loaded = dill.loads(base64.b64decode(encoded))
    assert type(loaded) is cls and isinstance(loaded, NodeResourceProvider)
    for method in PROVIDER_METHODS:
        # Each call is the class's own (an override) or the base's.
        assert getattr(cls, method) is (cls.__dict__.get(method) or getattr(NodeResourceProvider, method))
    if module == cls.__module__:  # stored again today: still that reference alone, the same bytes
        assert serialize_provider(loaded) == encoded


# The packages whose providers stacks had stored when the base came (33eeab7): a package added since
# was never pickled before it, and test_house.py holds that it pickles by reference to its package.
BEFORE_BASE = (
    "answer_check", "checkpoint", "fabric_check", "health_secret", "image_build", "model_support",
    "node_image", "node_proof", "readiness_gate", "serve_bench", "stack_claim",
)  # fmt: skip


def test_the_fixture_holds_every_provider_stored_before_the_base_and_the_earlier_paths():
    pinned = {(module, name) for module, name, _encoded in stored()}
    for package_name in BEFORE_BASE:
        module = importlib.import_module(f"components.{package_name}.provider")
        package = f"components.{package_name}"
        ours = [c for c in vars(module).values() if isinstance(c, type) and c.__module__ == package]
        assert ours and all((c.__module__, c.__name__) in pinned for c in ours), package
    assert ("components.checkpoint.provider", "CheckpointProvider") in pinned
    assert ("components.health", "HealthSecretProvider") in pinned


# As in the engine's provider process: one interpreter that imported nothing of the program first loads
# the state's pickles one after another.
FRESH = """
import base64, sys
import dill

for line in sys.stdin.read().splitlines():
    module, name, encoded = line.split()
    loaded = dill.loads(base64.b64decode(encoded))
    bases = [f"{c.__module__}.{c.__qualname__}" for c in type(loaded).__mro__]
    assert "components.provider_kit.provider_base.NodeResourceProvider" in bases, bases
    assert getattr(sys.modules[module], name) is type(loaded), (module, name)
    print(module, name)
"""


def test_the_stored_providers_load_in_a_fresh_interpreter():
    lines = [" ".join(entry) for entry in stored()]
    done = subprocess.run(
        [sys.executable, "-c", FRESH],
        input="\n".join(lines),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[:-1] == [" ".join(entry[:2]) for entry in stored()]


def test_the_base_pickles_by_reference():
    data = dill.dumps(NodeResourceProvider, recurse=True)
    assert b"_create_type" not in data, "the base was pickled by value"
    assert dill.loads(data) is NodeResourceProvider
