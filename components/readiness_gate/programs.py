"""The probe program (`components/node_programs/readiness.py`) as the head runs it: its argv, its
source and what its exit status means (its report is parsed in `facts.py`).

It arrives on stdin (`python3 -`, `program_stdin`), the API key set in its environment by its
prelude: the key never appears in a command line.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from components.node_programs import program_stdin, stdin_argv
from components.node_programs.readiness import Exit as ProbeExit
from components.node_programs.wire import PROBE_API_KEY_ENV

# What the probe's exit status tells the operator to do (declared once, in the node program).
EXIT_HINTS = {
    ProbeExit.TIMEOUT: "the server log tail is above; fix the cause, then `pulumi up` waits again",
    ProbeExit.REJECTED: "set qwen35-spark:api_key to the server's key",
}


def probe_argv(props: Mapping[str, Any], deadline_s: float) -> list[str]:
    """The command run on the head: the probe program arrives on stdin."""
    argv = [
        "--url", str(props["url"]),
        "--model", str(props["model"]),
        "--nodes", str(int(props["expect_nodes"])),
        "--gpus", f"{float(props['expect_gpus']):g}",
        "--deadline", f"{float(deadline_s):g}",
    ]  # fmt: skip
    ray = props.get("ray_container")
    argv += ["--ray-container", ray] if ray else ["--no-ray-check"]
    if (props.get("node") or {}).get("name"):
        argv += ["--node", str(props["node"]["name"])]
    if props.get("log_container"):
        argv += ["--log-container", props["log_container"]]
    for name, ip in sorted((props.get("expect_node_ips") or {}).items()):
        argv += ["--expect-node", f"{name}={ip}"]
    return stdin_argv(argv)


def probe_program(api_key: str | None) -> bytes:
    """The probe's source, with the API key set in its environment (stdin, never argv)."""
    return program_stdin("readiness", environ={PROBE_API_KEY_ENV: api_key} if api_key else None)
