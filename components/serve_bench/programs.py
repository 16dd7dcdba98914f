"""The bench program (`components/node_programs/serve_bench.py`) as the head runs it: its argv, its
source and what its exit status means (its report is parsed in `facts.py`).

It arrives on stdin (`python3 -`, `program_stdin`) with the API key set in its environment by its
prelude, as the readiness probe's does: the key never appears in a command line or a log.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from components.node_programs import program_stdin, stdin_argv
from components.node_programs.serve_bench import Exit as BenchExit
from components.node_programs.wire import PROBE_API_KEY_ENV

# What the bench's exit status tells the operator to do (declared once, in the node program).
EXIT_HINTS = {
    BenchExit.FAILED: "the stage and the server's answer are above: read the server's log on the head "
    "(`docker logs`), fix the cause, then `pulumi up` measures again",
    BenchExit.REJECTED: "set qwen35-spark:api_key to the server's key",
}


def bench_argv(props: Mapping[str, Any]) -> list[str]:
    """The command run on the head: the bench program arrives on stdin."""
    settings = props["settings"]
    argv = [
        "--url", str(props["url"]),
        "--model", str(props["model"]),
        "--output-tokens", str(int(settings["output_tokens"])),
        "--prompt-tokens", str(int(settings["prompt_tokens"])),
        "--concurrency", str(int(settings["concurrency"])),
        "--deadline", f"{float(settings['deadline_s']):g}",
    ]  # fmt: skip
    if props.get("log_container"):
        argv += ["--log-container", str(props["log_container"])]
    return stdin_argv(argv)


def bench_program(api_key: str | None) -> bytes:
    """The bench's source, with the API key set in its environment (stdin, never argv)."""
    return program_stdin("serve_bench", environ={PROBE_API_KEY_ENV: api_key} if api_key else None)
