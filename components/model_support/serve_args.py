"""The model-support check's argument proof: the image's vLLM accepts the server's exact command line.

Runs `patches/prove_args.py` in a throwaway container of the image on the head (the same way and
with the same bootstrap as the model proof: `docker run --rm`, no network, offline, the program
packed on stdin, the checkpoint's repo folder mounted read-only), with the server's final argument
list after `--`. vLLM's own parser and engine-argument class decide, before any Ray container: an
unknown or misspelled flag, a value of the wrong type, or a speculative config this vLLM cannot use
with this checkpoint is refused naming the flag and quoting vLLM's message.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from components.model_support.errors import ServeArgsError
from components.remote import Result, stderr_tail

ARGS_PROGRAM = "prove_args.py"
# What the stack outputs carry of the argument proof's report.
REPORT_FIELDS = ("verdict", "failed_stage", "flag", "error", "vllm", "parallel", "loader", "speculative")
HINTS = {
    "environment": "the image's python3 cannot import vLLM: use an image with vLLM >= 0.17",
    "parse": (
        "this vLLM does not take that flag or value: fix the serve option it comes from (a typed "
        "serve field, or serve.extra_args), or use an image whose vLLM has it"
    ),
    "validate": "vLLM's own start-up checks refuse this combination: see the error above",
    "engine_args": "vLLM could not build its engine arguments from these flags: see the error above",
    "parallel": (
        "vLLM refuses this rank's multi-node layout: check nodes (their order gives each node's rank), "
        "serve.tensor_parallel_size and serve.pipeline_parallel_size against the node count"
    ),
    "loader": (
        "serve.load_format needs a Python package this image lacks: install it in the image (an "
        "image.strategy build's pip install), or set serve.load_format: auto"
    ),
    "speculative": (
        "this vLLM cannot speculate with this checkpoint as configured: set serve.speculative to a "
        "method it supports (mtp needs the checkpoint's mtp.* tensors), or serve.speculative: null"
    ),
}


def args_argv(
    proof_argv: list[str], serve_argv: list[str], ranks: Mapping[str, list[str]] | None = None
) -> list[str]:
    """The model proof's `docker run … IMAGE - [--checkpoint X]`, each headless rank's argv as
    `--rank NODE <argv as JSON>` (proved in the same run: vLLM imported once), and `-- <serve argv>`
    last."""
    ranked = sorted((ranks or {}).items())
    options = [word for node, argv in ranked for word in ("--rank", node, json.dumps(argv))]
    return [*proof_argv, *options, "--", *serve_argv]


def parse_report(node: str, result: Result, report: Mapping[str, Any] | None) -> dict[str, Any]:
    """The argument proof's report (its last stdout line, parsed); ServeArgsError when it gave none."""
    if result.returncode in (0, 1) and report is not None and report.get("verdict") in ("pass", "fail"):
        return {key: report.get(key) for key in REPORT_FIELDS}
    raise ServeArgsError(
        f"{node}: the argument proof ended without a report (exit {result.returncode})\n"
        f"  stderr: {stderr_tail(result.stderr, lines=20)}\n"
        "  next: a crash of the image's python is an environment failure: use an image with vLLM >= 0.17"
    )


def failure_message(node: str, image: str, report: Mapping[str, Any], whose: str = "the server's") -> str:
    """vLLM refused the command line (`whose`: the server's, or a headless rank's): the flag, its own
    message, what to do."""
    stage = report.get("failed_stage") or "unknown"
    flag = f" ({report['flag']})" if report.get("flag") else ""
    return (
        f"{node}: vLLM {report.get('vllm') or 'unknown'} in image {image} refuses {whose} command "
        f"line at '{stage}'{flag}\n"
        f"  vLLM says: {report.get('error') or '(no message)'}\n"
        f"  next: {HINTS.get(stage, 'read the error above')}"
    )
