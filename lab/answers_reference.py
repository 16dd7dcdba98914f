"""The answer check's reference for a lab checkpoint: made by transformers inside the real-vLLM lab
image (lab/answers_reference_program.py), once per checkpoint, image and prompt set, and cached.

`make up` and the real-engine tests point `answers.reference` at the file this returns: the served
model (vLLM's CPU build, two tensor-parallel ranks) is then judged against one process of another
implementation reading the same checkpoint files.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from components.answer_check.prompts import VERSION, prompt_set
from lab.layout import LabError, LabNode, cache_dir
from lab.remote import docker

PROGRAM = Path(__file__).with_name("answers_reference_program.py")
MODEL_IN_CONTAINER = "/model"
TIMEOUT_S = 900  # transformers' import and a few hundred forward passes of a tiny model, on one core


def spec(long_prompt_tokens: int) -> dict[str, Any]:
    """The prompts the reference answers: the set the answer check sends, the long one sized."""
    return {"version": VERSION, "prompts": prompt_set(long_prompt_tokens)}


def checkpoint_digest(repo: Path) -> str:
    """A digest of every file of the checkpoint's folder, by name and content."""
    digest = hashlib.sha256()
    for path in sorted(p for p in repo.rglob("*") if p.is_file()):
        digest.update(path.relative_to(repo).as_posix().encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def reference_path(image_id: str, repo: Path, settings: dict[str, Any]) -> Path:
    """Where the reference for this image, checkpoint and settings is cached."""
    key = hashlib.sha256()
    parts = (
        PROGRAM.read_bytes(),
        json.dumps(spec(settings["long_prompt_tokens"]), sort_keys=True).encode(),
        image_id.encode(),
        checkpoint_digest(repo).encode(),
        f"{settings['max_tokens']}/{settings['top']}".encode(),
    )
    for part in parts:
        key.update(part + b"\0")
    return cache_dir() / "answers" / f"reference-{key.hexdigest()[:16]}.json"


def program_stdin(long_prompt_tokens: int) -> bytes:
    """The program's source after a prelude that assigns its prompt set."""
    prelude = f"SPEC = {json.dumps(json.dumps(spec(long_prompt_tokens)))}\n"
    return (prelude + PROGRAM.read_text()).encode()


def make_reference(node: LabNode, image: str, repo: Path, settings: dict[str, Any]) -> Path:
    """The reference file for checkpoint folder `repo` (on this machine, which the lab nodes share),
    computed on `node` in `image` (its ID or tag) with `settings` (`long_prompt_tokens`, `max_tokens`,
    `top`, as the stack's `answers` section sets them); made once, then read from the cache."""
    image_id = docker(node, "image", "inspect", "--format", "{{.Id}}", image).out.strip()
    path = reference_path(image_id, repo, settings)
    if path.exists():
        return path
    argv = ["run", "--rm", "-i", "--network", "none", "--volume", f"{repo}:{MODEL_IN_CONTAINER}:ro",
            image_id, "python3", "-", MODEL_IN_CONTAINER, str(settings["max_tokens"]),
            str(settings["top"])]  # fmt: skip
    source = program_stdin(settings["long_prompt_tokens"])
    ran = docker(node, *argv, input=source, timeout=TIMEOUT_S, check=False)
    lines = [line for line in ran.out.splitlines() if line.startswith("{")]
    if ran.returncode != 0 or not lines:
        tail = "\n".join((ran.err or ran.out).strip().splitlines()[-15:])
        raise LabError(
            f"lab: {node.name}: the transformers reference failed (exit {ran.returncode}):\n{tail}"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    partial.write_text(lines[-1] + "\n")
    partial.replace(path)
    return path
