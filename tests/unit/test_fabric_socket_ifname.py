"""`nodes[].socket_ifname`: each node's own socket interface, for its NCCL/Gloo/UCX settings and its
FabricCheck. Two Sparks cabled on different ports (enp1s0f0np0 on one, enp1s0f1np1 on the other)
deploy: a held-out pair of sysfs trees, read by the real facts program, passes on both nodes."""

from __future__ import annotations

from pathlib import Path

import pytest

from components.config import ConfigError, parse_stack_config
from components.containers import fabric_env
from components.fabric_check import decide, read_facts, settings
from components.layout import fabric_check_inputs
from components.remote import LocalTransport
from tests.support.fabric_trees import DOWN, PortSpec, spark_tree, write_tree
from tests.support.program import dev_raw

SOCKET_VARS = (
    "NCCL_SOCKET_IFNAME",
    "GLOO_SOCKET_IFNAME",
    "TP_SOCKET_IFNAME",
    "UCX_NET_DEVICES",
    "OMPI_MCA_btl_tcp_if_include",
)


def raw_config(tmp_path: Path | None = None, **second) -> dict:
    """The dev stack unpinned, the check on; `second`: keys of spark-2's node entry."""
    raw = dev_raw("dev")
    raw["fabric"] = {"socket_ifname": "enp1s0f0np0", "check": "enforce"}
    if tmp_path is not None:
        raw["nodes"] = [{**n, "sysfs_root": str(tmp_path / n["name"])} for n in raw["nodes"]]
    raw["nodes"][1] = {**raw["nodes"][1], **second}
    return raw


def test_a_node_names_its_own_interface_and_the_rest_keep_the_fabric_one():
    cfg = parse_stack_config(raw_config(socket_ifname="enp1s0f1np1"))
    head, worker = cfg.nodes
    assert (cfg.socket_ifname(head), cfg.socket_ifname(worker)) == ("enp1s0f0np0", "enp1s0f1np1")
    for node, ifname in ((head, "enp1s0f0np0"), (worker, "enp1s0f1np1")):
        env = fabric_env(cfg, node)
        assert {var: env[var] for var in SOCKET_VARS} == dict.fromkeys(SOCKET_VARS, ifname)
        assert fabric_check_inputs(cfg, node, {"name": node.name})["socket_ifname"] == ifname


@pytest.mark.parametrize("bad", ["eth0; ls", "a-name-longer-than-15", ""])
def test_a_bad_interface_is_refused_naming_the_node_and_field(bad):
    with pytest.raises(ConfigError) as raised:
        parse_stack_config(raw_config(socket_ifname=bad))
    found = raised.value.problems
    assert [p for p in found if p.startswith("nodes.1.socket_ifname:")] == [
        f"nodes.1.socket_ifname: {bad!r} is not a network interface name (e.g. enp1s0f0np0) (node spark-2)"
    ], found


def held_out_pair(tmp_path: Path) -> None:
    """spark-1 cabled on rocep1s0f0 (enp1s0f0np0 holds its fabric address), spark-2 on rocep1s0f1
    (enp1s0f1np1 holds it; its enp1s0f0np0 exists, up, without an address): not the trees of
    test_fabric_check_plan, and written for this test alone."""
    write_tree(
        tmp_path / "spark-1",
        spark_tree(
            [
                PortSpec("rocep1s0f0", address="192.168.200.12"),
                PortSpec("rocep1s0f1", state=DOWN, phys_state="3: Disabled"),
            ],
            socket="enp1s0f0np0",
        ),
    )
    write_tree(
        tmp_path / "spark-2",
        spark_tree(
            [
                PortSpec("rocep1s0f0", state=DOWN, phys_state="3: Disabled"),
                PortSpec("rocep1s0f1", address="192.168.200.13"),
            ],
            socket="enp1s0f1np1",
        ),
    )


def checked(cfg, tmp_path: Path):
    """Each node's FabricCheck decision from its config inputs, the head's the worker's reference."""
    decisions, reference = {}, None
    for node in [cfg.head, *cfg.workers]:
        props = {**fabric_check_inputs(cfg, node, {"name": node.name}), "reference": reference}
        decisions[node.name] = decision = decide(settings(props), read_facts(props, LocalTransport()))
        reference = reference or {"node": node.name, "mtu": decision.mtu, "paths": dict(decision.paths)}
    return decisions


def test_two_sparks_cabled_on_different_ports_both_pass(tmp_path):
    held_out_pair(tmp_path)
    cfg = parse_stack_config(raw_config(tmp_path, socket_ifname="enp1s0f1np1"))
    decisions = checked(cfg, tmp_path)
    assert {n: d.problems for n, d in decisions.items()} == {"spark-1": (), "spark-2": ()}
    assert decisions["spark-1"].ib_hca == ("rocep1s0f0:1",)
    assert decisions["spark-2"].ib_hca == ("rocep1s0f1:1",)
    assert decisions["spark-2"].paths == {"enp1s0f1np1": 9000}
    assert decisions["spark-2"].warnings == ()


def test_without_the_per_node_key_one_node_is_refused(tmp_path):
    # What every stack got before: one interface for both, so spark-2 is checked on the wrong one.
    held_out_pair(tmp_path)
    decisions = checked(parse_stack_config(raw_config(tmp_path)), tmp_path)
    assert decisions["spark-1"].problems == ()
    assert any("does not hold fabric_ip 192.168.200.13" in p for p in decisions["spark-2"].problems)
