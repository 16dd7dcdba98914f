"""The lab itself works: each SSH session lands on its own daemon, host keys are pinned, and a real
`docker save | ssh | docker load` runs between nodes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import lab
from lab.layout import data_dir, node_paths

pytestmark = pytest.mark.lab

EXPECTED = {
    "node-a": ("20.10.", "classic"),
    "node-b": ("20.10.", "classic"),
    "node-c": ("26.", "classic"),
    "node-d": ("26.", "containerd"),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_ssh_lands_on_the_nodes_own_daemon(lab_node, name):
    node = lab_node(name)
    version_prefix, store = EXPECTED[name]
    info = json.loads(lab.docker(node, "info", "--format", "{{json .}}").out)
    assert info["DockerRootDir"] == str(data_dir() / name)
    assert info["ServerVersion"].startswith(version_prefix)
    assert info["ServerVersion"] == node.engine
    driver_status = dict(tuple(pair) for pair in info.get("DriverStatus") or [])
    is_containerd = driver_status.get("driver-type", "").startswith("io.containerd.snapshotter")
    assert ("containerd" if is_containerd else "classic") == store == node.store
    env = lab.on_node(node, ["sh", "-c", 'echo "$DOCKER_HOST $LAB_NODE $HOME"']).out
    # its own home, as a separate machine has: not the startup files of the machine running the lab
    assert env == f"{node.docker_host} {name} {node_paths(name).home}"


def test_a_wrong_pinned_host_key_makes_ssh_fail(node_a, node_b, tmp_path):
    # node-b's key written under node-a's address: ssh to node-a must refuse, not warn and go on.
    lines = Path(node_a.known_hosts).read_text().splitlines()
    b_key = next(line for line in lines if line.startswith(f"[{node_b.host}]:"))
    wrong = tmp_path / "known_hosts"
    wrong.write_text(b_key.replace(f"[{node_b.host}]", f"[{node_a.host}]", 1) + "\n")
    impostor = lab.LabNode(**{**node_a.__dict__, "known_hosts": str(wrong)})
    result = lab.on_node(impostor, ["true"], check=False)
    assert result.returncode == 255
    assert "host key" in result.err.lower()


def test_an_unknown_host_is_refused(node_a, tmp_path):
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    stranger = lab.LabNode(**{**node_a.__dict__, "known_hosts": str(empty)})
    assert lab.on_node(stranger, ["true"], check=False).returncode == 255


def test_node_a_reaches_node_b_with_the_pinned_keys(node_a, node_b):
    hop = lab.ssh_argv(node_b, ["sh", "-c", 'echo "$LAB_NODE"'])
    assert lab.on_node(node_a, hop).out == "node-b"


@pytest.mark.parametrize("dest_name", ["node-b", "node-c", "node-d"])
def test_docker_save_ssh_load_between_nodes(lab_node, node_a, dest_name):
    dest = lab_node(dest_name)
    tag = "lab-busybox:1"
    lab.busybox_image(node_a, tag)
    lab.docker(dest, "image", "rm", "--force", tag, check=False)
    copy = lab.pipeline(["docker", "save", tag], lab.ssh_argv(dest, ["docker", "load"]))
    loaded = lab.on_node(node_a, copy, timeout=120)
    assert f"Loaded image: {tag}" in loaded.out
    ran = lab.docker(dest, "run", "--rm", "--network", "host", tag, "sh", "-c", "echo ok from $(hostname)")
    assert ran.out.startswith("ok from")
    layers_a = lab.docker(node_a, "image", "inspect", "--format", "{{json .RootFS.Layers}}", tag).out
    layers_dest = lab.docker(dest, "image", "inspect", "--format", "{{json .RootFS.Layers}}", tag).out
    assert json.loads(layers_a) == json.loads(layers_dest)


def test_node_config_is_the_nodeimage_node_dict(node_a):
    config = lab.node_config(node_a)
    assert config == {
        "host": "127.0.0.2",
        "port": 2222,
        "user": "root",
        "identity_file": node_a.identity_file,
        "known_hosts": node_a.known_hosts,
        "fabric_host": "127.0.0.2",
    }


def test_debian_image_has_python(node_a):
    lab.debian_image(node_a)
    ran = lab.docker(
        node_a, "run", "--rm", "--network", "host", "lab-debian:bookworm",
        "python3", "-c", "import ssl, venv, sys; print(sys.version_info[0])",
    )  # fmt: skip
    assert ran.out == "3"


def test_busybox_image_is_built_once(node_a):
    first = lab.busybox_image(node_a)
    assert lab.busybox_image(node_a) == first
