"""Every stack variant's registrations under Pulumi mocks, as one canonical JSON document.

A refactor that must not change behaviour records this before and after, and compares:

    PYTHONHASHSEED=0 .venv/bin/python -m tests.support.registrations > before.json
    … the change …
    PYTHONHASHSEED=0 .venv/bin/python -m tests.support.registrations > after.json
    diff before.json after.json

Each resource is its type, name, parent, provider and inputs, sorted by type and name (the order of
registration depends on when outputs resolve, so it is not part of the record). A dynamic
resource's inputs include `__provider`, the provider as the SDK pickles it with dill, so the same
document also shows that every provider's pickled bytes are unchanged (the decoded pickle's module
and class names are listed beside it, so a difference is readable).
"""

from __future__ import annotations

import base64
import json
import pickletools
import sys
from collections.abc import Callable
from typing import Any

from tests.support.declared import plain
from tests.support.program import dev_raw, mp_stack_config, run_program, stack_config

NAMESPACE = "qwen35-spark"


def _ns(raw: dict[str, Any]) -> dict[str, Any]:
    return {f"{NAMESPACE}:{key}": value for key, value in raw.items()}


def _dev(**sections: Any) -> dict[str, Any]:
    raw = dev_raw()
    for key, value in sections.items():
        raw[key] = value
    return _ns(raw)


def _graft() -> dict[str, Any]:
    return _dev(
        image={
            "strategy": "graft",
            "base": "vllm-node:latest",
            "donor": "hellohal2064/vllm-qwen3.5-gb10:latest",
            "name": "vllm-qwen35-graft",
            "platform": "linux/arm64",
        }
    )


def _hybrid() -> dict[str, Any]:
    return _dev(image={"strategy": "hybrid", "platform": "linux/arm64"})


def _three_nodes() -> dict[str, Any]:
    raw = dev_raw()
    third = {**raw["nodes"][1], "name": "spark-3", "host": "192.168.200.14", "fabric_ip": "192.168.200.14"}
    raw["nodes"] = [*raw["nodes"], third]
    raw["serve"] = {**raw["serve"], "tensor_parallel_size": 3}
    return _ns(raw)


def _health_off() -> dict[str, Any]:
    return _dev(health={"mode": "off"})


# name → (config, stack, preview)
VARIANTS: dict[str, Callable[[], tuple[dict[str, Any], str, bool]]] = {
    "dev": lambda: (stack_config("dev"), "dev", False),
    "dev-preview": lambda: (stack_config("dev"), "dev", True),
    "lab": lambda: (stack_config("lab"), "lab", False),
    "graft": lambda: (_graft(), "dev", False),
    "hybrid": lambda: (_hybrid(), "dev", False),
    "three-nodes": lambda: (_three_nodes(), "dev", False),
    "health-off": lambda: (_health_off(), "dev", False),
    "mp-2": lambda: (mp_stack_config(2), "dev", False),
    "mp-3": lambda: (mp_stack_config(3), "dev", False),
}
SECRETS = {"hf_token": "hf_recorded", "api_key": "sk-recorded"}


def pickled_names(encoded: str) -> list[str]:
    """The strings a pickled provider names (its module and class, when pickled by reference)."""
    data = base64.b64decode(encoded)
    return [str(arg) for op, arg, _pos in pickletools.genops(data) if "UNICODE" in op.name]


def _canonical(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _canonical(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, list | tuple):
        return [_canonical(v) for v in value]
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if type(value).__name__ == "Unknown":  # an output not known under mocks (pulumi.output.Unknown)
        return "<unknown>"
    return value


def record(name: str) -> dict[str, Any]:
    config, stack, preview = VARIANTS[name]()
    run = run_program(config, stack=stack, preview=preview, secrets=SECRETS)
    resources = []
    for r in run.resources:
        entry: dict[str, Any] = {
            "type": r.typ,
            "name": r.name,
            "parent": r.parent,
            "provider": r.provider,
            "inputs": _canonical(r.inputs),
        }
        provider = plain(r.inputs.get("__provider"))
        if isinstance(provider, str):
            entry["provider_pickle"] = pickled_names(provider)
        resources.append(entry)
    resources.sort(key=lambda entry: (entry["type"], entry["name"]))
    return {"resources": resources, "outputs": _canonical(run.outputs)}


def main(argv: list[str]) -> int:
    names = argv or list(VARIANTS)
    json.dump(
        {name: record(name) for name in names},
        sys.stdout,
        indent=1,
        sort_keys=True,
        default=lambda v: "<unknown>" if type(v).__name__ == "Unknown" else repr(v),
    )
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
