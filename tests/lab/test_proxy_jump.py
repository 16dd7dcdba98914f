"""ProxyJump for real: node-e is reached only through node-a, as spark-2 is through spark-1.

node-e's dockerd and sshd run in a network namespace of their own; from this machine's network its
address refuses connections. node-a has a second SSH door whose sessions run in that namespace (the
jump's "fabric side"). The program's own transport (SshTransport, ssh_options, its ProxyCommand), a
NodeImage copy driven through the provider host, and the readiness probe all reach node-e through
that door, checked against the one pinned known_hosts file.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path

import pytest

import lab
from components.node_image import NodeImage
from components.nodes import node_access
from components.readiness_gate import ensure
from components.remote import SshTransport, shell_join
from lab.layout import data_dir, door_port, node_paths
from lab.netns import in_netns
from lab.remote import ssh_target
from tests.support.lab_nodes import node_dict
from tests.support.program import config_from, dev_raw, registered_by
from tests.support.provider_host import Engine, ProviderHost
from tests.support.standin_openai import StandinServer, probe_props

pytestmark = pytest.mark.lab

MODEL = "qwen3.5-jump"
API_KEY = "sk-lab-jump"
TAG = "lab-jump:1"


@pytest.fixture(scope="module")
def node_e(lab_node) -> lab.LabNode:
    return lab_node("node-e")


@pytest.fixture(scope="module")
def door(node_a) -> lab.LabNode:
    return lab.via_door(node_a)


def swapped_key(known_hosts: str, entry: str, key_of: str, tmp_path: Path) -> str:
    """A copy of known_hosts whose `entry` ([host]:port) carries the host key of `key_of` instead."""
    lines = Path(known_hosts).read_text().splitlines()
    other = next(line for line in lines if line.startswith(f"{key_of} ")).split(" ", 1)[1]
    fixed = [f"{entry} {other}" if line.startswith(f"{entry} ") else line for line in lines]
    assert fixed != lines, f"no {entry} in {known_hosts}"
    path = tmp_path / "known_hosts"
    path.write_text("\n".join(fixed) + "\n")
    return str(path)


def test_a_direct_connection_to_node_e_is_refused(node_e, node_a):
    direct = dataclasses.replace(node_e, proxy_jump=None)
    result = lab.on_node(direct, ["true"], check=False)
    assert result.returncode == 255 and "Connection refused" in result.err, result.err
    # node-a's ordinary sessions live on this machine's network too: they cannot reach node-e either.
    probe = "import socket; socket.create_connection(('127.0.0.6', 2222), timeout=3)"
    assert lab.on_node(node_a, ["python3", "-c", probe], check=False).returncode != 0


def test_the_programs_transport_reaches_node_e_through_the_jump(node_e):
    target = ssh_target(node_e)
    assert target.proxy_jump == f"root@127.0.0.2:{door_port()}"
    result = SshTransport(target).run(["sh", "-c", 'echo "$LAB_NODE $DOCKER_HOST"'], timeout=60).check()
    assert result.out == f"node-e {node_e.docker_host}"
    info = json.loads(lab.docker(node_e, "info", "--format", "{{json .}}").out)
    assert info["DockerRootDir"] == str(data_dir() / "node-e") and info["ServerVersion"] == node_e.engine


def test_a_stack_node_behind_the_jump_is_reached_by_the_program_and_its_docker_provider(node_e):
    # The lab stack plus node-e, declared as an operator would declare spark-2 behind spark-1.
    behind = {"name": "node-e", "role": "worker", "host": node_e.host, "fabric_ip": node_e.host}
    nodes = [*dev_raw("lab")["nodes"], {**behind, "port": node_e.port, "proxy_jump": node_e.proxy_jump}]
    ssh = {"known_hosts": node_e.known_hosts, "identity_file": node_e.identity_file}
    config = config_from("lab", nodes=nodes, ssh=ssh, serve={"tensor_parallel_size": 3})
    access = node_access(config)["node-e"]
    assert access.target.proxy_jump == node_e.proxy_jump
    assert SshTransport(access.target).run(["sh", "-c", "echo $LAB_NODE"], timeout=60).check().out == "node-e"
    # What the docker provider runs for `ssh://root@127.0.0.6:2222` with the program's ssh options.
    remote = shell_join(["docker", "info", "--format", "{{.DockerRootDir}}"])
    argv = ["ssh", *access.docker_ssh_opts(), access.target.destination, "--", remote]
    ran = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0 and ran.stdout.strip() == str(data_dir() / "node-e"), ran.stderr


def test_both_hops_are_checked_against_the_pinned_known_hosts(node_e, node_a, tmp_path):
    e_entry, door_entry = f"[{node_e.host}]:{node_e.port}", f"[{node_a.host}]:{door_port()}"
    # Each hop in turn pinned to another node's key: the connection must stop there.
    for entry, other in ((e_entry, f"[{node_a.host}]:{node_a.port}"), (door_entry, e_entry)):
        wrong = swapped_key(node_e.known_hosts, entry, other, tmp_path)
        result = lab.on_node(dataclasses.replace(node_e, known_hosts=wrong), ["true"], check=False)
        assert result.returncode == 255 and "host key" in result.err.lower(), (entry, result.err)


def test_node_image_copies_onto_node_e_through_the_jump(node_a, door, node_e):
    image_id = lab.busybox_image(node_a, TAG)
    # node-e must lack the layer, not only this image: another busybox image there (the lab's own, as
    # `python -m lab images` places it) holds the same layer, and the copy would rightly send nothing.
    layer = lab.docker(node_a, "image", "inspect", "--format", "{{index .RootFS.Layers 0}}", image_id).out
    tagged = set(lab.docker(node_e, "image", "ls", "--quiet", "--no-trunc").out.split())
    if tagged:  # read every image's layers at once, before any removal takes an untagged parent along
        listing = "{{.Id}} {{range .RootFS.Layers}}{{.}} {{end}}"
        for line in lab.docker(node_e, "image", "inspect", "--format", listing, *tagged).out.splitlines():
            if layer.strip() in line.split()[1:]:
                lab.docker(node_e, "image", "rm", "--force", line.split()[0], check=False)  # every tag of it
    source = node_dict(door)
    destination = node_dict(node_e)
    assert "proxy_jump" in destination and "proxy_jump" not in source
    (placed,) = registered_by(lambda: NodeImage("image-node-e", TAG, source, destination), stack="lab")
    with ProviderHost() as host:
        engine = Engine(host)
        state = engine.create(placed.typ, placed.name, placed.inputs, timeout=300)
        outs = state.outputs
        on_e = lab.docker(node_e, "image", "inspect", "--format", "{{.Id}}", TAG).out
        assert outs["image_id"] == on_e == image_id
        assert not outs["skipped"] and outs["layers_sent"] >= 1 and outs["bytes_sent"] > 0, outs
        assert engine.refresh(state).outputs["image_id"] == image_id
        engine.delete(state)
    gone = lab.docker(node_e, "image", "inspect", TAG, check=False)
    assert gone.returncode != 0, "the tag this NodeImage placed must go with it"


def test_the_readiness_probe_reaches_node_e_through_the_jump(node_e):
    # The stand-in server listens on node-e's address inside node-e's network, where the probe runs.
    with in_netns(node_paths("node-e").netns):
        server = StandinServer(node_e.host, 0, MODEL, api_key=API_KEY)
    server.start()
    try:
        props = probe_props(node_dict(node_e), server, api_key=API_KEY)
        report = ensure(props)["report"]  # probe_props: a 20 s deadline
    finally:
        server.shutdown()
        server.server_close()
    assert report["completion_tokens"] == 2 and report["model"] == MODEL
    assert server.requests == ["GET /health", "GET /v1/models", "POST /v1/chat/completions"]
