"""FabricCheck under the real Pulumi engine, on the lab: `fabric.check: enforce`, `gid_index: unset`,
and a sysfs tree per node (`nodes[].sysfs_root`, written onto the node: the lab's nodes share this
machine's filesystem) whose ACTIVE port names, and socket interfaces (`nodes[].socket_ifname`), differ
between the nodes.

After `up` each node's Ray container has NCCL_IB_HCA of its own node's ACTIVE ports, its own
NCCL_SOCKET_IFNAME and no NCCL_IB_GID_INDEX; an MTU dropped below `fabric.mtu` in node-b's tree
shows on node-b's FabricCheck only in `pulumi refresh`; with the tree restored, `up` repairs it and
replaces nothing. (An MTU that only differs between the ends is a warning, as NCCL runs at the
smaller end's: refresh records it in the outputs and shows no change.) A changed fabric.probe_port
updates the head's StackClaim and node-b's check in place and moves no container.
"""

from __future__ import annotations

import copy
import json
import secrets as pysecrets
from collections.abc import Iterator

import pytest

import lab
from engine.lab_stack import write_config
from lab.layout import lab_dir
from status import gather
from status.fabric import fabric_lines
from tests.engine.conftest import Stack, changes, secret_stack, steps, urn_name
from tests.engine.conftest import up_or_fail as up
from tests.lab.test_fabric_check import write_on_node
from tests.support.fabric_trees import DOWN, PortSpec, Tree, spark_tree

pytestmark = pytest.mark.engine

NS = "qwen35-spark"
R_CHECK_B = "qwen35-fabric-node-b"
RAY = {"node-a": "qwen35-ray-head", "node-b": "qwen35-ray-worker"}
# node-a's ACTIVE ports are rocep1s0f0 and roceP2p1s0f1, node-b's roceP2p1s0f0: each must get its own,
# node-a's in one order (device, port) on every read, so refresh and a no-op up change nothing.
ACTIVE_PORTS = {"node-a": ["rocep1s0f0", "roceP2p1s0f1"], "node-b": ["roceP2p1s0f0"]}
NCCL_IB_HCA = {"node-a": "roceP2p1s0f1:1,rocep1s0f0:1", "node-b": "roceP2p1s0f0:1"}
# Cabled on different ports, as two Sparks can be: each node's fabric_ip is on its own netdev, and
# each node's nodes[].socket_ifname names it (the trees stand in for the interfaces).
SOCKET = {"node-a": "enp1s0f0np0", "node-b": "enP2p1s0f0np0"}


def tree(node: str, fabric_ip: str, mtu: int = 9000) -> Tree:
    down = "rocep1s0f1"
    host = 2 if node == "node-a" else 3
    ports = [
        PortSpec(name, address=f"192.168.{200 + i}.{host}", mtu=mtu)
        for i, name in enumerate(ACTIVE_PORTS[node])
    ]
    ports.append(PortSpec(down, state=DOWN, phys_state="3: Disabled"))
    # The node's own socket interface holds its fabric_ip (127.0.0.x in the lab): the stand-in for
    # `ip -j addr` says so.
    return spark_tree(ports, socket=SOCKET[node], socket_address=fabric_ip)


def fabric_config(lab_config, roots: dict[str, str]) -> dict:
    base = lab_config()
    nodes = copy.deepcopy(base[f"{NS}:nodes"])
    for node in nodes:
        node.pop("ib_hca", None)
        node["sysfs_root"] = roots[node["name"]]
        node["socket_ifname"] = SOCKET[node["name"]]
    # fabric.mtu is the floor that makes node-b's 1500 a refusal (a mere difference only warns).
    # node_proof off: these stand-in images hold no torch (test_real_vllm.py runs the proof).
    fabric = {
        "socket_ifname": "lo",
        "check": "enforce",
        "gid_index": "unset",
        "mtu": 9000,
        "node_proof": "off",
    }
    return lab_config(fabric=fabric, nodes=nodes)


@pytest.fixture(scope="module")
def roots(lab_nodes) -> Iterator[dict[str, str]]:
    made = {name: f"/tmp/qwen35-engine-fabric-{name}-{pysecrets.token_hex(4)}" for name in lab_nodes}
    yield made
    for name, root in made.items():
        lab.on_node(lab_nodes[name], ["rm", "-rf", "--", root], timeout=60)


@pytest.fixture(scope="module")
def stack(engine, lab_nodes, lab_config, secrets, roots) -> Iterator[Stack]:
    config = fabric_config(lab_config, roots)
    ips = {n["name"]: n["fabric_ip"] for n in config[f"{NS}:nodes"]}
    for name, root in roots.items():
        write_on_node(lab_nodes[name], root, tree(name, ips[name]))
    with secret_stack(engine, "engine-fabric", config, secrets) as made:
        made.ips = ips
        yield made


def claim_record(stack: Stack, node: str) -> dict:
    """The node's record of the stack's StackClaim (the lab nodes' homes are on this machine)."""
    return json.loads(
        (lab_dir() / node / "home" / ".qwen35" / "stacks" / f"qwen35-spark--{stack.name}.json").read_text()
    )


def env_of(node: lab.LabNode, container: str) -> dict[str, str]:
    listed = json.loads(lab.docker(node, "inspect", "--format", "{{json .Config.Env}}", container).out)
    return dict(item.split("=", 1) for item in listed)


def status_speeds(stack: Stack, monkeypatch) -> dict[str, str]:
    """`status`'s fabric lines, their speed part read from this stack's output by the real CLI."""
    for key, value in stack.engine.env().items():
        monkeypatch.setenv(key, value)
    recorded = gather.stack_fabric(stack.name, which=lambda _: str(stack.engine.pulumi))
    assert "output" in recorded, recorded
    config = gather.load_config(stack.config)
    lines, warnings = fabric_lines(config, {"nodes": {}, "fabric_output": recorded}, {})
    assert warnings == []
    return lines


def test_each_node_gets_its_own_ports_then_drift_on_node_b_only(stack, lab_nodes, roots, monkeypatch):
    up(stack)
    for name, container in RAY.items():
        env = env_of(lab_nodes[name], container)
        assert env.get("NCCL_IB_HCA") == NCCL_IB_HCA[name], (name, env)
        assert env.get("NCCL_SOCKET_IFNAME") == env.get("GLOO_SOCKET_IFNAME") == SOCKET[name], (name, env)
        assert "NCCL_IB_GID_INDEX" not in env, (name, env)
    outputs = stack.run("stack", "output", "--json").json()
    assert outputs["fabric"]["nodes"]["node-b"]["throughput"]["line"].startswith("node-b → node-a ")
    speed = status_speeds(stack, monkeypatch)["node-b"].split("; ", 1)[1]
    assert speed.startswith("node-b → node-a ") and speed.endswith(" GB/s over enP2p1s0f0np0"), speed
    # The head's StackClaim holds the probe's port (fabric.probe_port, 29590 by default).
    assert [29590, 29590] in claim_record(stack, "node-a")["ports"]
    assert [29590, 29590] not in claim_record(stack, "node-b")["ports"]

    write_on_node(lab_nodes["node-b"], roots["node-b"], tree("node-b", stack.ips["node-b"], mtu=1500))
    refreshed = stack.run("refresh", "--yes", "--skip-preview", "--json", check=False, timeout=900)
    assert refreshed.returncode == 0, refreshed.err[-3000:]
    assert changes(refreshed.events()) == {R_CHECK_B: "update"}, changes(refreshed.events())

    write_on_node(lab_nodes["node-b"], roots["node-b"], tree("node-b", stack.ips["node-b"]))
    repaired = up(stack)
    ops = {urn_name(m["urn"]): m["op"] for m in steps(repaired)}
    assert not [n for n, op in ops.items() if "replace" in op], ops
    assert {n for n, op in ops.items() if op not in ("same", "read", "refresh")} == {R_CHECK_B}, ops


def test_a_new_probe_port_updates_the_heads_claim_and_moves_no_container(stack, lab_config, roots):
    """What an existing stack sees when the head's claimed ports change (as on the upgrade that
    added fabric.probe_port to them): the claim and node-b's check update in place, nothing else."""
    config = fabric_config(lab_config, roots)
    config[f"{NS}:fabric"] = {**config[f"{NS}:fabric"], "probe_port": 29591}
    write_config(stack.config, config)
    moved = up(stack)
    ops = {urn_name(m["urn"]): m["op"] for m in steps(moved)}
    changed = {n: op for n, op in ops.items() if op not in ("same", "read", "refresh")}
    assert changed == {"qwen35-claim-node-a": "update", R_CHECK_B: "update"}, ops
    assert [29591, 29591] in claim_record(stack, "node-a")["ports"]
    assert [29590, 29590] not in claim_record(stack, "node-a")["ports"]
