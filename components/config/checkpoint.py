"""The `model` section: the checkpoint on every node (Hub repo and revision, source, checks)."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationInfo, field_validator

from components.config.fields import NODE_NAME, PROJECT_DIR, _check_path, _check_ref, _Model

HUB_REPO = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,95}/[A-Za-z0-9][A-Za-z0-9_.-]{0,95}$")
# A branch, tag or 40-hex commit; what the Hub client accepts, without anything a path could abuse.
REVISION = re.compile(r"^[A-Za-z0-9_.][A-Za-z0-9_./-]{0,199}$")
PATTERN = re.compile(r"^[A-Za-z0-9_.*?\[\]/-]{1,200}$")


class ModelConfig(_Model):
    """The checkpoint on every node: which Hub repo and revision, from where, and how it is checked."""

    # Default: `serve.model` when that is a Hub id (an absolute path there means "no checkpoint here").
    repo: str | None = None
    # A branch, tag or commit. Resolved once to a commit sha and recorded: a moving branch never
    # changes a running stack on its own.
    revision: str = "main"
    # hub: fetched on the head from the Hub; cache: already in the head's cache (downloaded by hand).
    source: Literal["hub", "cache"] = "hub"
    allow_patterns: list[str] = []
    ignore_patterns: list[str] = []
    # What `pulumi refresh` checks on every node: presence and size, or every byte re-hashed.
    refresh: Literal["sizes", "full"] = "sizes"
    # A 120 GB download is expensive: `pulumi destroy` leaves the files unless this is false.
    keep_on_destroy: bool = True
    # Per-node HF cache dir (the directory containers mount as HF_HOME); default containers.hf_cache.
    cache_dirs: dict[str, str] = {}
    # Left free on each node's cache filesystem after the copy.
    disk_reserve_bytes: int = Field(default=10 * 1024**3, ge=0)
    # The Python on the head that runs the Hub client. Unset: a short-lived container of the
    # deployment image (it has huggingface_hub, as vLLM needs it; the head's own Python may not).
    # A relative path (`.venv/bin/python`) is this project's own, made absolute against the project
    # directory: only for a head that shares this machine's filesystem (the lab).
    fetch_python: str | None = None
    # The image of that container when it is not the deployment's own (it must have huggingface_hub).
    fetch_image: str | None = None
    # HF_ENDPOINT for the fetch (a mirror or a stand-in Hub); unset: the client's default, the Hub.
    endpoint: str | None = None

    @field_validator("repo")
    @classmethod
    def _repo(cls, v: str | None) -> str | None:
        if v is not None and not HUB_REPO.match(v):
            raise ValueError(f"{v!r}: give a Hugging Face repo id such as Qwen/Qwen3.5-122B-A10B-FP8")
        return v

    @field_validator("revision")
    @classmethod
    def _revision(cls, v: str) -> str:
        if not REVISION.match(v) or ".." in v:
            raise ValueError(f"{v!r}: give a branch, tag or 40-hex commit (letters, digits, . _ - /)")
        return v

    @field_validator("allow_patterns", "ignore_patterns")
    @classmethod
    def _patterns(cls, v: list[str]) -> list[str]:
        for pattern in v:
            if not PATTERN.match(pattern):
                raise ValueError(
                    f"{pattern!r}: a glob such as '*.safetensors' (letters, digits, . _ * ? [ ] / -)"
                )
        return v

    @field_validator("cache_dirs")
    @classmethod
    def _cache_dirs(cls, v: dict[str, str]) -> dict[str, str]:
        for node, path in v.items():
            if not NODE_NAME.match(node):
                raise ValueError(f"{node!r} is not a node name")
            _check_path(path)
        return v

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, v: str | None) -> str | None:
        if v is not None and not re.match(r"^https?://[A-Za-z0-9_.:\[\]-]+(/[A-Za-z0-9_./-]*)?$", v):
            raise ValueError(f"{v!r}: an http(s) URL without credentials, e.g. https://hf-mirror.example")
        return v

    @field_validator("fetch_python")
    @classmethod
    def _python(cls, v: str | None, info: ValidationInfo) -> str | None:
        if v is None or re.match(r"^(/[A-Za-z0-9_.+-]+)+$|^python3(\.[0-9]+)?$", v):
            return v
        if re.match(r"^[A-Za-z0-9_.+-]+(/[A-Za-z0-9_.+-]+)+$", v):
            project = (info.context or {}).get("project_dir", PROJECT_DIR)
            # normpath, not resolve(): a venv's python is a symlink that must stay the venv's.
            return os.path.normpath(Path(project) / v)
        raise ValueError(
            f"{v!r}: an absolute path to a Python, python3, or a path relative to the project "
            "directory such as .venv/bin/python"
        )

    @field_validator("fetch_image")
    @classmethod
    def _fetch_image(cls, v: str | None) -> str | None:
        return None if v is None else _check_ref(v)
