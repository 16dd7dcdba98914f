"""The node proof as each node runs it: `docker run` of the deployment image (by ID) with the
serving containers' devices, GPU request, limits and this node's NCCL settings, the program
(`components/node_programs/node_proof.py`) on stdin. Building these touches no node."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from components.node_programs import node_software, program_argv, program_stdin
from components.node_programs.node_proof import Exit

# What NCCL is asked to say: its network, HCAs, GID index and the variables it read.
NCCL_DEBUG_ENV = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET,ENV"}
EXIT_HINTS = {
    Exit.USAGE: "the proof was given a bad SPEC (a bug in this program)",
    Exit.DEADLINE: "a rank never joined or the all-reduce hung: check each node reaches the head's "
    "fabric_ip on fabric.probe_port (firewall, route) and the NCCL lines above",
}


def container_name(props: Mapping[str, Any]) -> str:
    return f"{props['container_prefix']}-node-proof"


def proof_spec(props: Mapping[str, Any], entry: Mapping[str, Any]) -> dict[str, Any]:
    """What the program on node `entry` is given: its rank, the group's address, the sizes, the bound."""
    return {
        "node": str(entry["name"]),
        "rank": int(entry["rank"]),
        "world": len(props["nodes"]),
        "master_addr": str(props["master_addr"]),
        "port": int(props["port"]),
        "gpu": bool(props["gpu"]),
        "bytes": int(props["bytes"]),
        "iterations": int(props["iterations"]),
        "deadline_s": float(props["deadline_s"]),
    }


def run_options(run: Mapping[str, Any]) -> list[str]:
    """The serving containers' runtime settings as `docker run` options (`run`: deployment's
    `proof_run`: devices, gpus, privileged, capabilities, ulimits, ipc, shm_size_mb)."""
    options: list[str] = []
    for device in run.get("devices") or ():
        options += ["--device", str(device)]
    if run.get("gpus"):
        options += ["--gpus", str(run["gpus"])]
    if run.get("privileged"):
        options.append("--privileged")
    for capability in run.get("capabilities") or ():
        options += ["--cap-add", str(capability)]
    # (numbers come back from the engine as floats: Docker parses `8388608`, never `8388608.0`)
    for name, soft, hard in run.get("ulimits") or ():
        options += ["--ulimit", f"{name}={int(soft)}:{int(hard)}"]
    if run.get("ipc"):
        options += ["--ipc", str(run["ipc"])]
    if run.get("shm_size_mb"):
        options += ["--shm-size", f"{int(run['shm_size_mb'])}m"]
    return options


def proof_argv(props: Mapping[str, Any], entry: Mapping[str, Any]) -> list[str]:
    """`docker run` of the proof on node `entry`: host network (the fabric), its own NCCL settings."""
    env = {**dict(entry.get("env") or {}), **NCCL_DEBUG_ENV}
    return [
        "docker", "run", "--rm", "-i",
        "--name", container_name(props),
        "--label", "qwen35.role=node-proof",
        "--label", f"qwen35.node={entry['name']}",
        "--network", "host",
        *run_options(props.get("run") or {}),
        *(option for key in sorted(env) for option in ("--env", f"{key}={env[key]}")),
        # The image's own entrypoint (the Ray wrapper script) must not run.
        "--entrypoint", "python3",
        str(entry["image_id"]), "-", json.dumps(proof_spec(props, entry), sort_keys=True),
    ]  # fmt: skip


def remove_argv(props: Mapping[str, Any]) -> list[str]:
    """A proof container a killed run left (its name would refuse the next run)."""
    return ["docker", "rm", "--force", container_name(props)]


def proof_program() -> bytes:
    return program_stdin("node_proof")


SOFTWARE_HINTS = {
    node_software.Exit.USAGE: "the software facts program was given a bad SPEC (a bug in this program)"
}


def software_argv(entry: Mapping[str, Any], python: str = "python3") -> list[str]:
    """What the node's host runs (driver, CUDA, kernel, ConnectX firmware), read on the host over SSH
    with no container; a lab node's `host_root` stands in for `/`."""
    spec = {"root": str(entry.get("host_root") or "/")}
    return program_argv("node_software", [json.dumps(spec, sort_keys=True)], python)
