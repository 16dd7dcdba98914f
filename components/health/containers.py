"""The watchdog's and the agents' containers and their config, as pure values.

`health_config` is the JSON every health program reads (QWEN35_HEALTH_CONFIG): no secret in it.
`watchdog_container_spec` and `agent_container_spec` are `ContainerSpec`s the deployment declares.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from components.config import CheckMode, Executor, NodeConfig, RestartPolicy, StackConfig
from components.containers import ContainerSpec, ImageId, Mount
from components.model_support.memory_fit import GB, MIN_KV_CACHE_GB, RUNTIME_RESERVE_GB
from components.mp_executor import mp_container_name, ranked_nodes
from components.node_programs import health_wire, program_argv
from components.ray_cluster import dashboard_host, head_container_name, worker_container_name
from components.vllm_server import local_url, vllm_container_name

# How long `docker stop` may take per container when the watchdog stops it (as their specs declare).
SERVER_STOP_S = 120
RAY_STOP_S = 30


def watchdog_container_name(cfg: StackConfig) -> str:
    return f"{cfg.containers.name_prefix}-watchdog"


def agent_container_name(cfg: StackConfig) -> str:
    return f"{cfg.containers.name_prefix}-health-agent"


def health_volume_name(cfg: StackConfig) -> str:
    """The watchdog's state volume on the head (its restart budget survives its container)."""
    return f"{cfg.containers.name_prefix}-health"


def metrics_host(cfg: StackConfig) -> str:
    return cfg.health.metrics_host or cfg.head.fabric_ip


def node_need_bytes(memory_fit_summary: Mapping[str, Any] | None, node_name: str, gpus: int) -> int | None:
    """What `node_name` needs free before its containers start: its ranks × (weights + the runtime
    reserve + one request's KV cache, or the flat floor), from `model_support.memory_fit`'s summary.
    None when no fit was recorded (or it does not name the node)."""
    if not memory_fit_summary:
        return None
    rank = (memory_fit_summary.get("per_rank") or {}).get(node_name)
    if not rank or rank.get("weights_gb") is None:
        return None
    request_gb = memory_fit_summary.get("request_gb")
    kv_gb = float(request_gb) if request_gb is not None else MIN_KV_CACHE_GB
    per_rank = float(rank["weights_gb"]) + RUNTIME_RESERVE_GB + kv_gb
    return int(round(per_rank * GB)) * max(gpus, 1)


def node_containers(cfg: StackConfig, node: NodeConfig) -> list[dict[str, Any]]:
    """The stack's containers on `node` the health programs may stop and start, in start order."""
    if cfg.cluster.executor is Executor.MP:
        return [{"node": node.name, "name": mp_container_name(cfg, node), "stop_timeout_s": SERVER_STOP_S}]
    if node is cfg.head:
        return [
            {"node": node.name, "name": head_container_name(cfg), "stop_timeout_s": RAY_STOP_S},
            {"node": node.name, "name": vllm_container_name(cfg), "stop_timeout_s": SERVER_STOP_S},
        ]
    return [{"node": node.name, "name": worker_container_name(cfg), "stop_timeout_s": RAY_STOP_S}]


def cluster_order(cfg: StackConfig) -> list[dict[str, Any]]:
    """A cluster restart's start order (stopped in reverse): ray: the Ray head, the Ray workers, the
    server; mp: the headless ranks, then the head's rank (the server)."""
    if cfg.cluster.executor is Executor.MP:
        ranks = ranked_nodes(cfg)
        return [c for node in [*ranks[1:], ranks[0]] for c in node_containers(cfg, node)]
    head = node_containers(cfg, cfg.head)
    workers = [c for node in cfg.workers for c in node_containers(cfg, node)]
    return [head[0], *workers, head[1]]


def health_config(
    cfg: StackConfig, node: NodeConfig, need_bytes: Mapping[str, int | None] | None = None
) -> str:
    """QWEN35_HEALTH_CONFIG for the health program on `node` (the watchdog on the head, an agent
    elsewhere); `need_bytes`: each node's memory need (`node_need_bytes`), None where none is known."""
    h = cfg.health
    needs = need_bytes or {}
    dashboard = None
    if cfg.cluster.executor is Executor.RAY:
        dashboard = f"http://{dashboard_host(cfg)}:{cfg.ray.dashboard_port}"
    server = {"node": cfg.head.name, "name": vllm_container_name(cfg), "stop_timeout_s": SERVER_STOP_S}
    body = {
        "mode": h.mode.value,
        "node": node.name,
        "prefix": cfg.containers.name_prefix,
        "interval_s": h.interval_s,
        "deadline_s": h.deadline_s,
        "completion_every": h.completion_every,
        "completion_deadline_s": h.completion_deadline_s,
        "idle_completion_deadline_s": h.idle_completion_deadline_s,
        "failures": h.failures,
        "stall_s": h.stall_s,
        "startup_s": h.startup_s,
        "ready_s": h.ready_s,
        "memory_wait_s": h.memory_wait_s,
        "memory_floor_bytes": int(round(h.memory_floor_gb * GB)) or None,
        "memory_floor_s": h.memory_floor_s,
        "guard_stop_s": h.guard_stop_s,
        "gpu_memory_utilization": cfg.serve.gpu_memory_utilization,
        "max_restarts": h.max_restarts,
        "window_s": h.window_s,
        "port": h.port,
        "metrics_host": metrics_host(cfg),
        "agent_port": h.agent_port,
        "vllm_url": local_url(cfg.serve),
        "model": cfg.serve.model_name,
        "executor": cfg.cluster.executor.value,
        "ray_dashboard": dashboard,
        "head": cfg.head.name,
        "server": server,
        "cluster": cluster_order(cfg),
        "nodes": [
            {
                "name": n.name,
                "fabric_ip": n.fabric_ip,
                "agent": None if n is cfg.head else f"{n.fabric_ip}:{h.agent_port}",
                "containers": [c["name"] for c in node_containers(cfg, n)],
                "need_bytes": needs.get(n.name),
            }
            for n in cfg.nodes
        ],
    }
    return json.dumps(body, sort_keys=True, separators=(",", ":"))


def _spec(
    cfg: StackConfig, node: NodeConfig, *, name: str, role: str, image_id: ImageId, program: str,
    config_json: Any, secret_env: dict[str, str], extra_mounts: tuple[Mount, ...],
) -> ContainerSpec:  # fmt: skip
    if cfg.health.mode is CheckMode.OFF:
        raise ValueError(f"health.mode is off: no {role} container is declared")
    env = {health_wire.CONFIG_ENV: config_json}
    mounts = [Mount(node.docker_socket, health_wire.DOCKER_SOCKET_MOUNT), *extra_mounts]
    if node.meminfo_path:
        env[health_wire.MEMINFO_ENV] = health_wire.MEMINFO_MOUNT
        mounts.append(Mount(node.meminfo_path, health_wire.MEMINFO_MOUNT, read_only=True))
    return ContainerSpec(
        name=name,
        node=node.name,
        role=role,
        image=image_id,
        command=tuple(program_argv(program, [])),
        env=env,
        secret_env=secret_env,
        # The per-stack secret as a file in the container, never in its environment (health_wire).
        secret_files={health_wire.SECRET_FILE: "health_secret"},
        # health.kernel_log: the kernel's log, read-only by use (the programs only read it), and the
        # capability reading it needs where kernel.dmesg_restrict is 1 (Ubuntu's, DGX OS's default).
        devices=(health_wire.DEFAULT_KERNEL_LOG,) if cfg.health.kernel_log else (),
        ulimits=(),
        capabilities=("CAP_SYSLOG",) if cfg.health.kernel_log else (),
        privileged=False,
        mounts=tuple(mounts),
        # Always back after a reboot, whatever containers.restart says: it is what decides whether the
        # others come back (a spent budget keeps them stopped).
        restart=RestartPolicy.UNLESS_STOPPED,
        init=True,
        network_mode="host",
        ipc_mode="private",
        labels={"qwen35.role": role, "qwen35.node": node.name},
        stop_grace_s=10,
    )


def watchdog_container_spec(cfg: StackConfig, image_id: ImageId, config_json: Any) -> ContainerSpec:
    """The watchdog on the head: its config, the secret and API key by name, the head's Docker socket,
    the state volume (the budget outlives the container) and, in the lab, a crafted meminfo."""
    return _spec(
        cfg,
        cfg.head,
        name=watchdog_container_name(cfg),
        role="watchdog",
        image_id=image_id,
        program="watchdog",
        config_json=config_json,
        secret_env={health_wire.API_KEY_ENV: "api_key"},
        extra_mounts=(Mount(health_volume_name(cfg), health_wire.STATE_DIR, volume=True),),
    )


def agent_container_spec(
    cfg: StackConfig, node: NodeConfig, image_id: ImageId, config_json: Any
) -> ContainerSpec:
    """The agent on `node` (not the head): its config, the secret by name, the node's Docker socket."""
    if node is cfg.head:
        raise ValueError(f"{node.name} is the head: the watchdog acts there itself, no agent runs")
    return _spec(
        cfg,
        node,
        name=agent_container_name(cfg),
        role="health-agent",
        image_id=image_id,
        program="health_agent",
        config_json=config_json,
        secret_env={},
        extra_mounts=(),
    )
