"""vLLM's own multi-node executor (`cluster.executor: mp`) as pure container specs: no Ray anywhere.

Every node runs one `vllm serve` with the same command line and its own `--node-rank`: rank 0 on the
head serves the API and listens on `--master-addr:--master-port` (the head's fabric address); the
other ranks run `--headless` (no API server) and dial it. vLLM gives every node the same number of
local ranks (TP×PP / nnodes), which the config checks (components/config/cross_checks.py, `mp_problems`).

The ranks of one world live and die together: a rank replaced alone would find the others still in
the old, broken world (NCCL has no way to take a member back). So every rank's environment carries
WORLD_ENV, a digest over every rank's container as it runs (`world_digest`): whatever replaces one
rank changes that value in all of them, and the engine replaces every rank (the headless ones first,
as they were created; then the head).
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import json
from collections.abc import Mapping, Sequence

from components.config import NodeConfig, StackConfig
from components.containers import ContainerSpec, ImageId, NodeFabric, fabric_env, node_container_spec
from components.vllm_server import API_KEY_ENV, serve_argv, vllm_container_name


def ranked_nodes(config: StackConfig) -> list[NodeConfig]:
    """The nodes in rank order: the head is rank 0, the workers follow in config order."""
    return [config.head, *config.workers]


def node_rank(config: StackConfig, node: NodeConfig) -> int:
    return next(i for i, n in enumerate(ranked_nodes(config)) if n is node)


def mp_container_name(config: StackConfig, node: NodeConfig) -> str:
    """`<prefix>-vllm` on the head (as the Ray graph's server), `<prefix>-vllm-rank<i>` elsewhere."""
    rank = node_rank(config, node)
    return vllm_container_name(config) if rank == 0 else f"{vllm_container_name(config)}-rank{rank}"


def mp_serve_argv(config: StackConfig, node: NodeConfig) -> list[str]:
    """`vllm serve …` for `node`'s rank: the head's flags plus the multi-node ones; headless off the head."""
    rank = node_rank(config, node)
    argv = serve_argv(config.serve, backend="mp") + [
        "--nnodes", str(len(config.nodes)),
        "--node-rank", str(rank),
        "--master-addr", config.head.fabric_ip,
        "--master-port", str(config.cluster.master_port),
    ]  # fmt: skip
    return argv + (["--headless"] if rank else [])


def cpu_env(config: StackConfig, node: NodeConfig) -> dict[str, str]:
    """vLLM's CPU build's variables for `node`'s rank (serve.cpu; none on a Spark stack)."""
    return config.serve.cpu.env(node.name) if config.serve.cpu is not None else {}


def mp_container_spec(
    config: StackConfig, node: NodeConfig, image_id: ImageId, fabric: NodeFabric | None = None
) -> ContainerSpec:
    """The one container on `node` under executor mp, running `image_id` (that node's own copy), with
    the NCCL settings `fabric` (its FabricCheck's; None: from config alone)."""
    head = node is config.head
    return node_container_spec(
        config,
        node,
        name=mp_container_name(config, node),
        role="vllm" if head else "vllm-headless",
        image_id=image_id,
        command=mp_serve_argv(config, node),
        env={**fabric_env(config, node, fabric), **cpu_env(config, node)},
        # Only the head answers requests: a headless rank has no API server and so no API key.
        secret_env={"HF_TOKEN": "hf_token", API_KEY_ENV: "api_key"} if head else {"HF_TOKEN": "hf_token"},
        # Let vLLM tear its process group down before it is killed (the other ranks then exit too).
        stop_grace_s=120,
    )


# The world's identity in every rank's environment (a variable vLLM does not read). An env value and
# not a label: the digest covers the secrets, and the environment is what the stack already keeps
# secret (state and preview show `[secret]`); a label would be shown in plain.
WORLD_ENV = "QWEN35_MP_WORLD"


def rank_identity(
    spec: ContainerSpec, image_id: str, env: Sequence[str], command: Sequence[str], secrets: Mapping[str, str]
) -> dict[str, object]:
    """What makes one rank's container what it is: its spec with the values known only at run time
    (its node's image ID, its environment from the FabricCheck, its final command) and its secret
    variables. Secret values are in it: it is only ever the input of `world_digest`'s keyed hash."""
    # (the spec's image is the Output itself: replaced before asdict copies the fields)
    fields = dataclasses.asdict(dataclasses.replace(spec, image=image_id))
    fields.update(env=list(env), command=list(command))
    fields["secrets"] = dict(sorted(secrets.items()))
    return fields


def world_digest(ranks: Sequence[Mapping[str, object]], key: str) -> str:
    """`hmac-sha256:` over every rank's identity (`rank_identity`), in rank order, keyed by the stack's
    world key (a secret drawn once, that never leaves the state). The digest is readable on every
    node (`docker inspect`) and covers the API key, which a headless node never holds: unkeyed, it
    would let that node test guesses of a weak key offline."""
    if not key:
        raise ValueError("the world digest needs the stack's world key")
    text = json.dumps(list(ranks), sort_keys=True, default=str)
    return "hmac-sha256:" + hmac.new(key.encode(), text.encode(), hashlib.sha256).hexdigest()
