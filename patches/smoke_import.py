#!/usr/bin/env python3
"""Last step of the hybrid image build: import vLLM's registries and check Qwen3.5 resolves.

Needs the real image (torch, the patched vLLM). Exit 0 when every Qwen3.5 architecture loads its model
class and every Qwen3.5 model type maps to a vLLM config class; exit 1 with one line per failure.
Resolving names is not compatibility: prove_model.py (the step before) proves behaviour. Nothing here
asks transformers to know the model types: vLLM's own config classes load them, and the transformers
vLLM 0.17 pins (4.57.x) works without knowing them.
"""

from __future__ import annotations

import sys
import traceback

ARCHITECTURES = (
    "Qwen3_5ForConditionalGeneration",
    "Qwen3_5MoeForConditionalGeneration",
    "Qwen3_5MTP",
    "Qwen3_5MoeMTP",
)
MODEL_TYPES = {"qwen3_5": "Qwen3_5Config", "qwen3_5_moe": "Qwen3_5MoeConfig"}


def _last_line(exc: BaseException) -> str:
    return traceback.format_exception_only(type(exc), exc)[-1].strip()


def check_models() -> list[str]:
    """Every Qwen3.5 architecture is registered and its class imports."""
    try:
        from vllm.model_executor.models.registry import ModelRegistry
    except Exception as exc:  # any import failure is the finding
        return [f"cannot import vLLM's model registry: {_last_line(exc)}"]
    problems = []
    supported = ModelRegistry.get_supported_archs()
    for arch in ARCHITECTURES:
        if arch not in supported:
            problems.append(f"model registry: {arch} is not registered (did the patcher run?)")
            continue
        try:
            cls = ModelRegistry.models[arch].load_model_cls()
        except Exception as exc:
            problems.append(
                f"model registry: {arch} is registered but its class fails to load: {_last_line(exc)}"
            )
            continue
        if cls.__name__ != arch:  # the donor names every Qwen3.5 class after its architecture
            problems.append(f"model registry: {arch} loads {cls.__module__}.{cls.__name__}, not {arch}")
    return problems


def check_configs() -> list[str]:
    """Every Qwen3.5 model type maps to its config class in vLLM."""
    try:
        from vllm.transformers_utils.config import _CONFIG_REGISTRY
    except Exception as exc:
        return [f"cannot import vLLM's config registry: {_last_line(exc)}"]
    problems = []
    for model_type, class_name in MODEL_TYPES.items():
        try:
            cls = _CONFIG_REGISTRY[model_type]
        except Exception as exc:
            problems.append(f"config registry: {model_type} does not resolve: {_last_line(exc)}")
            continue
        if cls.__name__ != class_name:
            problems.append(f"config registry: {model_type} resolves to {cls.__name__}, not {class_name}")
    return problems


def main() -> int:
    problems = check_models() + check_configs()
    for problem in problems:
        print(f"smoke_import: FAIL: {problem}", file=sys.stderr)
    if problems:
        return 1
    print(f"smoke_import: OK: {', '.join(ARCHITECTURES)} and model types {', '.join(MODEL_TYPES)} resolve")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
