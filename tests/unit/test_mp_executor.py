"""Executor mp as pure specs: one `vllm serve` per node, rank 0 on the head, no Ray."""

from __future__ import annotations

import hashlib
import json

import pytest

from components.config import parse_stack_config
from components.containers import COMPILE_CACHE, COMPILE_CACHE_ENV, fabric_env
from components.mp_executor import (
    mp_container_name,
    mp_container_spec,
    mp_serve_argv,
    rank_identity,
    ranked_nodes,
    world_digest,
)
from components.vllm_server import API_KEY_ENV, serve_argv
from tests.support.program import mp_raw

IMAGE_ID = "sha256:" + "e" * 64
KEY = "a-world-key-drawn-once"


def mp_config(nodes: int = 2, **cluster):
    return parse_stack_config(mp_raw(nodes, **cluster))


# (nodes, node index, the multi-node flags after the head's own command line)
MULTI_NODE_FLAGS = [
    (
        2,
        0,
        ["--nnodes", "2", "--node-rank", "0", "--master-addr", "192.168.200.12", "--master-port", "29501"],
    ),
    (
        2,
        1,
        [
            "--nnodes",
            "2",
            "--node-rank",
            "1",
            "--master-addr",
            "192.168.200.12",
            "--master-port",
            "29501",
            "--headless",
        ],
    ),
    (
        3,
        0,
        ["--nnodes", "3", "--node-rank", "0", "--master-addr", "192.168.200.12", "--master-port", "29501"],
    ),
    (
        3,
        2,
        [
            "--nnodes",
            "3",
            "--node-rank",
            "2",
            "--master-addr",
            "192.168.200.12",
            "--master-port",
            "29501",
            "--headless",
        ],
    ),
]


@pytest.mark.parametrize(("nodes", "index", "flags"), MULTI_NODE_FLAGS)
def test_each_rank_runs_the_head_s_command_line_plus_its_multi_node_flags(nodes, index, flags):
    cfg = mp_config(nodes)
    base = serve_argv(cfg.serve, backend="mp")
    argv = mp_serve_argv(cfg, cfg.nodes[index])
    assert argv == base + flags
    assert argv[argv.index("--distributed-executor-backend") + 1] == "mp"
    assert argv[argv.index("--tensor-parallel-size") + 1] == str(nodes)


def test_the_master_port_is_the_configured_one():
    cfg = mp_config(2, master_port=29777)
    for node in cfg.nodes:
        argv = mp_serve_argv(cfg, node)
        assert argv[argv.index("--master-port") + 1] == "29777"


def test_the_ray_backend_is_still_the_default_of_serve_argv():
    cfg = parse_stack_config(mp_raw())
    argv = serve_argv(cfg.serve)
    assert argv[argv.index("--distributed-executor-backend") + 1] == "ray"


def test_ranks_follow_the_head_then_the_workers_in_config_order():
    raw = mp_raw(3)
    # The head need not be listed first: it is still rank 0.
    raw["nodes"][0].pop("role")
    raw["nodes"][2]["role"] = "head"
    cfg = parse_stack_config(raw)
    assert [n.name for n in ranked_nodes(cfg)] == ["spark-3", "spark-1", "spark-2"]
    assert [mp_container_name(cfg, n) for n in cfg.nodes] == [
        "qwen35-vllm-rank1",
        "qwen35-vllm-rank2",
        "qwen35-vllm",
    ]
    head_argv = mp_serve_argv(cfg, cfg.head)
    assert head_argv[head_argv.index("--master-addr") + 1] == "192.168.200.14"
    assert "--headless" not in head_argv


def test_container_names_carry_the_stack_s_prefix():
    raw = mp_raw(3)
    raw["containers"] = {**raw.get("containers", {}), "name_prefix": "blue"}
    cfg = parse_stack_config(raw)
    assert [mp_container_name(cfg, n) for n in cfg.nodes] == [
        "blue-vllm",
        "blue-vllm-rank1",
        "blue-vllm-rank2",
    ]


def test_each_container_has_its_node_s_fabric_env_and_no_ray_mount_or_address():
    cfg = mp_config(3)
    for node in cfg.nodes:
        spec = mp_container_spec(cfg, node, IMAGE_ID)
        assert spec.node == node.name and spec.image == IMAGE_ID
        assert spec.env == {**fabric_env(cfg, node), **COMPILE_CACHE_ENV}
        assert spec.env["VLLM_HOST_IP"] == node.fabric_ip
        assert "RAY_ADDRESS" not in spec.env
        assert [m.target for m in spec.mounts] == ["/root/.cache/huggingface", COMPILE_CACHE]
        assert spec.command == tuple(mp_serve_argv(cfg, node))
        assert spec.network_mode == "host" and spec.ipc_mode == "host" and spec.pid_mode is None


def test_only_the_head_gets_the_api_key():
    cfg = mp_config(2)
    head, worker = (mp_container_spec(cfg, n, IMAGE_ID) for n in cfg.nodes)
    assert head.secret_env == {"HF_TOKEN": "hf_token", API_KEY_ENV: "api_key"} and head.role == "vllm"
    assert worker.secret_env == {"HF_TOKEN": "hf_token"} and worker.role == "vllm-headless"


def identities(cfg, image_ids=None, secrets=None):
    """Every rank's identity, with each node's image ID (default IMAGE_ID) and the head's secrets."""
    image_ids = image_ids or {}
    out = []
    for node in ranked_nodes(cfg):
        spec = mp_container_spec(cfg, node, image_ids.get(node.name, IMAGE_ID))
        out.append(
            rank_identity(
                spec, spec.image, spec.env_list(), spec.command, (secrets or {}) if node is cfg.head else {}
            )
        )
    return out


def test_the_world_digest_follows_any_rank_s_container():
    cfg = mp_config(3)
    base = world_digest(identities(cfg), KEY)
    assert base == world_digest(identities(cfg), KEY) and base.startswith("hmac-sha256:")
    assert world_digest(identities(cfg, {"spark-3": "sha256:" + "f" * 64}), KEY) != base
    changed = identities(cfg)
    changed[2]["env"] = [*changed[2]["env"], "NCCL_IB_HCA=mlx5_1"]
    assert world_digest(changed, KEY) != base
    assert world_digest(identities(mp_config(3, master_port=29600)), KEY) != base


def test_the_world_covers_the_secrets_under_a_key_a_node_never_holds():
    cfg = mp_config(2)
    api_key = "sk-a-key-value-that-must-not-show"
    ids = identities(cfg, secrets={API_KEY_ENV: api_key})
    digest = world_digest(ids, KEY)
    assert api_key not in digest
    assert digest != world_digest(identities(cfg, secrets={API_KEY_ENV: api_key + "2"}), KEY)
    # Keyed: without the stack's world key the digest cannot be recomputed from a guess of the API
    # key (every other input is readable on a node), and another key gives another digest.
    unkeyed = "sha256:" + hashlib.sha256(json.dumps(ids, sort_keys=True, default=str).encode()).hexdigest()
    assert digest != unkeyed and world_digest(ids, KEY + "x") != digest
    with pytest.raises(ValueError, match="world key"):
        world_digest(ids, "")
