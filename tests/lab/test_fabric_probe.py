"""The fabric probe for real over SSH: the listener on node-a (the head), the sender on node-b (and
node-c, one after the other, as a three-node stack runs them).

The lab's nodes share this machine's loopback, so node-a's fabric address is 127.0.0.2. A wrong
fabric_ip is a TEST-NET-1 address (RFC 5737): every 127/8 address, SPARE_HOSTS included, is local
to each lab node, so the head's listener would bind it and the probe would pass.
"""

from __future__ import annotations

import secrets
import socket

import pytest

import lab
from components.fabric_check import FabricCheckError, ensure, probe_after, probe_head
from tests.lab.test_fabric_check import props, spark, write_on_node
from tests.support.ports import free_port

pytestmark = pytest.mark.lab

WRONG_IP = "192.0.2.77"


@pytest.fixture
def worker_tree(node_b):
    root = f"/tmp/qwen35-fabric-probe-{secrets.token_hex(4)}"
    yield root
    lab.on_node(node_b, ["rm", "-rf", "--", root], timeout=60)


def probe(head: lab.LabNode, host: str, port: int, min_gbps: float | None = None) -> dict:
    head_dict = {"name": head.name, **lab.node_config(head)}
    return {"head": head_dict, "head_name": head.name, "host": host, "port": port, "min_gbps": min_gbps}


def worker_props(worker: lab.LabNode, root: str, head_probe: dict) -> dict:
    return props(worker, root, socket_ifname="lo", probe=head_probe)


def test_the_figure_from_node_b_to_node_a_and_a_slow_link_warns(node_a, node_b):
    verdict = probe_head(
        worker_props(node_b, "/unused", probe(node_a, node_a.host, free_port(node_a.host), 1e6))
    )
    assert verdict.line.startswith("node-b → node-a ") and verdict.line.endswith(" GB/s over lo"), verdict
    assert verdict.gbytes_s and verdict.gbytes_s > 0 and not verdict.problems
    (warning,) = verdict.warnings
    assert "below fabric.min_gbps 1e+06 Gb/s" in warning and "ethtool lo" in warning


def test_a_head_fabric_ip_nothing_listens_on_refuses_the_worker(node_a, node_b, worker_tree):
    with socket.socket() as sock, pytest.raises(OSError):  # the wrong address is none of this machine's
        sock.bind((WRONG_IP, 0))
    write_on_node(node_b, worker_tree, spark())
    head_probe = probe(node_a, WRONG_IP, 29590)
    with pytest.raises(FabricCheckError) as raised:
        ensure(worker_props(node_b, worker_tree, head_probe) | {"socket_ifname": "enp1s0f0np0"})
    text = str(raised.value)
    assert f"node-b: cannot reach node-a's fabric address {WRONG_IP}:29590" in text
    assert "the head does not hold that address: correct nodes[].fabric_ip" in text


def test_a_three_node_stacks_probes_all_pass_one_after_another_on_the_heads_one_port(node_a, node_b, node_c):
    # The order the deployment gives the workers' checks (each after the previous worker's): their
    # listeners share the head's claimed port, so run together all but one were refused as "busy".
    after = probe_after(["node-b", "node-c"])
    assert after == {"node-b": None, "node-c": "node-b"}, after
    head_probe = probe(node_a, node_a.host, free_port(node_a.host))
    lines = []
    for worker in (node_b, node_c):
        verdict = probe_head(worker_props(worker, "/unused", head_probe))
        assert not verdict.problems and verdict.gbytes_s and verdict.gbytes_s > 0, verdict
        lines.append(verdict.line.split(" ", 3)[:3])
    assert lines == [["node-b", "→", "node-a"], ["node-c", "→", "node-a"]]
