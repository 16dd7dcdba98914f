"""A ContainerSpec as `pulumi_docker.Container` arguments: the spec's values, its secrets added only
where set (and made secret), in the order the provider reads them back. No resource is declared here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pulumi
import pulumi_docker as docker

from components.containers import ContainerSpec


def present_secrets(wanted: Mapping[str, str], secrets: dict[str, Any]) -> dict[str, Any]:
    """`wanted` (a variable or file -> a secret's key) with each key's value, for the secrets set."""
    return {target: secrets[key] for target, key in wanted.items() if secrets.get(key) is not None}


def container_envs(
    spec: ContainerSpec, secrets: dict[str, Any], env_list: pulumi.Input[list[str]] | None = None
) -> pulumi.Input[list[str]]:
    """Docker's `KEY=value` list (`env_list`, else the spec's); secret variables are added only when
    set, and make the list secret."""
    plain = spec.env_list() if env_list is None else env_list
    present = present_secrets(spec.secret_env, secrets)
    if not present:
        return plain
    names = sorted(present)
    joined = pulumi.Output.all(plain, *(present[n] for n in names)).apply(
        lambda values: list(values[0]) + [f"{n}={v}" for n, v in zip(names, values[1:], strict=True)]
    )
    return pulumi.Output.secret(joined)


def container_args(
    spec: ContainerSpec, secrets: dict[str, Any], env_list: pulumi.Input[list[str]] | None = None
) -> dict[str, Any]:
    """A ContainerSpec as `pulumi_docker.Container` arguments (`env_list`: its environment, when it
    holds values known only once a resource is created)."""
    return {
        "name": spec.name,
        "image": spec.image,
        # The image's entrypoint is the manual procedure's wrapper script: run our command instead.
        "entrypoints": [spec.command[0]],
        "command": list(spec.command[1:]),
        "envs": container_envs(spec, secrets, env_list),
        "network_mode": spec.network_mode,
        "ipc_mode": spec.ipc_mode,
        "pid_mode": spec.pid_mode,
        "shm_size": spec.shm_size_mb,
        "gpus": spec.gpus,
        "devices": [
            docker.ContainerDeviceArgs(host_path=d, container_path=d, permissions="rwm") for d in spec.devices
        ]
        or None,
        "ulimits": [docker.ContainerUlimitArgs(name=n, soft=s, hard=h) for n, s, h in spec.ulimits],
        # `drops` stated empty: the provider reads it back as [] and a fresh stack's first refresh would
        # otherwise report `~capabilities` on every container (seen under the real engine).
        "capabilities": docker.ContainerCapabilitiesArgs(adds=list(spec.capabilities), drops=[])
        if spec.capabilities
        else None,
        "privileged": spec.privileged,
        "init": spec.init,
        "restart": spec.restart.value,
        "max_retry_count": spec.max_retry_count,
        "volumes": [
            docker.ContainerVolumeArgs(volume_name=m.source, container_path=m.target, read_only=m.read_only)
            if m.volume
            else docker.ContainerVolumeArgs(
                host_path=m.source, container_path=m.target, read_only=m.read_only
            )
            # In the order the provider reads them back (by container path). `volumes` is a set, and
            # the bridge rebuilds its inputs from what refresh read by position: a declared order
            # that differs swapped the watchdog's socket and state volume there, and the next
            # refresh wanted to replace it (seen under the real engine).
            for m in sorted(spec.mounts, key=lambda m: m.target)
        ],
        "labels": [docker.ContainerLabelArgs(label=k, value=v) for k, v in sorted(spec.labels.items())],
        # Refresh records a stopped container as `must_run: false` (it stays on the node, with its
        # logs), so `up --refresh` starts it again in place.
        "must_run": True,
        "destroy_grace_seconds": spec.stop_grace_s,
        "logs": False,
        "attach": False,
        "uploads": container_uploads(spec, secrets),
    }


def container_uploads(
    spec: ContainerSpec, secrets: dict[str, Any]
) -> list[docker.ContainerUploadArgs] | None:
    """The spec's secret files as uploads, each content a secret (None: the spec has none)."""
    files = present_secrets(spec.secret_files, secrets)
    return [
        docker.ContainerUploadArgs(file=path, content=pulumi.Output.secret(value), permissions="0600")
        for path, value in sorted(files.items())
    ] or None
