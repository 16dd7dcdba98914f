"""A small dynamic provider that tests the provider-host harness itself (no node needed).

Each resource is one JSON file in the folder its `folder` input names, so what the provider process
did is visible from the test process. Renaming `name` replaces; changing `note` updates in place;
a `secret` input must arrive as a plain string (the engine strips secret markers for a provider that
does not accept secrets). Pickled by reference to this module: no import-time side effects.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pulumi
import pulumi.dynamic as dynamic


def _file(props: dict[str, Any]) -> Path:
    return Path(props["folder"]) / f"{props['name']}.json"


class LedgerProvider(dynamic.ResourceProvider):
    """check refuses an empty name; create/update write the file; read sees it gone; delete removes it."""

    def check(self, _olds: dict[str, Any], news: dict[str, Any]) -> dynamic.CheckResult:
        failures = []
        if not news.get("name"):
            failures.append(dynamic.CheckFailure("name", "give the entry a name"))
        return dynamic.CheckResult({**news, "checked": True}, failures)

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> dynamic.DiffResult:
        replaces = [k for k in ("name", "folder") if olds.get(k) != news.get(k)]
        changed = replaces or [k for k in ("note", "secret") if olds.get(k) != news.get(k)]
        return dynamic.DiffResult(changes=bool(changed), replaces=replaces, delete_before_replace=False)

    def _write(self, props: dict[str, Any]) -> dict[str, Any]:
        entry = {
            "name": props["name"],
            "note": props.get("note"),
            # What arrived, not the value: the provider must never need to store the secret itself.
            "secret_type": type(props.get("secret")).__name__,
            "secret_length": len(props["secret"]) if isinstance(props.get("secret"), str) else None,
            "pid": os.getpid(),
        }
        _file(props).write_text(json.dumps(entry))
        return {**props, **entry}

    def create(self, props: dict[str, Any]) -> dynamic.CreateResult:
        outs = self._write(props)
        return dynamic.CreateResult(id_=f"ledger-{props['name']}", outs=outs)

    def update(self, _id: str, _olds: dict[str, Any], news: dict[str, Any]) -> dynamic.UpdateResult:
        return dynamic.UpdateResult(outs=self._write(news))

    def read(self, id_: str, props: dict[str, Any]) -> dynamic.ReadResult:
        path = _file(props)
        if not path.exists():
            return dynamic.ReadResult(id_="", outs={})
        return dynamic.ReadResult(id_=id_, outs={**props, **json.loads(path.read_text())})

    def delete(self, _id: str, props: dict[str, Any]) -> None:
        _file(props).unlink(missing_ok=True)


class LedgerEntry(dynamic.Resource, module="qwen35test", name="LedgerEntry"):
    """One file in `folder`, managed by `LedgerProvider`."""

    pid: pulumi.Output[int]

    def __init__(self, name: str, *, folder: str, entry: str, note: str, secret: pulumi.Input[str]):
        props = {
            "folder": folder,
            "name": entry,
            "note": note,
            "secret": pulumi.Output.secret(secret),
            "pid": None,
            "secret_type": None,
            "secret_length": None,
            "checked": None,
        }
        super().__init__(LedgerProvider(), name, props)
