"""Declared Container inputs → `docker run` argv: a table of inputs and the flags they must give."""

from __future__ import annotations

import pytest

from tests.support.declared import SECRET_SIG, SIG_KEY, docker_run_argv, plain
from tests.support.program import run_program, stack_config

BASE = {"image": "sha256:" + "1" * 64, "name": "c"}


def secret(value):
    return {SIG_KEY: SECRET_SIG, "value": value}


@pytest.mark.parametrize(
    ("extra", "flags"),
    [
        ({"networkMode": "host"}, ["--network", "host"]),
        ({"ipcMode": "host"}, ["--ipc", "host"]),
        ({"pidMode": "host"}, ["--pid", "host"]),
        ({"shmSize": 512.0}, ["--shm-size", "512m"]),
        ({"init": True}, ["--init"]),
        ({"privileged": True}, ["--privileged"]),
        ({"envs": ["A=1", "B=two words"]}, ["--env", "A=1", "--env", "B=two words"]),
        ({"envs": secret(["K=s3cret"])}, ["--env", "K=s3cret"]),
        ({"ulimits": [{"name": "memlock", "soft": -1.0, "hard": -1.0}]}, ["--ulimit", "memlock=-1:-1"]),
        ({"capabilities": {"adds": ["IPC_LOCK"]}}, ["--cap-add", "IPC_LOCK"]),
        ({"capabilities": {"drops": ["NET_RAW"]}}, ["--cap-drop", "NET_RAW"]),
        ({"restart": "unless-stopped"}, ["--restart", "unless-stopped"]),
        ({"restart": "on-failure", "maxRetryCount": 5.0}, ["--restart", "on-failure:5"]),
        ({"restart": "no", "maxRetryCount": 0.0}, ["--restart", "no"]),
        ({"volumes": [{"volumeName": "v", "containerPath": "/tmp/ray"}]}, ["--volume", "v:/tmp/ray"]),
        (
            {"volumes": [{"hostPath": "/h", "containerPath": "/c", "readOnly": True}]},
            ["--volume", "/h:/c:ro"],
        ),
        (
            {"mounts": [{"type": "bind", "source": "/s", "target": "/t", "readOnly": True}]},
            ["--mount", "type=bind,source=/s,target=/t,readonly"],
        ),
        ({"labels": [{"label": "qwen35.role", "value": "vllm"}]}, ["--label", "qwen35.role=vllm"]),
        (
            {"devices": [{"hostPath": "/dev/fuse", "containerPath": "/dev/fuse", "permissions": "rwm"}]},
            ["--device", "/dev/fuse:/dev/fuse:rwm"],
        ),
        ({"stopTimeout": 30.0}, ["--stop-timeout", "30"]),
    ],
)
def test_each_input_becomes_its_flag(extra, flags):
    argv, dropped = docker_run_argv({**BASE, **extra})
    assert argv[:3] == ["docker", "run", "--detach"]
    joined = argv[3:-1]
    assert any(joined[i : i + len(flags)] == flags for i in range(len(joined))), argv
    assert dropped == []


def test_image_entrypoint_and_command_come_last_in_order():
    argv, _ = docker_run_argv({**BASE, "entrypoints": ["vllm", "serve"], "command": ["m", "--port", "1"]})
    assert argv[-7:] == ["--entrypoint", "vllm", BASE["image"], "serve", "m", "--port", "1"]


@pytest.mark.parametrize(
    ("extra", "reason"),
    [
        ({"gpus": "all"}, "no GPU"),
        (
            {
                "devices": [
                    {"hostPath": "/dev/infiniband/uverbs0", "containerPath": "/dev/infiniband/uverbs0"}
                ]
            },
            "InfiniBand",
        ),
    ],
)
def test_what_the_lab_cannot_have_is_dropped_and_said(extra, reason):
    argv, dropped = docker_run_argv({**BASE, **extra})
    assert len(dropped) == 1 and reason in dropped[0]
    assert "--gpus" not in argv and "--device" not in argv


@pytest.mark.parametrize("key", ["mustRun", "destroyGraceSeconds", "logs", "attach"])
def test_provider_only_inputs_leave_no_flag(key):
    argv, dropped = docker_run_argv({**BASE, key: True})
    assert argv == ["docker", "run", "--detach", "--name", "c", BASE["image"]]
    assert dropped == []


def test_an_unknown_input_is_an_error_not_a_silent_loss():
    with pytest.raises(ValueError, match="'healthcheck'"):
        docker_run_argv({**BASE, "healthcheck": {"tests": ["CMD", "true"]}})


def test_no_image_is_an_error():
    with pytest.raises(ValueError, match="no image"):
        docker_run_argv({"name": "c"})


def test_plain_unwraps_nested_secrets_and_whole_floats():
    assert plain({"a": secret({"b": secret(2.0)}), "c": [1.5, 3.0]}) == {"a": {"b": 2}, "c": [1.5, 3]}


def test_every_container_the_lab_stack_declares_translates():
    run = run_program(stack_config("lab"), stack="lab", secrets={"api_key": "k"})
    containers = run.by_type("docker:index/container:Container")
    assert {c.name for c in containers} >= {"qwen35-ray-head", "qwen35-ray-worker-node-b", "qwen35-vllm"}
    for container in containers:
        argv, dropped = docker_run_argv(container.inputs)
        assert dropped == [], f"{container.name}: the lab stack declares what the lab lacks: {dropped}"
        assert "--network" in argv and argv[argv.index("--network") + 1] == "host"


def test_a_ulimit_above_what_the_node_can_grant_is_dropped_and_said():
    limits = [{"name": "memlock", "soft": -1.0, "hard": -1.0}, {"name": "stack", "soft": 64.0, "hard": 64.0}]
    argv, dropped = docker_run_argv({**BASE, "ulimits": limits}, {"memlock": 8388608, "stack": -1})
    assert "memlock=-1:-1" not in argv and argv[5:7] == ["--ulimit", "stack=64:64"]
    assert len(dropped) == 1 and "memlock" in dropped[0] and "8388608" in dropped[0]
    argv, dropped = docker_run_argv({**BASE, "ulimits": limits}, {"memlock": -1})
    assert "memlock=-1:-1" in argv and dropped == []
    _, dropped = docker_run_argv(
        {**BASE, "ulimits": [{"name": "nofile", "soft": 10, "hard": 30000}]}, {"nofile": 20000}
    )
    assert "nofile" in dropped[0]
