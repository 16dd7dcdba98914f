"""Run the real `__main__.py` under Pulumi's mock runtime and record what it registers.

Used by the unit tests (resource graph) and by the lab end-to-end test (declared container specs).
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import json
import runpy
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulumi
import yaml

from components.config import StackConfig, parse_stack_config

ROOT = Path(__file__).resolve().parent.parent.parent
MAIN = ROOT / "__main__.py"


def stack_config(stack: str) -> dict[str, Any]:
    """The `config:` block of Pulumi.<stack>.yaml."""
    return yaml.safe_load((ROOT / f"Pulumi.{stack}.yaml").read_text())["config"]


def dev_raw(stack: str = "dev") -> dict[str, Any]:
    """A stack's config without the namespace, as `parse_stack_config` takes it (a fresh copy)."""
    return {k.split(":", 1)[1]: v for k, v in copy.deepcopy(stack_config(stack)).items()}


def config_from(stack: str = "dev", **sections: Any) -> StackConfig:
    """A stack's validated config, with `sections` merged over its own (dict sections key by key)."""
    raw = dev_raw(stack)
    for key, value in sections.items():
        raw[key] = {**raw.get(key, {}), **value} if isinstance(value, dict) else value
    return parse_stack_config(raw)


def mp_raw(nodes: int = 2, gpus: int = 1, **cluster: Any) -> dict[str, Any]:
    """The dev stack under `cluster.executor: mp` with `nodes` Sparks of `gpus` GPUs (TP = the world)."""
    raw = dev_raw()
    raw["nodes"] = [
        {
            "name": f"spark-{i + 1}",
            "host": f"10.1.230.{180 + i}",
            "fabric_ip": f"192.168.200.{12 + i}",
            "gpus": gpus,
            **({"role": "head"} if i == 0 else {}),
        }
        for i in range(nodes)
    ]
    raw["serve"] = {**raw["serve"], "tensor_parallel_size": nodes * gpus}
    raw["cluster"] = {"executor": "mp", **cluster}
    return raw


def mp_stack_config(nodes: int = 2, gpus: int = 1, **cluster: Any) -> dict[str, Any]:
    """`mp_raw` with the namespace, as `run_program` takes a stack's config."""
    return {f"qwen35-spark:{key}": value for key, value in mp_raw(nodes, gpus, **cluster).items()}


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

    def node_images(self) -> list[Registered]:
        """The NodeImages, in registration order (the head's first, then along the copy tree)."""
        return [r for r in self.resources if is_node_image(r)]

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
IMAGE_BUILD = "pulumi-python:dynamic/qwen35:ImageBuild"


FABRIC_CHECK = "pulumi-python:dynamic/qwen35:FabricCheck"
ANSWER_CHECK = "pulumi-python:dynamic/qwen35:AnswerCheck"
HEALTH_SECRET = "pulumi-python:dynamic/qwen35:HealthSecret"
FAKE_HEALTH_SECRET = "5ec7e7" + "0123456789abcdef" * 3 + "0a1b2c3d4e"


def fake_fabric(inputs: dict[str, Any]) -> dict[str, Any]:
    """What a passing FabricCheck reports: the pin, else the ACTIVE ports of a Spark cabled on its
    f0 functions (spark-1) or on its f1 functions (every other node): port names differ per node.
    The RoCE v2 IPv4 index is 3 (the pinned index when pinned)."""
    node = inputs["node"]["name"]
    function = "f0" if node.endswith("-1") else "f1"
    ports = [f"rocep1s0{function}:1", f"roceP2p1s0{function}:1"]
    gid = inputs.get("gid")
    return {
        "ib_hca": inputs.get("pin") if inputs.get("pin") is not None else ports,
        "gid_index": 3 if gid == "resolve" else gid if isinstance(gid, (int, float)) else None,
        "gids": dict.fromkeys(ports, 3),
        "mtu": 9000,
        "paths": {"enp1s0f0np0": 9000},
        "verdict": "pass",
        "problems": [],
    }


def fake_answers(inputs: dict[str, Any]) -> dict[str, Any]:
    """What a passing AnswerCheck reports (the provider itself is tested in test_answer_check.py): one
    receipt, judged against the reference where one is given and its own generation."""
    receipt = {
        "id": "capital-france",
        "prompt_tokens": 6,
        "prompt_digest": "0" * 16,
        "prompt_nll": 2.31,
        "generated": [12366, 13],
        "generated_logprobs": [-0.02, -0.4],
        "text": " Paris.",
        "scored": [],
    }
    return {
        "receipts": [receipt],
        "verdict": "pass",
        "problems": [],
        "findings": [],
        "judged_against": ["reference", "self"] if inputs.get("reference") else ["self"],
        "known_answers": {"correct": 5, "of": 5, "min_correct": None, "answers": {}},
        "accepted": None,
        "notes": [],
        "version": (inputs.get("prompt_set") or {}).get("version"),
        "checked_at": 1_800_000_000,
        "elapsed_s": 4.2,
        "error": None,
    }


def is_node_image(args: pulumi.runtime.MockResourceArgs | Registered) -> bool:
    return args.typ == NODE_IMAGE


def fake_image_id(image: str, node: str) -> str:
    """A distinct image ID per image and node, as real nodes have (a containerd store gives the same
    image another ID), so a container given another node's ID is caught."""
    return "sha256:" + hashlib.sha256(f"{image}@{node}".encode()).hexdigest()


def fake_build_id(image: str, head: str) -> str:
    """The build's image ID, distinct from the head NodeImage's (the build's ID is that copy's trigger,
    not its output), so a container given the build's ID instead of its node's copy is caught."""
    return fake_image_id(image, f"built on {head}")


def default_fake_outputs(args: pulumi.runtime.MockResourceArgs) -> dict[str, Any]:
    """Outputs a real provider would compute, so downstream inputs can be checked."""
    if is_node_image(args):
        image = args.inputs.get("image") or "img:tag"
        destination = args.inputs["destination"]
        return {
            "image_id": fake_image_id(image, destination.get("name") or destination.get("host", "")),
            "layers": ["sha256:" + "a" * 64, "sha256:" + "b" * 64],
            "bytes_sent": 0,
            "skipped": True,
            "store": destination.get("image_store") or "classic",
        }
    if args.typ == IMAGE_BUILD:
        image_id = fake_build_id(args.inputs["ref"], args.inputs["node"].get("name", ""))
        return {"image_id": image_id, "observed_image_id": image_id, "built": True}
    if args.typ == "pulumi-python:dynamic/qwen35:ModelSupportCheck":
        # What a passing proof reports (the provider itself is tested in test_model_support.py).
        return {
            "verdict": "pass",
            "failed_stage": None,
            "vllm": "0.17.1",
            "transformers": "4.57.6",
            "architecture": "Qwen3_5MoeForConditionalGeneration",
            "model_type": "qwen3_5_moe",
            "quantization": {"quant_method": "fp8", "weight_block_size": [128, 128]},
            "memory_fit": None,
        }
    if args.typ == FABRIC_CHECK:
        return fake_fabric(args.inputs)
    if args.typ == ANSWER_CHECK:
        return fake_answers(args.inputs)
    if args.typ == HEALTH_SECRET:
        # What create draws (a real one is random); tests look for this value where it must not be.
        return {"secret": FAKE_HEALTH_SECRET}
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


def registered_by(build: Callable[[], Any], stack: str = "test") -> list[Registered]:
    """What `build()` registers when run as a Pulumi program under mocks (inputs as the engine gets them)."""
    mocks = RecordingMocks()
    pulumi.runtime.set_mocks(mocks, project="qwen35-spark", stack=stack, preview=False)

    @pulumi.runtime.test
    def _run():
        build()

    _run()
    return mocks.resources
