"""The provider-host harness against a small provider: a real `python -m pulumi.dynamic` process,
the provider pickled by the SDK under mocks, every call over gRPC (tests/support/provider_host.py)."""

from __future__ import annotations

import json
import os

import pytest

from tests.support.ledger_provider import LedgerEntry
from tests.support.program import registered_by
from tests.support.provider_host import (
    PROVIDER_KEY,
    ROOT,
    CheckFailed,
    Engine,
    ProviderFailed,
    ProviderHost,
    reveal,
)

TYPE = "pulumi-python:dynamic/qwen35test:LedgerEntry"
SECRET = "s3cret-token-value"


def registered(folder, entry="first", note="one", secret=SECRET) -> dict:
    (found,) = registered_by(
        lambda: LedgerEntry("ledger", folder=str(folder), entry=entry, note=note, secret=secret)
    )
    assert found.typ == TYPE
    return found.inputs


@pytest.fixture(scope="module")
def host():
    with ProviderHost() as running:
        yield running


@pytest.fixture
def engine(host):
    return Engine(host, stack="test")


def entry(folder, name="first") -> dict:
    return json.loads((folder / f"{name}.json").read_text())


def test_the_provider_runs_in_its_own_process_started_in_the_project(host, engine, tmp_path):
    state = engine.create(TYPE, "ledger", registered(tmp_path))
    assert host.cwd == ROOT and host.accepts_secrets is False
    written = entry(tmp_path)
    assert written["pid"] == host.process.pid != os.getpid()
    assert state.id == "ledger-first" and state.outputs["pid"] == host.process.pid
    # Check ran in the provider before create, and create got the checked inputs.
    assert state.inputs["checked"] is True and state.outputs["checked"] is True
    # The pickled provider travels with the outputs, as the engine stores them.
    assert state.outputs[PROVIDER_KEY] == reveal(registered(tmp_path)[PROVIDER_KEY])


def test_secrets_arrive_plain_and_are_remembered_as_secret(engine, tmp_path):
    inputs = registered(tmp_path)
    assert inputs["secret"] != SECRET, "under mocks the secret carries its marker"
    state = engine.create(TYPE, "ledger", inputs)
    written = entry(tmp_path)
    assert (written["secret_type"], written["secret_length"]) == ("str", len(SECRET))
    assert {"secret", PROVIDER_KEY} <= state.secret_keys and "note" not in state.secret_keys


def test_check_failures_stop_before_create(engine, tmp_path):
    with pytest.raises(CheckFailed) as failed:
        engine.create(TYPE, "ledger", registered(tmp_path, entry=""))
    assert failed.value.failures == [("name", "give the entry a name")]
    assert list(tmp_path.iterdir()) == []


def test_up_is_same_update_or_replace_as_diff_says(engine, tmp_path):
    state = engine.create(TYPE, "ledger", registered(tmp_path))
    same = engine.up(state, registered(tmp_path))
    assert same.op == "same" and same.diff.changes == "none"

    updated = engine.up(state, registered(tmp_path, note="two"))
    assert updated.op == "update" and updated.state.id == state.id
    assert entry(tmp_path)["note"] == "two" and updated.state.outputs["note"] == "two"

    replaced = engine.up(updated.state, registered(tmp_path, entry="second", note="two"))
    assert replaced.op == "replace" and replaced.diff.replaces == ("name",)
    assert replaced.state.id == "ledger-second"
    # The new one was created and the old one deleted (create first: the provider did not ask otherwise).
    assert sorted(p.name for p in tmp_path.iterdir()) == ["second.json"]
    assert replaced.diff.delete_before_replace is False


def test_refresh_reports_a_removed_entry_gone_and_delete_removes_it(engine, tmp_path):
    state = engine.create(TYPE, "ledger", registered(tmp_path))
    assert engine.refresh(state).id == state.id
    engine.delete(state)
    assert list(tmp_path.iterdir()) == []
    assert engine.refresh(state).id == ""


def test_a_provider_exception_comes_back_with_its_traceback(engine, tmp_path):
    with pytest.raises(ProviderFailed) as failed:
        engine.create(TYPE, "ledger", registered(tmp_path / "missing"))
    assert failed.value.method == "Create"
    assert "FileNotFoundError" in str(failed.value) and "ledger_provider.py" in str(failed.value)


def test_the_provider_is_pickled_by_reference_so_the_host_must_start_in_the_project(tmp_path):
    # The SDK pickles the provider by reference to its module; a host started elsewhere cannot find it.
    inputs = registered(tmp_path)
    with ProviderHost(cwd=tmp_path) as elsewhere, pytest.raises(ProviderFailed) as failed:
        Engine(elsewhere, stack="test").create(TYPE, "ledger", inputs)
    assert "ModuleNotFoundError" in str(failed.value) and "'tests'" in str(failed.value)
    assert not (tmp_path / "first.json").exists()
