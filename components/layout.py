"""The deployment's layout from config alone: what each resource is given, the image every node holds
and where each keeps the checkpoint, the containers' names on each node, and the shapes of the
stack's outputs. Pure: no Pulumi resource is declared or imported here, so `status` reads the same
layout as the graph (`components/deployment/`) without the graph.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from components.answer_check.prompts import VERSION as ANSWERS_VERSION
from components.answer_check.prompts import set_digest
from components.answer_check.reference import read_reference
from components.config import (
    PROJECT_DIR,
    RAY_CLIENT_SERVER_PORT,
    RAY_DASHBOARD_AGENT_LISTEN_PORT,
    CheckMode,
    ConfigError,
    Executor,
    ImageConfig,
    ImageStrategy,
    NodeConfig,
    StackConfig,
)
from components.containers import CAPABILITIES, host_path, ulimits
from components.health.containers import (
    agent_container_name,
    health_volume_name,
    metrics_host,
    watchdog_container_name,
)
from components.image_build.programs import context_digest, context_rules
from components.mp_executor import mp_container_name, mp_serve_argv
from components.ray_cluster import ray_container_name
from components.vllm_server import local_url, serve_argv, vllm_container_name

# The model-support check's outputs that the stack exports (`model_support`).
MODEL_SUPPORT_OUTPUTS = (
    "verdict",
    "failed_stage",
    "vllm",
    "transformers",
    "architecture",
    "model_type",
    "quantization",
    "memory_fit",
    "serve_args",
    "cluster_layer",
)


# ServeBench's outputs that the stack exports (`serve_bench`).
SERVE_BENCH_OUTPUTS = (
    "figures",
    "verdict",
    "shortfalls",
    "causes",
    "nccl_network",
    "measured_at",
    "elapsed_s",
    "error",
)

# AnswerCheck's outputs that the stack exports (`answers`): all but the last accepted receipts it
# carries for its next run.
ANSWER_CHECK_OUTPUTS = (
    "verdict",
    "problems",
    "judged_against",
    "known_answers",
    "findings",
    "notes",
    "receipts",
    "version",
    "checked_at",
    "elapsed_s",
    "error",
)

# FabricCheck's outputs that the stack exports per node (`fabric`).
FABRIC_OUTPUTS = ("ib_hca", "gid_index", "gids", "mtu", "verdict", "problems", "throughput")


def node_container_names(config: StackConfig) -> dict[str, list[str]]:
    """The deployment's containers on each node, by name: its Ray container, and the server on the head
    (under executor mp: the node's one vLLM rank); then the watchdog on the head and an agent on every
    worker (none under `health.mode: off`)."""
    if config.cluster.executor is Executor.MP:
        names = {node.name: [mp_container_name(config, node)] for node in config.nodes}
    else:
        names = {
            node.name: [ray_container_name(config, node)]
            + ([vllm_container_name(config)] if node is config.head else [])
            for node in config.nodes
        }
    for node, health in health_container_names(config).items():
        names[node].append(health)
    return names


def health_container_names(config: StackConfig) -> dict[str, str]:
    """The health program's container on each node: the watchdog on the head, an agent elsewhere."""
    if config.health.mode is CheckMode.OFF:
        return {}
    return {
        node.name: watchdog_container_name(config) if node is config.head else agent_container_name(config)
        for node in config.nodes
    }


def health_output(config: StackConfig) -> dict[str, Any]:
    """The stack output `health`: the mode, the containers, and where the watchdog answers."""
    h = config.health
    if h.mode is CheckMode.OFF:
        return {"mode": h.mode.value, "watchdog": None, "agents": {}, "state_url": None, "volume": None}
    base = f"http://{metrics_host(config)}:{h.port}"
    return {
        "mode": h.mode.value,
        "watchdog": watchdog_container_name(config),
        "agents": {n.name: agent_container_name(config) for n in config.workers},
        "state_url": f"{base}/state",
        "volume": health_volume_name(config),
    }


def scrape_targets(config: StackConfig) -> list[dict[str, Any]]:
    """Prometheus file_sd targets: the watchdog's /metrics (not under `health.mode: off`), vLLM's own
    /metrics at the address clients use, and Ray's metrics export port on every node that sets it
    (Ray picks a random port otherwise, which no file can name)."""
    prefix = config.containers.name_prefix
    targets = []
    if config.health.mode is not CheckMode.OFF:
        targets.append(
            {
                "targets": [f"{metrics_host(config)}:{config.health.port}"],
                "labels": {"job": "qwen35-watchdog", "stack": prefix, "node": config.head.name},
            }
        )
    serve = config.serve
    host = config.head.host if serve.host in ("0.0.0.0", "::") else serve.host
    targets.append(
        {
            "targets": [f"{host}:{serve.port}"],
            "labels": {"job": "vllm", "stack": prefix, "node": config.head.name},
        }
    )
    if config.cluster.executor is Executor.RAY:
        for node in config.nodes:
            port = node.ray_ports.metrics_export_port
            if port:
                targets.append(
                    {
                        "targets": [f"{node.fabric_ip}:{port}"],
                        "labels": {"job": "ray", "stack": prefix, "node": node.name},
                    }
                )
    return targets


def stack_claim_inputs(cfg: StackConfig, node: NodeConfig) -> dict[str, Any]:
    """A node's StackClaim inputs from config (all but the node and the owner, which is the Pulumi
    project and stack): the container name prefix and the host ports the stack binds there."""
    return {"prefix": cfg.containers.name_prefix, "ports": claimed_ports(cfg, node)}


def claimed_ports(config: StackConfig, node: NodeConfig) -> list[list[int]]:
    """The host ports the stack binds on `node` (its containers', and the fabric probe's listener on
    the head), as sorted [low, high] ranges."""
    extra = health_ports(config, node) + probe_ports(config, node)
    if config.cluster.executor is Executor.MP:
        # No Ray: the head's API port and the master port its rank 0 listens on for the other ranks.
        served = [[config.serve.port] * 2, [config.cluster.master_port] * 2] if node is config.head else []
        return sorted(served + extra)
    rp = node.ray_ports
    single = [
        rp.node_manager_port,
        rp.object_manager_port,
        rp.metrics_export_port,
        rp.dashboard_agent_listen_port or RAY_DASHBOARD_AGENT_LISTEN_PORT,
        rp.dashboard_agent_grpc_port,
        rp.runtime_env_agent_port,
    ]
    if node is config.head:
        single += [config.ray.port, config.ray.dashboard_port, config.serve.port, RAY_CLIENT_SERVER_PORT]
    ranges = [[p, p] for p in single if p] + extra
    if rp.min_worker_port and rp.max_worker_port:
        ranges.append([rp.min_worker_port, rp.max_worker_port])
    return sorted(ranges)


def health_ports(config: StackConfig, node: NodeConfig) -> list[list[int]]:
    """The watchdog's port on the head, an agent's on every other node (none under health off)."""
    if config.health.mode is CheckMode.OFF:
        return []
    port = config.health.port if node is config.head else config.health.agent_port
    return [[port, port]]


def probe_ports(config: StackConfig, node: NodeConfig) -> list[list[int]]:
    """The head's `fabric.probe_port`, where each worker's FabricCheck probe reaches a short-lived
    listener, and then the node proof's group meets; none without a worker, or with neither the check
    nor the proof (nothing listens there)."""
    fabric = config.fabric
    if node is not config.head or not config.workers:
        return []
    if fabric.check is CheckMode.OFF and fabric.proof is CheckMode.OFF:
        return []
    return [[config.fabric.probe_port] * 2]


def fabric_check_inputs(cfg: StackConfig, node: NodeConfig, node_dict: dict[str, Any]) -> dict[str, Any]:
    """A node's FabricCheck inputs from config (all but the head's `reference`); `status` reads the
    same facts with the same inputs."""
    pin = cfg.hca_pin(node)
    return {
        "node": node_dict,
        "fabric_ip": node.fabric_ip,
        "socket_ifname": cfg.socket_ifname(node),
        "mode": cfg.fabric.check.value,
        "pin": list(pin) if pin is not None else None,
        "gid": cfg.fabric.gid,
        "mtu_expected": cfg.fabric.mtu,
        "sysfs_root": node.sysfs_root,
    }


def probe_input(cfg: StackConfig, head_dict: Mapping[str, Any]) -> dict[str, Any]:
    """A worker's FabricCheck `probe`: where the head listens for it, and the floor it is held to."""
    return {
        "head": dict(head_dict),
        "head_name": cfg.head.name,
        "host": cfg.head.fabric_ip,
        "port": cfg.fabric.probe_port,
        "min_gbps": cfg.fabric.min_gbps,
    }


# What picks NCCL's transport in a node's serving containers (of `containers.fabric_env`): the bench
# measures again when any changes on any node (a fabric fixed is a new speed).
NCCL_TRANSPORT_ENV = ("NCCL_IB_DISABLE", "NCCL_IB_HCA", "NCCL_IB_GID_INDEX", "NCCL_SOCKET_IFNAME")


def nccl_transport(env: Mapping[str, str]) -> dict[str, str]:
    """The part of a node's fabric environment that picks NCCL's transport (ServeBench's `nccl_env`)."""
    return {key: env[key] for key in NCCL_TRANSPORT_ENV if key in env}


# The node proof's outputs that the stack exports (`fabric.proof`).
NODE_PROOF_OUTPUTS = ("verdict", "backend", "busbw_gbs", "problems", "warnings", "results", "node_software")
# The node proof's sized all-reduce: NCCL's over the fabric, or gloo's over sockets (the lab, no GPU).
NODE_PROOF_SIZES = {True: (256 << 20, 20), False: (16 << 20, 5)}
# Each rank's bound, from its start to its report: importing torch and vLLM in the image, the GPU
# step, joining the group and the all-reduces.
NODE_PROOF_DEADLINE_S = 180.0
# With the GPU step: the memory every node must have available (MemAvailable: on unified memory the
# GPU's too) for the proof to run. Its footprint (torch and vLLM imported, a CUDA context, NCCL's
# buffers, the 256 MiB all-reduce) is about 4 GB; below this the serving containers hold the memory
# and the proof is not run (`skipped`), rather than compete with them.
NODE_PROOF_MIN_AVAILABLE_BYTES = 12 << 30


def node_proof_inputs(cfg: StackConfig) -> dict[str, Any]:
    """The node proof's inputs from config alone (the per-node image IDs and NCCL settings come from
    the graph): the group's address and port, the mode, the serving containers' runtime settings."""
    c = cfg.containers
    size, iterations = NODE_PROOF_SIZES[c.gpu_runtime]
    return {
        "master_addr": cfg.head.fabric_ip,
        # FabricCheck's probes are done when the proof starts: the head's claimed probe port is free.
        "port": cfg.fabric.probe_port,
        "mode": cfg.fabric.proof.value,
        "gpu": c.gpu_runtime,
        "run": {
            "devices": list(c.devices),
            "gpus": "all" if c.gpu_runtime else None,
            "privileged": c.privileged,
            # Privileged grants every capability already.
            "capabilities": [] if c.privileged else list(CAPABILITIES),
            "ulimits": [list(limit) for limit in ulimits(c.memlock_bytes)],
            "ipc": c.ipc,
            "shm_size_mb": c.shm_size_mb,
        },
        "container_prefix": c.name_prefix,
        "bytes_": size,
        "iterations": iterations,
        "deadline_s": NODE_PROOF_DEADLINE_S,
        "min_busbw_gbs": cfg.fabric.min_busbw_gbps,
        "min_available_bytes": NODE_PROOF_MIN_AVAILABLE_BYTES if c.gpu_runtime else None,
    }


def cluster_proof(cfg: StackConfig) -> dict[str, Any]:
    """The model-support check's `cluster` input: the Ray cluster layer to prove (every strategy: the
    Ray containers need Ray beside vLLM, at the version the stack needs), or, under executor mp, the
    note that no Ray runs (the check records that the proof was not run)."""
    if cfg.cluster.executor is Executor.MP:
        return {"executor": "mp"}
    return {"ray_version": cfg.image.ray_version, "stages": "ray,cluster,executor"}


def model_support_inputs(cfg: StackConfig, ref: str) -> dict[str, Any]:
    """The model-support check's inputs from config alone (the graph adds the node, the head's image
    ID and checkpoint, and the argv pinned to its revision): the image as configured (`ref`, the
    deployment's reference, for a build), the memory to fit, the mode and the cluster layer."""
    image = cfg.image
    return {
        "image": image.prebuilt if image.strategy is ImageStrategy.PREBUILT else ref,
        "memory": memory_inputs(cfg),
        "mode": image.model_check.value,
        "container_prefix": cfg.containers.name_prefix,
        "cluster": cluster_proof(cfg),
        "expect": image.model_check_expects.model_dump() if image.model_check_expects else None,
    }


def memory_inputs(cfg: StackConfig) -> dict[str, Any]:
    """What the memory-fit preflight needs from config: each node's memory and GPUs, the parallelism,
    and the serving options that change what a rank holds (components/model_support/memory_fit.py)."""
    serve = cfg.serve
    return {
        "nodes": [{"name": n.name, "memory_gb": n.memory_gb, "gpus": n.gpus} for n in cfg.nodes],
        "tensor_parallel_size": serve.tensor_parallel_size,
        "pipeline_parallel_size": serve.pipeline_parallel_size,
        "gpu_memory_utilization": serve.gpu_memory_utilization,
        "max_model_len": serve.max_model_len,
        "kv_cache_dtype": serve.kv_cache_dtype,
        "speculative_tokens": serve.speculative.num_speculative_tokens if serve.speculative else 0,
        "speculative_method": serve.speculative.method if serve.speculative else None,
        "language_model_only": serve.language_model_only,
    }


def answer_check_inputs(cfg: StackConfig, project_dir: Path = PROJECT_DIR) -> dict[str, Any]:
    """AnswerCheck's inputs from config alone: where the server answers, the mode, the settings, the
    prompt set's version and digest, the node set, and the reference's content (`answers.reference`,
    read now: a ConfigError naming the key when it cannot be used)."""
    answers = cfg.answers
    reference = None
    if answers.reference is not None:
        reference, problems = read_reference(answers.reference, project_dir)
        if problems:
            raise ConfigError([f"answers.reference: {p}" for p in problems])
    return {
        "url": local_url(cfg.serve),
        "model": cfg.serve.model_name,
        "mode": answers.mode.value,
        "settings": answers.settings(),
        "prompt_set": {"version": ANSWERS_VERSION, "digest": set_digest(answers.long_prompt_tokens)},
        "reference": reference,
        "nodes": [n.name for n in cfg.nodes],
    }


def readiness_gate_inputs(cfg: StackConfig) -> dict[str, Any]:
    """ReadinessGate's inputs from config alone (the graph adds the node, the server's and the
    watched containers' IDs, what is deployed, where the ranks log, and what NCCL is given)."""
    mp = cfg.cluster.executor is Executor.MP
    return {
        "url": local_url(cfg.serve),
        "model": cfg.serve.model_name,
        "expect_nodes": len(cfg.nodes),
        "expect_gpus": sum(n.gpus for n in cfg.nodes),
        # Ray node address -> name, so a gate that times out names the node that never joined.
        "expect_node_ips": None if mp else {n.name: n.fabric_ip for n in cfg.nodes},
        "deadline_s": cfg.serve.ready_timeout,
        "ray_container": None if mp else ray_container_name(cfg, cfg.head),
        "log_container": vllm_container_name(cfg),
        "transport_mode": cfg.fabric.proof.value,
    }


def gate_watched(cfg: StackConfig) -> dict[str, tuple[str, str]]:
    """What the gate watches, `node/container` -> (node, "ray" or "server"): under executor mp each
    node's rank; under Ray every node's Ray container and the server on the head. The graph gives
    each one's container ID, so a recreated container makes the gate probe again."""
    if cfg.cluster.executor is Executor.MP:
        return {f"{n.name}/{mp_container_name(cfg, n)}": (n.name, "server") for n in cfg.nodes}
    return {
        **{f"{n.name}/{ray_container_name(cfg, n)}": (n.name, "ray") for n in cfg.nodes},
        f"{cfg.head.name}/{vllm_container_name(cfg)}": (cfg.head.name, "server"),
    }


def serving_log_containers(cfg: StackConfig) -> dict[str, str]:
    """Node -> the container where the gate reads what the serving ranks logged about their
    transport: under executor mp each node's rank; under Ray the server on the head, where Ray
    forwards every rank's lines."""
    if cfg.cluster.executor is Executor.MP:
        return {n.name: mp_container_name(cfg, n) for n in cfg.nodes}
    return {cfg.head.name: vllm_container_name(cfg)}


def deployed(cfg: StackConfig, ref: str) -> dict[str, Any]:
    """What the gate records as served once it passes, before the checkpoint's commit is known (the
    graph adds it with `deployed_revision`): the image reference with the config line that selects it
    again (the rollback hint of a later failure)."""
    if cfg.image.strategy is ImageStrategy.PREBUILT:
        image_line = f"image.prebuilt: {ref}"
    else:  # a build's tag is a hash of its inputs: going back is the image section that built it
        image_line = f"image (the {cfg.image.strategy.value} inputs that built {ref})"
    return {"image": ref, "revision": None, "lines": {"image": image_line}}


def deployed_revision(record: Mapping[str, Any], revision: str) -> dict[str, Any]:
    """`deployed`'s record with the checkpoint's commit, and the config line that pins it."""
    return {
        **record,
        "revision": revision,
        "lines": {**record["lines"], "revision": f"model.revision: {revision}"},
    }


def server_argv(cfg: StackConfig) -> list[str]:
    """The server's argument list, as its container runs it before `--revision` (the graph pins the
    commit): under executor mp the head's rank 0 (each headless rank's is `rank_argvs`)."""
    return mp_serve_argv(cfg, cfg.head) if cfg.cluster.executor is Executor.MP else serve_argv(cfg.serve)


def rank_argvs(cfg: StackConfig) -> dict[str, list[str]] | None:
    """Under executor mp, each headless rank's argument list by node (its node rank and `--headless`
    differ from the head's); None under Ray, where one server runs, and on one node."""
    if cfg.cluster.executor is not Executor.MP or not cfg.workers:
        return None
    return {n.name: mp_serve_argv(cfg, n) for n in cfg.workers}


def serve_bench_inputs(cfg: StackConfig) -> dict[str, Any]:
    """ServeBench's inputs from config alone (the graph adds the node, the image IDs, the server's
    argv, each node's NCCL settings and FabricCheck's outputs)."""
    return {
        "url": local_url(cfg.serve),
        "model": cfg.serve.model_name,
        "mode": cfg.bench.mode.value,
        "settings": cfg.bench.settings(),
        "floors": cfg.bench.floors(),
        "nodes": [n.name for n in cfg.nodes],
        "log_container": vllm_container_name(cfg),
    }


# The build context of the built image (image.strategy hybrid or graft).
PATCH_DIR = PROJECT_DIR / "patches"
# The behaviour proofs (prove_model.py) and the cluster-layer proofs (prove_cluster.py) a build runs;
# without torch (image.smoke false: the lab's stand-ins) only those that need no torch.
BEHAVIOUR_PROOFS = "config,construct,load"
CLUSTER_PROOFS = "ray,cluster,executor"
CLUSTER_PROOFS_WITHOUT_TORCH = "ray,cluster"


def build_args(image: ImageConfig) -> dict[str, str]:
    """The Dockerfile's build args, from validated config (each strategy passes what its file reads)."""
    if image.strategy is ImageStrategy.GRAFT:
        return {
            "BASE_IMAGE": image.base_ref,
            "DONOR_IMAGE": image.donor_ref,
            "PIP_ARGS": " ".join(image.pip_args),
            # The stack's own Ray spec, proven in the build beside the base's exact version.
            "RAY_VERSION": image.ray_version or "",
            "CLUSTER_PROOFS": CLUSTER_PROOFS if image.smoke else CLUSTER_PROOFS_WITHOUT_TORCH,
            "PROOFS": BEHAVIOUR_PROOFS if image.smoke else "",
            "SMOKE": "1" if image.smoke else "0",
        }
    return {
        "BASE_IMAGE": image.base_ref,
        "DONOR_IMAGE": image.donor_ref,
        "BASE_VLLM_DIR": image.base_vllm_dir,
        "DONOR_VLLM_DIR": image.donor_vllm_dir,
        "TRANSFORMERS_SPEC": f"transformers{image.transformers}",
        "PIP_ARGS": " ".join(image.pip_args),
        # The steps that need torch: the behaviour proofs and the import smoke (both off only in the lab).
        "PROOFS": BEHAVIOUR_PROOFS if image.smoke else "",
        "SMOKE": "1" if image.smoke else "0",
    }


def content_tag(context: Path, args: dict[str, str], platform: str, digest: str | None = None) -> str:
    """A tag that changes exactly when a build input changes: the files the build sends (`digest`,
    their context_digest, when already made), build args, platform."""
    files = digest or context_digest(context, context_rules(args))
    inputs = json.dumps({"context": files, "args": args, "platform": platform}, sort_keys=True)
    return "h-" + hashlib.sha256(inputs.encode()).hexdigest()[:16]


def image_ref(image: ImageConfig, context: Path = PATCH_DIR) -> str:
    """The deployment image's reference on every node: the prebuilt image's `name:tag` (strategy
    prebuilt), or the built image's `name:tag` (the content hash unless pinned)."""
    if image.strategy is ImageStrategy.PREBUILT:
        return image.prebuilt_ref.tagged
    return built_ref(image, context)


def built_ref(image: ImageConfig, context: Path = PATCH_DIR, digest: str | None = None) -> str:
    """The build's reference (hybrid or graft): `name:tag` (the content hash unless pinned)."""
    return f"{image.name}:{image.tag or content_tag(context, build_args(image), image.platform, digest)}"


def node_cache_dir(config: StackConfig, name: str) -> str:
    """The node's HF cache dir as an absolute host path (what its containers mount as HF_HOME)."""
    node = next(n for n in config.nodes if n.name == name)
    return host_path(config.hf_cache(node), config.node_user(node))
