"""`qwen35-spark:health` and the per-node health keys (components/config/health.py HealthConfig)."""

from __future__ import annotations

import pytest
import yaml

from components.config import CheckMode, ConfigError, parse_stack_config
from tests.support.program import dev_raw, mp_raw


def parse(health: dict | None = None, raw: dict | None = None, **node0):
    raw = raw or dev_raw()
    if health is not None:
        raw["health"] = health
    raw["nodes"][0].update(node0)
    return parse_stack_config(raw)


def problems(health: dict | None = None, raw: dict | None = None, **node0) -> list[str]:
    with pytest.raises(ConfigError) as err:
        parse(health, raw, **node0)
    return err.value.problems


def test_defaults():
    h = parse().health
    assert h.mode is CheckMode.ENFORCE and (h.interval_s, h.deadline_s, h.failures) == (10, 5, 3)
    assert (h.startup_s, h.ready_s, h.memory_wait_s) == (3600, 1800, 300)
    assert (h.max_restarts, h.window_s, h.port, h.agent_port) == (3, 3600, 29592, 29593)
    assert h.stall_s == 300
    assert (h.memory_floor_gb, h.memory_floor_s) == (2, 5)
    node = parse().nodes[0]
    assert node.docker_socket == "/var/run/docker.sock" and node.meminfo_path is None


def test_an_unquoted_off_from_yaml_is_mode_off():
    health = yaml.safe_load("mode: off")
    assert health == {"mode": False}
    assert parse(health).health.mode is CheckMode.OFF


@pytest.mark.parametrize(
    ("key", "value"), [("interval_s", 30), ("port", 3000), ("max_restarts", 5), ("metrics_host", "127.0.0.1")]
)
def test_under_off_every_other_key_is_refused_by_name(key, value):
    (problem,) = problems({"mode": "off", key: value})
    assert problem.startswith(f"health.{key}:") and "health.mode off" in problem


def test_under_off_the_node_health_keys_are_refused():
    (problem,) = problems({"mode": "off"}, meminfo_path="/tmp/m")
    assert problem.startswith("nodes.0.meminfo_path:")


@pytest.mark.parametrize(
    ("health", "field", "says"),
    [
        ({"interval_s": 0}, "health.interval_s", "greater than 0"),
        ({"interval_s": 5, "deadline_s": 5}, "health.deadline_s", "below health.interval_s"),
        ({"failures": 0}, "health.failures", "greater than or equal to 1"),
        ({"mode": "sometimes"}, "health.mode", "enforce"),
        ({"intervall_s": 3}, "health.intervall_s", "did you mean 'interval_s'"),
        ({"port": 29593}, "health.agent_port", "health.port too"),
        ({"metrics_host": "not a host!"}, "health.metrics_host", "neither an IP"),
        ({"stal_s": 600}, "health.stal_s", "did you mean 'stall_s'"),
        ({"interval_s": 30, "deadline_s": 5, "stall_s": 30}, "health.stall_s", "not above health.interval_s"),
        ({"stall_s": 0}, "health.stall_s", "greater than 0"),
        ({"memory_flor_gb": 4}, "health.memory_flor_gb", "did you mean 'memory_floor_gb'"),
        ({"memory_floor_gb": -1}, "health.memory_floor_gb", "greater than or equal to 0"),
        ({"memory_floor_s": 0}, "health.memory_floor_s", "greater than 0"),
    ],
)
def test_bad_values_name_the_field(health, field, says):
    found = problems(health)
    assert any(p.startswith(f"{field}:") and says in p for p in found), found


@pytest.mark.parametrize(
    ("health", "other"),
    [
        ({"port": 8000}, "serve.port"),
        ({"agent_port": 6379}, "ray.port"),
        ({"port": 8265}, "ray.dashboard_port"),
        ({"agent_port": 29590}, "fabric.probe_port"),
    ],
)
def test_ports_that_collide_name_both(health, other):
    found = problems(health)
    assert any(other in p and p.startswith("health.") for p in found), found


def test_under_mp_the_master_port_collides_too():
    raw = mp_raw()
    raw["health"] = {"port": raw.get("cluster", {}).get("master_port", 29501)}
    found = problems(raw=raw)
    assert any("cluster.master_port" in p for p in found), found


def test_a_lab_ray_worker_range_is_refused():
    raw = dev_raw("lab")
    raw["health"] = {"agent_port": 17250}
    found = problems(raw=raw)
    assert any("worker range 17200-17299" in p for p in found), found


@pytest.mark.parametrize(
    ("key", "value", "says"),
    [
        ("meminfo_path", "/proc/meminfo", "real nodes read /proc/meminfo"),
        ("meminfo_path", "relative/meminfo", "absolute path"),
        ("docker_socket", "docker.sock", "absolute path"),
        ("docker_socket", "/var/run/docker sock", "absolute path"),
    ],
)
def test_node_paths_are_checked(key, value, says):
    found = problems(**{key: value})
    assert any(p.startswith(f"nodes.0.{key}:") and says in p for p in found), found


def test_lab_keys_are_accepted():
    node = parse(docker_socket="/run/qwen35-lab/node-a/docker.sock", meminfo_path="/run/x/meminfo").nodes[0]
    assert node.meminfo_path == "/run/x/meminfo"


def test_containers_restart_always_is_refused_while_the_watchdog_acts():
    raw = dev_raw()
    raw["containers"] = {**raw.get("containers", {}), "restart": "always"}
    (problem,) = [p for p in problems({"mode": "enforce"}, raw) if p.startswith("containers.restart")]
    assert "unless-stopped" in problem and "health.mode" in problem
    raw = dev_raw()
    raw["containers"] = {**raw.get("containers", {}), "restart": "always"}
    assert parse({"mode": "off"}, raw).containers.restart.value == "always"


@pytest.mark.parametrize(("floor_gb", "floor_bytes"), [(None, 2 * 10**9), (4.5, 4_500_000_000), (0, None)])
def test_the_memory_floor_reaches_every_health_program_in_bytes(floor_gb, floor_bytes):
    import json

    from components.health.containers import health_config

    cfg = parse({} if floor_gb is None else {"memory_floor_gb": floor_gb, "memory_floor_s": 3})
    body = json.loads(health_config(cfg, cfg.nodes[1]))
    assert body["memory_floor_bytes"] == floor_bytes
    assert body["memory_floor_s"] == (5 if floor_gb is None else 3)
