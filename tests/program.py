"""Run the real `__main__.py` under Pulumi's mock runtime and record what it registers.

Used by the unit tests (resource graph) and by the lab end-to-end test (declared container specs).
"""

from __future__ import annotations

import asyncio
import json
import runpy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulumi
import yaml

ROOT = Path(__file__).resolve().parent.parent
MAIN = ROOT / "__main__.py"


def stack_config(stack: str) -> dict[str, Any]:
    """The `config:` block of Pulumi.<stack>.yaml."""
    return yaml.safe_load((ROOT / f"Pulumi.{stack}.yaml").read_text())["config"]


@dataclass
class Registered:
    """One resource as the program registered it."""

    typ: str
    name: str
    inputs: dict[str, Any]
    provider: str | None
    parent: str | None
    custom: bool
    resource_id: str | None


@dataclass
class ProgramRun:
    resources: list[Registered]
    outputs: dict[str, Any]
    secret_outputs: set[str] = field(default_factory=set)

    def by_type(self, typ: str) -> list[Registered]:
        return [r for r in self.resources if r.typ == typ]

    def named(self, name: str) -> Registered:
        matches = [r for r in self.resources if r.name == name]
        if len(matches) != 1:
            raise KeyError(f"{len(matches)} resources named {name!r}: {[r.name for r in self.resources]}")
        return matches[0]


class RecordingMocks(pulumi.runtime.Mocks):
    """Records every registration; echoes inputs as outputs plus a few computed ones."""

    def __init__(self, fake_outputs=None):
        self.resources: list[Registered] = []
        self.fake_outputs = fake_outputs or default_fake_outputs

    def new_resource(self, args: pulumi.runtime.MockResourceArgs):
        self.resources.append(
            Registered(
                typ=args.typ,
                name=args.name,
                inputs=dict(args.inputs),
                provider=args.provider,
                parent=getattr(args, "parent", None),
                custom=args.custom,
                resource_id=args.resource_id,
            )
        )
        outputs = {**args.inputs, **self.fake_outputs(args)}
        return [f"{args.name}-id", outputs]

    def call(self, args: pulumi.runtime.MockCallArgs):
        return {}


NODE_IMAGE = "pulumi-python:dynamic/qwen35:NodeImage"
READINESS_GATE = "pulumi-python:dynamic/qwen35:ReadinessGate"


def default_fake_outputs(args: pulumi.runtime.MockResourceArgs) -> dict[str, Any]:
    """Outputs a real provider would compute, so downstream inputs can be checked."""
    if args.typ == NODE_IMAGE:
        image = args.inputs.get("image", "img:tag")
        return {
            "image_id": "sha256:" + (f"{abs(hash(image)):x}" * 8)[:64],
            "layers": ["sha256:" + "a" * 64, "sha256:" + "b" * 64],
            "bytes_sent": 0,
            "skipped": True,
            "store": "classic",
        }
    if args.typ == "pulumi-python:dynamic/qwen35:Checkpoint":
        # The commit a branch resolved to, and the manifest digest (the same on every node).
        repo = args.inputs.get("repo", "org/model")
        sha = (f"{abs(hash(repo)):x}" * 8)[:40]
        return {
            "revision": sha,
            "digest": "d" * 64,
            "files": 3,
            "bytes": 3 << 30,
            "bytes_sent": 0,
            "manifest": [["config.json", "c" * 40, 100]],
            "refs": {args.inputs.get("requested_revision", "main"): sha},
            "snapshot_path": f"{args.inputs.get('cache_dir')}/hub/models--{repo.replace('/', '--')}"
            f"/snapshots/{sha}",
        }
    if args.typ == "docker:index/image:Image":
        return {"repo_digest": "", "image_name": args.inputs.get("imageName", "")}
    return {}


def _to_config(values: dict[str, Any]) -> dict[str, str]:
    return {k: v if isinstance(v, str) else json.dumps(v) for k, v in values.items()}


def run_program(
    config: dict[str, Any],
    stack: str = "dev",
    preview: bool = False,
    secrets: dict[str, str] | None = None,
) -> ProgramRun:
    """Run __main__.py with `config` (full keys, `qwen35-spark:…`) and return what it registered."""
    mocks = RecordingMocks()
    pulumi.runtime.set_mocks(mocks, project="qwen35-spark", stack=stack, preview=preview)
    all_config = _to_config(config)
    secret_keys = []
    for key, value in (secrets or {}).items():
        all_config[f"qwen35-spark:{key}"] = value
        secret_keys.append(f"qwen35-spark:{key}")
    pulumi.runtime.set_all_config(all_config, secret_keys=secret_keys)
    captured: dict[str, Any] = {}
    secret_outputs: set[str] = set()

    @pulumi.runtime.test
    def _run():
        namespace = runpy.run_path(str(MAIN), run_name="__pulumi_main__")
        outputs = namespace["deployment"].outputs

        async def _collect():
            for key, value in outputs.items():
                out = pulumi.Output.from_input(value)
                captured[key] = await out.future(with_unknowns=True)
                if await out.is_secret():
                    secret_outputs.add(key)
            return True

        return asyncio.ensure_future(_collect())

    _run()
    return ProgramRun(mocks.resources, captured, secret_outputs)
