"""Reading the stack's `qwen35-spark:*` keys from Pulumi and validating them into a StackConfig; a
pydantic error becomes one ConfigError naming every bad field by path, with "did you mean".
"""

from __future__ import annotations

import contextlib
import difflib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from components.config.answers import AnswersConfig
from components.config.bench import BenchConfig
from components.config.checkpoint import ModelConfig
from components.config.cluster import ClusterConfig, ContainerConfig, FabricConfig, RayConfig
from components.config.fields import PROJECT_DIR, _CrossFieldErrors
from components.config.health import HealthConfig
from components.config.image import CopyConfig, ImageConfig
from components.config.nodes import NodeConfig, SshConfig
from components.config.serve import ServeConfig
from components.config.stack import StackConfig
from components.errors import Qwen35Error

NAMESPACE = "qwen35-spark"


class ConfigError(Qwen35Error, ValueError):
    """A stack config that cannot be deployed; `problems` are `path: message` lines."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__(
            "invalid stack configuration:\n"
            + "\n".join(f"  - {p}" for p in problems)
            + "\nFix these in Pulumi.<stack>.yaml (or `pulumi config set`) and run again."
        )


SECTIONS: dict[str, type[BaseModel] | None] = {
    "nodes": NodeConfig,
    "ssh": SshConfig,
    "image": ImageConfig,
    "serve": ServeConfig,
    "fabric": FabricConfig,
    "ray": RayConfig,
    "cluster": ClusterConfig,
    "containers": ContainerConfig,
    "copy": CopyConfig,
    "model": ModelConfig,
    "health": HealthConfig,
    "bench": BenchConfig,
    "answers": AnswersConfig,
}
SECRET_KEYS = ("hf_token", "api_key")


def _did_you_mean(key: str, choices: list[str]) -> str:
    close = difflib.get_close_matches(key, choices, n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else f" (known keys: {', '.join(sorted(choices))})"


def _model_for(loc: tuple) -> type[BaseModel] | None:
    """The model whose field list explains an error at `loc` (for 'did you mean')."""
    model: type[BaseModel] | None = StackConfig
    for part in loc[:-1]:
        if isinstance(part, int) or model is None:
            continue
        field = model.model_fields.get(part) or next(
            (f for f in model.model_fields.values() if f.alias == part), None
        )
        if field is None:
            return None
        ann = field.annotation
        args = getattr(ann, "__args__", ())
        model = next((a for a in (ann, *args) if isinstance(a, type) and issubclass(a, BaseModel)), None)
    return model


def _node_named(loc: tuple, body: Mapping[str, Any]) -> str:
    """` (node NAME)` for an error under `nodes.<i>` whose entry has a name, so the message names the
    node as well as its index; "" elsewhere."""
    if len(loc) < 2 or loc[0] != "nodes" or not isinstance(loc[1], int):
        return ""
    nodes = body.get("nodes")
    entry = nodes[loc[1]] if isinstance(nodes, list) and 0 <= loc[1] < len(nodes) else None
    name = entry.get("name") if isinstance(entry, Mapping) else None
    return f" (node {name})" if isinstance(name, str) and name else ""


def _format_errors(exc: ValidationError, body: Mapping[str, Any] | None = None) -> list[str]:
    problems = []
    for err in exc.errors():
        loc = tuple(err["loc"])
        path = ".".join(str(p) for p in loc)
        if err["type"] == "extra_forbidden":
            model = _model_for(loc)
            hint = _did_you_mean(str(loc[-1]), list(model.model_fields)) if model else ""
            problems.append(f"{path}: unknown key{hint}")
        elif err["type"] == "value_error" and isinstance(err.get("ctx", {}).get("error"), _CrossFieldErrors):
            problems.extend(f"{p}: {m}" for p, m in err["ctx"]["error"].problems)
        else:
            msg = err["msg"].removeprefix("Value error, ")
            problems.append(f"{path or '(top level)'}: {msg}{_node_named(loc, body or {})}")
    return problems


def parse_stack_config(raw: Mapping[str, Any], project_dir: Path | None = None) -> StackConfig:
    """Validate the `qwen35-spark:*` keys (without the namespace) into a StackConfig or raise ConfigError.

    Relative paths resolve against `project_dir` (default: the directory of Pulumi.yaml).
    """
    problems = []
    known = list(SECTIONS) + list(SECRET_KEYS)
    body = {}
    for key, value in raw.items():
        if key in SECRET_KEYS:
            continue
        if key not in SECTIONS:
            problems.append(f"{key}: unknown key{_did_you_mean(key, known)}")
            continue
        body[key] = value
    if "nodes" not in body:
        problems.append("nodes: missing: list the cluster's nodes (`qwen35-spark:nodes`)")
    if "ssh" not in body:
        problems.append("ssh: missing: at least `ssh.known_hosts` (host keys are pinned)")
    try:
        config = StackConfig.model_validate(body, context={"project_dir": project_dir or PROJECT_DIR})
    except ValidationError as exc:
        missing_sections = {"nodes", "ssh"} - set(body)
        problems += [p for p in _format_errors(exc, body) if p.split(":")[0] not in missing_sections]
    if problems:
        raise ConfigError(problems)
    return config


def _raw_namespace() -> dict[str, Any]:
    """Every `qwen35-spark:*` key of the stack, parsed from JSON where it is structured."""
    import json

    import pulumi.runtime.config as runtime_config

    merged = {**runtime_config.get_config_env(), **runtime_config.CONFIG.get()}
    raw: dict[str, Any] = {}
    for full_key, value in merged.items():
        namespace, _, key = full_key.partition(":")
        if namespace != NAMESPACE:
            continue
        if isinstance(value, str):
            with contextlib.suppress(ValueError):
                value = json.loads(value)
        raw[key] = value
    return raw


def load_stack_config() -> StackConfig:
    """Read and validate this stack's config; a bad config raises `pulumi.RunError` (no traceback)."""
    import pulumi

    try:
        return parse_stack_config(_raw_namespace())
    except ConfigError as exc:
        raise pulumi.RunError(str(exc)) from None


def load_secrets() -> dict[str, Any]:
    """The optional secrets (`hf_token`, `api_key`) as secret Outputs, or None when unset."""
    import pulumi

    cfg = pulumi.Config(NAMESPACE)
    return {key: cfg.get_secret(key) for key in SECRET_KEYS}
