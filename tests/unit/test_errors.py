"""Every error this program raises for an operator shares one root, and keeps its old base."""

from __future__ import annotations

import importlib.machinery
import sys
import traceback
import types

import pytest

from components import errors
from components.checkpoint.errors import CheckpointError
from components.config import ConfigError
from components.errors import PROVIDER_PROCESS, ExplainedErrors, Qwen35Error
from components.image_ref import ImageRefError
from components.model_support.errors import MemoryFitError, ModelSupportError, ServeArgsError
from components.node_image.errors import ExportFailed, NodeImageError
from components.nodes import NodeDictError
from components.readiness_gate import GateFailed
from components.remote import RemoteError
from components.transfer.endpoints import EndpointError
from components.transfer.peer import PeerUnreachable
from components.transfer.tuning import TuningError
from lab.layout import LabError


@pytest.mark.parametrize(
    ("error", "base"),
    [
        (CheckpointError, RuntimeError),
        (ConfigError, ValueError),
        (EndpointError, ValueError),
        (ExportFailed, RuntimeError),
        (GateFailed, RuntimeError),
        (ImageRefError, ValueError),
        (LabError, RuntimeError),
        (MemoryFitError, ValueError),
        (ModelSupportError, RuntimeError),
        (NodeDictError, ValueError),
        (NodeImageError, RuntimeError),
        (PeerUnreachable, RuntimeError),
        (RemoteError, RuntimeError),
        (ServeArgsError, RuntimeError),
        (TuningError, ValueError),
    ],
)
def test_each_error_has_the_one_root_and_its_old_base(error, base):
    assert issubclass(error, Qwen35Error) and issubclass(error, base)


def test_a_caught_root_keeps_the_message():
    with pytest.raises(Qwen35Error, match="could not be reached over SSH"):
        raise RemoteError("spark-2", ["true"], 255, b"")


class _Refuses(ExplainedErrors):
    def diff(self, _id, _olds, news):
        return news["missing"]

    def create(self, props):
        raise RemoteError("node-b", ["true"], 255, "ssh: connect refused\n", "check node-b (`make status`)")

    def delete(self, _id, _props):
        return {}["missing"]


@pytest.fixture
def provider_process(monkeypatch):
    """This process seen as the engine's `python -m pulumi.dynamic` (tracebacklimit restored after)."""
    main = types.ModuleType("__main__")
    main.__spec__ = importlib.machinery.ModuleSpec(PROVIDER_PROCESS, None)
    monkeypatch.setitem(sys.modules, "__main__", main)
    monkeypatch.setattr(sys, "tracebacklimit", 1000, raising=False)
    errors.quiet_tracebacks()  # what importing components.errors does in that process


def _as_the_sdk_reports(call) -> str:
    """What `pulumi.dynamic.__main__._abort_with_traceback` sends the engine for a failed call."""
    try:
        call()
    except Exception:
        return traceback.format_exc()
    raise AssertionError("the call did not fail")


def test_in_the_provider_process_an_explained_error_is_its_message_alone(provider_process):
    text = _as_the_sdk_reports(lambda: _Refuses().create({}))
    assert text.startswith("components.remote.RemoteError: node-b: ")
    assert "Traceback" not in text and 'File "' not in text
    assert "next: check node-b (`make status`)" in text


def test_in_the_provider_process_a_bug_keeps_its_traceback_in_the_message(provider_process):
    text = _as_the_sdk_reports(lambda: _Refuses().delete("id", {}))
    assert text.startswith("components.errors.ProviderBug: _Refuses.delete failed unexpectedly (a bug):")
    assert "Traceback (most recent call last)" in text and "KeyError: 'missing'" in text


class _Inherits(_Refuses):
    """A provider whose methods are its base's (components/provider_kit/provider_base.py)."""


def test_in_the_provider_process_a_bug_in_a_base_s_method_names_the_provider_called(provider_process):
    text = _as_the_sdk_reports(lambda: _Inherits().delete("id", {}))
    assert text.startswith("components.errors.ProviderBug: _Inherits.delete failed unexpectedly (a bug):")


def test_in_the_provider_process_every_bug_keeps_its_traceback_whatever_ran_before(provider_process):
    """A diff bug after a failed create (the SDK's threads share the process) reads the same."""
    _as_the_sdk_reports(lambda: _Refuses().create({}))
    text = _as_the_sdk_reports(lambda: _Refuses().diff("id", {}, {}))
    assert text.startswith("components.errors.ProviderBug: _Refuses.diff failed unexpectedly (a bug):")
    assert "Traceback (most recent call last)" in text and "KeyError: 'missing'" in text


def test_outside_the_provider_process_tracebacks_stay_on(monkeypatch):
    monkeypatch.setattr(sys, "tracebacklimit", 7, raising=False)
    errors.quiet_tracebacks()
    assert sys.tracebacklimit == 7


def test_outside_the_provider_process_errors_propagate_untouched():
    with pytest.raises(KeyError):
        _Refuses().delete("id", {})
    with pytest.raises(RemoteError) as raised:
        _Refuses().create({})
    assert raised.traceback[-1].name == "create"


PROVIDERS = {
    "components.answer_check": "AnswerCheckProvider",
    "components.checkpoint": "CheckpointProvider",
    "components.fabric_check": "FabricCheckProvider",
    "components.health_secret": "HealthSecretProvider",
    "components.image_build": "ImageBuildProvider",
    "components.model_support": "ModelSupportCheckProvider",
    "components.node_image": "NodeImageProvider",
    "components.node_proof": "NodeProofProvider",
    "components.provider_kit.provider_base": "NodeResourceProvider",
    "components.readiness_gate": "ReadinessGateProvider",
    "components.serve_bench": "ServeBenchProvider",
    "components.stack_claim": "StackClaimProvider",
}


def test_every_dynamic_provider_explains_its_errors():
    import importlib

    import pulumi.dynamic as dynamic

    # Each package loads its provider on first use (provider_kit/lazy.py): ask for it by name.
    for module, name in PROVIDERS.items():
        getattr(importlib.import_module(module), name)

    def providers(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from providers(sub)

    found = providers(dynamic.ResourceProvider)
    ours = {p.__name__: p for p in found if p.__module__.startswith("components")}
    assert set(ours) == set(PROVIDERS.values())
    assert [name for name, cls in ours.items() if not issubclass(cls, ExplainedErrors)] == []
    # Every call the engine makes, whether the class defines it or its base does, explains its errors.
    unexplained = [
        f"{name}.{method}"
        for name, cls in ours.items()
        for method in errors.PROVIDER_METHODS
        if not hasattr(getattr(cls, method), "__wrapped__")
    ]
    assert unexplained == []
