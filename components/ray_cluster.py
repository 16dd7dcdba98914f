"""The Ray cluster's containers as pure values: what runs on each node, with which settings and why.

`ray_container_spec` turns validated config into a `ContainerSpec` (components/containers.py, the
settings every container shares); the deployment turns a spec into a `pulumi_docker.Container`.
"""

from __future__ import annotations

from components.config import NodeConfig, RayPorts, StackConfig
from components.containers import (
    ContainerSpec,
    ImageId,
    Mount,
    NodeFabric,
    fabric_env,
    node_container_spec,
)

# Ray's session directory (sockets, logs). The vLLM server container shares it with the Ray head,
# because a Ray driver reaches its node's raylet through a Unix socket in this directory.
RAY_TMP = "/tmp/ray"

# Ray's ports per node, as `ray start` flags (only those set in config).
_RAY_PORT_FLAGS = {
    "node_manager_port": "--node-manager-port",
    "object_manager_port": "--object-manager-port",
    "metrics_export_port": "--metrics-export-port",
    "dashboard_agent_listen_port": "--dashboard-agent-listen-port",
    "dashboard_agent_grpc_port": "--dashboard-agent-grpc-port",
    "runtime_env_agent_port": "--runtime-env-agent-port",
    "min_worker_port": "--min-worker-port",
    "max_worker_port": "--max-worker-port",
}


def head_container_name(config: StackConfig) -> str:
    return f"{config.containers.name_prefix}-ray-head"


def worker_container_name(config: StackConfig) -> str:
    return f"{config.containers.name_prefix}-ray-worker"


def ray_tmp_volume_name(config: StackConfig) -> str:
    return f"{config.containers.name_prefix}-ray-tmp"


def ray_container_name(config: StackConfig, node: NodeConfig) -> str:
    return head_container_name(config) if node is config.head else worker_container_name(config)


# Ray >= 2.60 drains a node on SIGTERM (for Ray Serve) until its leases return; vLLM's workers hold
# theirs until the server is gone, so every replaced Ray container waited out its whole 30 s grace.
RAY_NODE_ENV = {"RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0"}


def ray_port_flags(ports: RayPorts) -> list[str]:
    """`ray start` flags for the per-node ports that config sets (none on the Sparks)."""
    return [f"{flag}={getattr(ports, key)}" for key, flag in _RAY_PORT_FLAGS.items() if getattr(ports, key)]


def dashboard_host(config: StackConfig) -> str:
    """Where the Ray dashboard listens: the head's fabric address unless config says otherwise."""
    return config.ray.dashboard_host or config.head.fabric_ip


def head_address(config: StackConfig) -> str:
    """The Ray GCS address workers and the vLLM driver join: head fabric address and Ray port."""
    return f"{config.head.fabric_ip}:{config.ray.port}"


def ray_start_argv(config: StackConfig, node: NodeConfig) -> list[str]:
    """`ray start` for `node`: the head on its fabric address, a worker joining the head's."""
    if node is config.head:
        argv = [
            "ray", "start", "--head", "--block",
            f"--node-ip-address={node.fabric_ip}",
            f"--port={config.ray.port}",
            # The dashboard stays on the fabric network unless the operator opens it up.
            f"--dashboard-host={dashboard_host(config)}",
            f"--dashboard-port={config.ray.dashboard_port}",
        ]  # fmt: skip
    else:
        argv = [
            "ray", "start", "--block",
            f"--address={head_address(config)}",
            f"--node-ip-address={node.fabric_ip}",
        ]  # fmt: skip
    # Declared, not detected: GB10 GPU detection has failed inside containers, and then Ray
    # reports 0 GPUs and vLLM waits forever for a placement group.
    argv.append(f"--num-gpus={node.gpus}")
    return argv + ray_port_flags(node.ray_ports)


def ray_container_spec(
    config: StackConfig, node: NodeConfig, image_id: ImageId, fabric: NodeFabric | None = None
) -> ContainerSpec:
    """The Ray head (on `config.head`) or a Ray worker (anywhere else) on `node`, running `image_id`
    (the image ID of that node's own copy of the image); `fabric`: the node's FabricCheck outputs."""
    is_head = node is config.head
    extra = (Mount(ray_tmp_volume_name(config), RAY_TMP, volume=True),) if is_head else ()
    return node_container_spec(
        config,
        node,
        name=ray_container_name(config, node),
        role="ray-head" if is_head else "ray-worker",
        image_id=image_id,
        command=ray_start_argv(config, node),
        env={**fabric_env(config, node, fabric), **RAY_NODE_ENV},
        secret_env={"HF_TOKEN": "hf_token"},
        extra_mounts=extra,
    )
