"""Declared `pulumi_docker.Container` inputs → the `docker run` that starts the same container.

The lab E2E runs the program under mocks, takes the containers it declares, and starts them for real
with `docker run` over SSH. Every input is translated, or dropped with a reason the lab cannot have it
(GPUs, InfiniBand devices), or is a provider-only setting with no container meaning. An input this
module does not know is an error: a new setting must never silently vanish from the lab run.
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

# Pulumi's wire format marks a secret as {SIG_KEY: SECRET_SIG, "value": …}; under mocks that wrapper
# is what the program's secret inputs (envs with an API key, the gate's api_key) look like.
SIG_KEY = "4dabf18193072939515e22adb298388d"
SECRET_SIG = "1b47061264138c4ac30d75fd1eb44270"

# Devices the lab has no hardware for (the Sparks' RDMA and GPU device nodes).
LAB_LACKS_DEVICE_PREFIXES = ("/dev/infiniband", "/dev/nvidia")

UNLIMITED = -1  # Docker's (and the provider's) spelling of an unlimited ulimit

# The docker provider's own behaviour, not the container's: nothing for `docker run` to do.
PROVIDER_ONLY = frozenset(
    {
        "mustRun",  # refresh treats a stopped container as gone
        "destroyGraceSeconds",  # how long `pulumi destroy` waits before killing
        "logs",  # whether the provider collects logs on create
        "attach",  # whether the provider waits for the container to exit
        "wait",  # whether the provider waits for a healthy state
        "waitTimeout",
        "removeVolumes",  # what destroy removes
        "start",  # always true for a server
    }
)

_FLAG_OF = {
    "name": "--name",
    "networkMode": "--network",
    "ipcMode": "--ipc",
    "pidMode": "--pid",
    "usernsMode": "--userns",
    "hostname": "--hostname",
    "user": "--user",
    "workingDir": "--workdir",
    "stopSignal": "--stop-signal",
    "stopTimeout": "--stop-timeout",
    "logDriver": "--log-driver",
    "runtime": "--runtime",
    "cgroupnsMode": "--cgroupns",
}


def plain(value: Any) -> Any:
    """`value` with every secret wrapper replaced by its content, and whole floats as ints."""
    if isinstance(value, dict):
        if value.get(SIG_KEY) == SECRET_SIG:
            return plain(value.get("value"))
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _restart(policy: str, retries: Any) -> str:
    return f"{policy}:{int(retries)}" if policy == "on-failure" and retries else policy


def _volume(volume: dict[str, Any]) -> list[str]:
    if volume.get("fromContainer"):
        return ["--volumes-from", volume["fromContainer"]]
    source = volume.get("volumeName") or volume.get("hostPath")
    if not source or not volume.get("containerPath"):
        raise ValueError(f"volume {volume!r}: needs volumeName or hostPath, and containerPath")
    suffix = ":ro" if volume.get("readOnly") else ""
    return ["--volume", f"{source}:{volume['containerPath']}{suffix}"]


def _mount(mount: dict[str, Any]) -> list[str]:
    unknown = set(mount) - {"type", "source", "target", "readOnly"}
    if unknown:
        raise ValueError(f"mount {mount!r}: options {sorted(unknown)} are not translated")
    parts = [f"type={mount.get('type', 'volume')}"]
    if mount.get("source"):
        parts.append(f"source={mount['source']}")
    parts.append(f"target={mount['target']}")
    if mount.get("readOnly"):
        parts.append("readonly")
    return ["--mount", ",".join(parts)]


def _ulimit(limit: dict[str, Any], caps: Mapping[str, int]) -> tuple[list[str], str | None]:
    """`--ulimit` for one limit, or why the lab cannot grant it (a hard limit above the node's own)."""
    name, soft, hard = limit["name"], int(limit["soft"]), int(limit["hard"])
    cap = caps.get(name, UNLIMITED)
    wanted = max(soft, hard, key=lambda v: float("inf") if v == UNLIMITED else v)
    if cap != UNLIMITED and (wanted == UNLIMITED or wanted > cap):
        shown = "unlimited" if wanted == UNLIMITED else str(wanted)
        return [], (
            f"ulimit {name}={soft}:{hard}: the lab node's hard {name} limit is {cap} and it cannot raise "
            f"it (no CAP_SYS_RESOURCE); the container keeps the daemon's default instead of {shown}"
        )
    return ["--ulimit", f"{name}={soft}:{hard}"], None


def upload_flags(upload: Mapping[str, Any]) -> list[str]:
    """A declared upload (`file`, `content`) as `--volume HOSTFILE:file:ro`, the content in a 0600
    file of its own under a private temporary folder."""
    unknown = set(upload) - {"file", "content", "permissions"}
    if unknown or "content" not in upload:
        raise ValueError(f"upload of {upload.get('file')!r}: options {sorted(unknown)} are not translated")
    folder = Path(tempfile.mkdtemp(prefix="qwen35-upload-"))
    host = folder / "content"
    host.touch(mode=0o600)
    host.write_text(upload["content"])
    return ["--volume", f"{host}:{upload['file']}:ro"]


def docker_run_argv(
    inputs: dict[str, Any], node_limits: Mapping[str, int] | None = None
) -> tuple[list[str], list[str]]:
    """(`docker run -d …` argv, what was dropped and why) for one declared Container's inputs.

    `node_limits` maps a ulimit name to the highest hard value the node can grant (-1: unlimited);
    a declared ulimit above it is dropped and said, like GPUs and InfiniBand devices.
    """
    caps = node_limits or {}
    spec = plain(inputs)
    if not spec.get("image"):
        raise ValueError("the container declares no image")
    argv = ["docker", "run", "--detach"]
    dropped: list[str] = []
    entrypoints = list(spec.get("entrypoints") or [])
    command = list(spec.get("command") or [])
    handled = {"image", "entrypoints", "command"} | PROVIDER_ONLY
    for key, value in spec.items():
        if key in handled or value is None:
            continue
        if key in _FLAG_OF:
            argv += [_FLAG_OF[key], str(value)]
        elif key == "envs":
            for pair in value:
                argv += ["--env", pair]
        elif key == "labels":
            for label in value:
                argv += ["--label", f"{label['label']}={label['value']}"]
        elif key == "shmSize":
            argv += ["--shm-size", f"{int(value)}m"]  # the provider's shm_size is in MB
        elif key == "memory":
            argv += ["--memory", f"{int(value)}m"]
        elif key == "gpus":
            dropped.append(f"gpus={value}: the lab has no GPU (Ray is told the GPU count by --num-gpus)")
        elif key == "devices":
            for device in value:
                host = device["hostPath"]
                if host.startswith(LAB_LACKS_DEVICE_PREFIXES):
                    dropped.append(f"device {host}: the lab has no InfiniBand/GPU device nodes")
                    continue
                target = device.get("containerPath") or host
                argv += ["--device", f"{host}:{target}:{device.get('permissions') or 'rwm'}"]
        elif key == "ulimits":
            for limit in value:
                flags, reason = _ulimit(limit, caps)
                argv += flags
                dropped += [reason] if reason else []
        elif key == "capabilities":
            argv += [arg for cap in value.get("adds") or [] for arg in ("--cap-add", cap)]
            argv += [arg for cap in value.get("drops") or [] for arg in ("--cap-drop", cap)]
        elif key in ("privileged", "init", "rm", "readOnly"):
            if value:
                argv.append({"readOnly": "--read-only"}.get(key, f"--{key}"))
        elif key == "restart":
            argv += ["--restart", _restart(value, spec.get("maxRetryCount"))]
        elif key == "maxRetryCount":
            continue  # part of --restart
        elif key == "volumes":
            argv += [arg for volume in value for arg in _volume(volume)]
        elif key == "mounts":
            argv += [arg for mount in value for arg in _mount(mount)]
        elif key == "uploads":
            # The provider writes each file into the container at its creation; lab nodes share this
            # machine's filesystem, so a private host file bound read-only stands in for it.
            argv += [arg for upload in value for arg in upload_flags(upload)]
        elif key == "logOpts":
            argv += [arg for k, v in sorted(value.items()) for arg in ("--log-opt", f"{k}={v}")]
        else:
            raise ValueError(f"declared Container input {key!r} has no `docker run` translation here")
    if entrypoints:
        argv += ["--entrypoint", entrypoints[0]]
    argv.append(spec["image"])
    argv += entrypoints[1:] + command
    return argv, dropped
