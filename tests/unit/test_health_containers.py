"""The watchdog's and the agents' container specs and config (components/health/containers.py)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest

from components.config import RestartPolicy, parse_stack_config
from components.health.containers import (
    agent_container_name,
    agent_container_spec,
    health_config,
    health_volume_name,
    node_need_bytes,
    watchdog_container_name,
    watchdog_container_spec,
)
from components.model_support.memory_fit import GB
from components.node_programs import FOLDER, health_wire, libraries, program_argv
from tests.support.program import config_from, dev_raw, mp_raw


def lab_cfg(**node_b):
    raw = dev_raw("lab")
    raw["nodes"][1].update(node_b)
    return parse_stack_config(raw)


def test_names_follow_the_prefix():
    cfg = config_from("dev", containers={"name_prefix": "x1"})
    assert (watchdog_container_name(cfg), agent_container_name(cfg), health_volume_name(cfg)) == (
        "x1-watchdog",
        "x1-health-agent",
        "x1-health",
    )


def test_the_watchdog_spec_has_its_socket_volume_and_secrets_by_name_and_no_privilege():
    cfg = config_from("dev", containers={"restart": "no", "privileged": True})
    spec = watchdog_container_spec(cfg, "sha256:abc", '{"mode":"enforce"}')
    assert spec.node == cfg.head.name and spec.role == "watchdog" and spec.labels["qwen35.role"] == "watchdog"
    assert spec.command == tuple(program_argv("watchdog", []))
    assert spec.env == {health_wire.CONFIG_ENV: '{"mode":"enforce"}'}
    # The health secret is a file written at creation, never the environment (`docker inspect`).
    assert spec.secret_env == {health_wire.API_KEY_ENV: "api_key"}
    assert spec.secret_files == {health_wire.SECRET_FILE: "health_secret"}
    assert [(m.source, m.target, m.volume) for m in spec.mounts] == [
        ("/var/run/docker.sock", health_wire.DOCKER_SOCKET_MOUNT, False),
        ("qwen35-health", health_wire.STATE_DIR, True),
    ]
    # Not containers.restart, not containers.privileged: the watchdog's own settings.
    assert spec.restart is RestartPolicy.UNLESS_STOPPED and not spec.privileged
    assert spec.capabilities == () and spec.devices == () and spec.gpus is None
    assert spec.network_mode == "host"


def test_the_agent_spec_has_the_node_s_socket_and_no_api_key():
    cfg = lab_cfg(docker_socket="/run/qwen35-lab/node-b/docker.sock", meminfo_path="/tmp/b.meminfo")
    spec = agent_container_spec(cfg, cfg.nodes[1], "sha256:abc", "{}")
    assert spec.node == "node-b" and spec.role == "health-agent"
    assert spec.secret_env == {} and spec.secret_files == {health_wire.SECRET_FILE: "health_secret"}
    assert spec.env[health_wire.MEMINFO_ENV] == health_wire.MEMINFO_MOUNT
    assert [(m.source, m.target, m.read_only) for m in spec.mounts] == [
        ("/run/qwen35-lab/node-b/docker.sock", health_wire.DOCKER_SOCKET_MOUNT, False),
        ("/tmp/b.meminfo", health_wire.MEMINFO_MOUNT, True),
    ]
    with pytest.raises(ValueError, match="is the head"):
        agent_container_spec(cfg, cfg.head, "sha256:abc", "{}")


@pytest.mark.parametrize("kernel_log", [False, True])
def test_health_kernel_log_gives_both_programs_the_kernel_s_log_and_nothing_else(kernel_log):
    cfg = config_from("dev", health={"kernel_log": kernel_log})
    for spec in (
        watchdog_container_spec(cfg, "sha256:abc", "{}"),
        agent_container_spec(cfg, cfg.nodes[1], "sha256:abc", "{}"),
    ):
        assert spec.devices == (("/dev/kmsg",) if kernel_log else ())
        assert spec.capabilities == (("CAP_SYSLOG",) if kernel_log else ()) and not spec.privileged


def test_no_spec_under_mode_off():
    cfg = config_from("dev", health={"mode": "off"})
    with pytest.raises(ValueError, match="off"):
        watchdog_container_spec(cfg, "sha256:abc", "{}")


def test_the_config_under_ray_orders_the_cluster_restart():
    cfg = config_from("dev")
    body = json.loads(health_config(cfg, cfg.head, {"spark-1": 5, "spark-2": None}))
    assert [(t["node"], t["name"]) for t in body["cluster"]] == [
        ("spark-1", "qwen35-ray-head"),
        ("spark-2", "qwen35-ray-worker"),
        ("spark-1", "qwen35-vllm"),
    ]
    assert body["server"] == {"node": "spark-1", "name": "qwen35-vllm", "stop_timeout_s": 120}
    assert [(n["name"], n["agent"], n["need_bytes"]) for n in body["nodes"]] == [
        ("spark-1", None, 5),
        ("spark-2", "192.168.200.13:29593", None),
    ]
    assert body["vllm_url"].startswith("http://") and body["ray_dashboard"].endswith(":8265")
    assert body["metrics_host"] == cfg.head.fabric_ip and "secret" not in json.dumps(body).lower()


def test_the_config_under_mp_starts_headless_ranks_before_the_head():
    cfg = parse_stack_config(mp_raw(nodes=3))
    body = json.loads(health_config(cfg, cfg.nodes[2]))
    assert [t["name"] for t in body["cluster"]] == ["qwen35-vllm-rank1", "qwen35-vllm-rank2", "qwen35-vllm"]
    assert body["node"] == "spark-3" and body["ray_dashboard"] is None


SUMMARY = {"per_rank": {"spark-1": {"weights_gb": 60.0}, "spark-2": {"weights_gb": 60.0}}, "request_gb": 1.5}


@pytest.mark.parametrize(
    ("summary", "node", "gpus", "expected"),
    [
        (SUMMARY, "spark-1", 1, int(65.5 * GB)),
        (SUMMARY, "spark-1", 2, 2 * int(65.5 * GB)),
        ({"per_rank": {"spark-1": {"weights_gb": 60.0}}, "request_gb": None}, "spark-1", 1, 66 * GB),
        ({"per_rank": {"spark-1": {"weights_gb": 60.0}}}, "spark-1", 1, 66 * GB),  # the flat floor
        (SUMMARY, "spark-9", 1, None),
        (None, "spark-1", 1, None),
        ({}, "spark-1", 1, None),
    ],
)
def test_node_need_bytes(summary, node, gpus, expected):
    assert node_need_bytes(summary, node, gpus) == expected


@pytest.mark.parametrize("program", ["watchdog", "health_agent"])
def test_the_programs_run_with_only_the_standard_library_and_refuse_a_missing_config(program, tmp_path):
    argv = program_argv(program, [], python=sys.executable)
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, env={}, cwd=tmp_path)
    assert done.returncode == health_wire.Exit.BAD_CONFIG, done.stdout + done.stderr
    off = subprocess.run(
        argv, capture_output=True, text=True, timeout=60, env={health_wire.CONFIG_ENV: '{"mode": "off"}'}
    )
    assert off.returncode == health_wire.Exit.MODE_OFF, off.stdout + off.stderr


def test_the_packed_watchdog_ships_its_parts_and_builds_itself_up_to_listening(tmp_path):
    """Every part of the watchdog (`watchdog_*.py`) travels in its one packed command, and under
    `-I -S` the program reads its config and its saved state, builds its World and its parts, and
    stops where it would listen (the port is held here): before any probe or Docker call."""
    assert {path.stem for path in FOLDER.glob("watchdog_*.py")} <= set(libraries("watchdog"))
    cfg = config_from("dev")
    (tmp_path / health_wire.STATE_FILE).write_text("not json")
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        raw = {**json.loads(health_config(cfg, cfg.head)), "metrics_host": "127.0.0.1", "port": port}
        env = {
            health_wire.CONFIG_ENV: json.dumps(raw),
            health_wire.SECRET_ENV: "a secret",
            "QWEN35_HEALTH_STATE_DIR": str(tmp_path),
        }
        argv = program_argv("watchdog", ["--once"], python=sys.executable)
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path)
    assert done.returncode == health_wire.Exit.CANNOT_LISTEN, done.stdout + done.stderr
    assert "state.json unreadable" in done.stdout and f"cannot listen on 127.0.0.1:{port}" in done.stdout


def test_an_agent_without_the_secret_does_not_serve(tmp_path):
    cfg = config_from("dev")
    argv = program_argv("health_agent", [], python=sys.executable)
    env = {health_wire.CONFIG_ENV: health_config(cfg, cfg.nodes[1])}
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == health_wire.Exit.NO_SECRET, done.stdout + done.stderr
