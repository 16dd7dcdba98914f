"""`status` with FabricCheck on: each node's fabric read as the check reads it (the real facts
program on trees written here) and judged by the check's own plan, the head's MTU the reference."""

from __future__ import annotations

from pathlib import Path

import pytest

from components.config import parse_stack_config
from components.remote import LocalTransport
from status import facts, render
from status.verdict import judge
from tests.support.fabric_trees import DOWN, PortSpec, spark_tree, write_tree
from tests.support.program import stack_config
from tests.unit.test_status import healthy


def fabric_config(tmp_path, **fabric):
    """The lab stack with the check on, each node reading its own tree under tmp_path."""
    raw = {k.split(":", 1)[1]: v for k, v in stack_config("lab").items()}
    raw["fabric"] = {"socket_ifname": "enp1s0f0np0", "check": "report", **fabric}
    raw["nodes"] = [{**n, "sysfs_root": str(tmp_path / n["name"])} for n in raw["nodes"]]
    return parse_stack_config(raw)


def gathered_with(config, trees: dict) -> dict:
    gathered = healthy()
    for node in config.nodes:
        write_tree(Path(node.sysfs_root), trees[node.name])
        gathered["nodes"][node.name]["fabric"] = facts.fabric_facts(config, LocalTransport(), node.name)
    return gathered


def tree(fabric_ip: str, **port):
    """A node cabled on rocep1s0f0, whose netdev (the socket interface) holds the fabric address."""
    return spark_tree([PortSpec("rocep1s0f0", address=fabric_ip, **port)], socket="enp1s0f0np0")


def test_a_healthy_fabric_is_a_cell_per_node(tmp_path):
    config = fabric_config(tmp_path, gid_index="resolve")
    verdict = judge(
        config,
        gathered_with(config, {"node-a": tree("127.0.0.2"), "node-b": tree("127.0.0.3")}),
    )
    assert verdict.problems == [], verdict.problems
    assert verdict.nodes["node-a"]["fabric"] == "ok (rocep1s0f0:1 mtu 9000 gid 3)"
    assert "fabric" in render.text(verdict, "lab").splitlines()[2]


def test_a_worker_whose_mtu_is_not_the_heads_is_a_problem_with_its_fix(tmp_path):
    config = fabric_config(tmp_path)
    trees = {"node-a": tree("127.0.0.2"), "node-b": tree("127.0.0.3", mtu=1500)}
    verdict = judge(config, gathered_with(config, trees))
    assert verdict.nodes["node-a"]["fabric"].startswith("ok")
    assert verdict.nodes["node-b"]["fabric"] == "1 problem(s)"
    (problem,) = verdict.problems
    assert problem.node == "node-b"
    assert problem.what.startswith(
        "fabric MTU 1500 ({'lo': 9000, 'enp1s0f0np0': 1500}) but node-a's is 9000"
    ) or ("but node-a's is 9000" in problem.what)
    assert problem.next.startswith("on node-b: `sudo ip link set")


def test_a_port_down_and_unreadable_facts(tmp_path):
    config = fabric_config(tmp_path)
    gathered = gathered_with(config, {"node-a": tree("127.0.0.2", state=DOWN), "node-b": tree("127.0.0.3")})
    gathered["nodes"]["node-b"]["fabric"] = {"error": "the node needs `ip` (iproute2) with JSON output"}
    verdict = judge(config, gathered)
    assert [(p.node, p.what.split(" (")[0]) for p in verdict.problems] == [
        ("node-a", "no ACTIVE RDMA port"),
        ("node-b", "its fabric facts could not be read"),
    ]
    assert verdict.nodes["node-b"]["fabric"] == "unknown"


def test_with_the_check_off_status_reads_no_fabric(monkeypatch):
    config = parse_stack_config({k.split(":", 1)[1]: v for k, v in stack_config("lab").items()})
    asked = []
    monkeypatch.setattr(facts, "fabric_facts", lambda *a: asked.append(a) or {})
    monkeypatch.setattr(facts, "ask_node", lambda *a: {"reachable": False, "error": "down"})
    monkeypatch.setattr(facts, "server_facts", lambda *a: {})
    gathered = facts.gather(config, None, connect_timeout=1)
    assert asked == [] and all("fabric" not in n for n in gathered["nodes"].values())
    assert "fabric" not in render.text(judge(config, gathered), "lab")


@pytest.mark.parametrize("reachable", [True, False])
def test_gather_asks_each_reachable_node_for_its_fabric(tmp_path, monkeypatch, reachable):
    config = fabric_config(tmp_path)
    monkeypatch.setattr(facts, "fabric_facts", lambda cfg, transport, name: {"report": name})
    monkeypatch.setattr(facts, "ask_node", lambda *a: {"reachable": reachable})
    monkeypatch.setattr(facts, "server_facts", lambda *a: {})
    gathered = facts.gather(config, None, connect_timeout=1)
    expect = {"node-a": {"report": "node-a"}, "node-b": {"report": "node-b"}} if reachable else {}
    assert {n: r["fabric"] for n, r in gathered["nodes"].items() if "fabric" in r} == expect
