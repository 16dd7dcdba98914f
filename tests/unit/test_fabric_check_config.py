"""FabricCheck's config keys (fabric.check, fabric.gid_index, fabric.mtu, nodes[].ib_hca, the
lab-only nodes[].sysfs_root) and the old keys (fabric.ib_hca, fabric.ib_gid_index), which keep
deploying what they deployed or are refused naming the new key."""

from __future__ import annotations

import pytest

from components.config import LEGACY_IB_HCA, CheckMode, ConfigError
from components.containers import NodeFabric, configured_fabric, fabric_env
from tests.support.program import config_from, dev_raw


def without_pin(**fabric):
    raw = dev_raw("dev")
    raw["fabric"] = {"socket_ifname": "enp1s0f0np0", **fabric}
    return raw


def parse(raw):
    from components.config import parse_stack_config

    return parse_stack_config(raw)


def problems(raw) -> list[str]:
    with pytest.raises(ConfigError) as raised:
        parse(raw)
    return raised.value.problems


def test_defaults_enforce_unset_no_mtu_no_pin():
    cfg = parse(without_pin())
    assert cfg.fabric.check is CheckMode.ENFORCE
    assert cfg.fabric.gid == "unset" and cfg.fabric.mtu is None
    assert [cfg.hca_pin(n) for n in cfg.nodes] == [None, None]


def test_the_old_cluster_wide_list_pins_every_node():
    cfg = config_from("dev")
    assert [cfg.hca_pin(n) for n in cfg.nodes] == [("rocep1s0f0", "roceP2p1s0f0")] * 2


def test_old_ib_gid_index_means_gid_index():
    cfg = parse(without_pin(ib_gid_index=4))
    assert cfg.fabric.gid == 4
    assert fabric_env(cfg, cfg.head, configured_fabric(cfg, cfg.head))["NCCL_IB_GID_INDEX"] == "4"


@pytest.mark.parametrize(("text", "expect"), [("resolve", "resolve"), ("unset", "unset"), (3, 3), ("5", 5)])
def test_gid_index_values(text, expect):
    assert parse(without_pin(gid_index=text)).fabric.gid == expect


@pytest.mark.parametrize(
    ("fabric", "nodes", "expect"),
    [
        ({"gid_index": "auto"}, None, "fabric.gid_index"),
        ({"gid_index": 300}, None, "fabric.gid_index"),
        ({"ib_gid_index": 3, "gid_index": 3}, None, "keep only `gid_index: 3`"),
        ({"check": "off", "gid_index": "resolve"}, None, "resolve needs the check"),
        ({"check": "maybe"}, None, "fabric.check"),
        ({"mtu": 100}, None, "fabric.mtu"),
        ({"ib_hca": ["rocep1s0f0"]}, {"ib_hca": ["rocep1s0f1"]}, "nodes.0.ib_hca: fabric.ib_hca"),
        ({}, {"ib_hca": ["bad hca"]}, "nodes.0.ib_hca"),
        ({"check": "off"}, {"sysfs_root": "/run/lab/sys"}, "nodes.0.sysfs_root: is read by FabricCheck only"),
        ({}, {"sysfs_root": "/sys"}, "nodes.0.sysfs_root"),
        ({}, {"sysfs_root": "relative/sys"}, "nodes.0.sysfs_root"),
    ],
)
def test_refusals_name_the_field(fabric, nodes, expect):
    raw = without_pin(**fabric)
    if nodes:
        raw["nodes"][0] = {**raw["nodes"][0], **nodes}
    found = problems(raw)
    assert any(expect in p for p in found), found


def test_per_node_pins_and_lab_tree():
    raw = without_pin(mtu=9000)
    raw["nodes"][0] = {**raw["nodes"][0], "ib_hca": ["rocep1s0f0:1"], "sysfs_root": "/run/lab/node-a/sys"}
    cfg = parse(raw)
    assert cfg.hca_pin(cfg.nodes[0]) == ("rocep1s0f0:1",) and cfg.hca_pin(cfg.nodes[1]) is None
    assert cfg.nodes[0].sysfs_root == "/run/lab/node-a/sys" and cfg.fabric.mtu == 9000


@pytest.mark.parametrize("off", ["off", False])
def test_off_keeps_what_the_stack_deployed_before_the_check(off):
    # `off` unquoted in a stack file is YAML's false.
    cfg = parse(without_pin(check=off))
    assert cfg.fabric.check is CheckMode.OFF
    env = fabric_env(cfg, cfg.head)
    assert env["NCCL_IB_HCA"] == ",".join(LEGACY_IB_HCA) == "rocep1s0f0,roceP2p1s0f0"
    assert "NCCL_IB_GID_INDEX" not in env and env["NCCL_IB_DISABLE"] == "0"


def test_the_lab_stack_has_no_check_and_no_infiniband():
    cfg = config_from("lab")
    assert cfg.fabric.check is CheckMode.OFF
    env = fabric_env(cfg, cfg.head)
    assert env["NCCL_IB_DISABLE"] == "1" and "NCCL_IB_HCA" not in env


def test_a_nodes_check_outputs_set_its_own_nccl():
    cfg = parse(without_pin())
    env = fabric_env(cfg, cfg.nodes[1], NodeFabric(("rocep1s0f1:1", "roceP2p1s0f1:1"), 4))
    assert env["NCCL_IB_HCA"] == "rocep1s0f1:1,roceP2p1s0f1:1" and env["NCCL_IB_GID_INDEX"] == "4"
    unset = fabric_env(cfg, cfg.nodes[1], NodeFabric(("rocep1s0f1:1",), None))
    # Never an empty value (NCCL reads "" as index 0, the link-local GID): not set at all.
    assert "NCCL_IB_GID_INDEX" not in unset
