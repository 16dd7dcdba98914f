"""The facts program (components/node_programs/fabric_facts.py) run as a node runs it, against sysfs
trees written here: symlinks into a devices/ folder as real sysfs has, GID tables with RoCE v1 and
v2, link-local and IPv4-mapped entries, zeroed unused entries."""

from __future__ import annotations

import errno
import json
import subprocess
import sys

import pytest

from components.fabric_check import facts_argv, node_facts
from components.fabric_check.errors import FabricCheckError
from components.node_programs import fabric_facts
from components.node_programs.fabric_facts import Exit
from components.provider_kit.reports import last_json_object
from tests.support.fabric_trees import DOWN, ROCE_V2, PortSpec, ipv4_gid, spark_tree, write_tree


def run_facts(root, socket="enp1s0f0np0") -> tuple[int, dict | None]:
    props = {"sysfs_root": str(root), "socket_ifname": socket}
    proc = subprocess.run(facts_argv(props, sys.executable), capture_output=True, text=True, timeout=60)
    return proc.returncode, last_json_object(proc.stdout)


def test_a_spark_tree_read_through_its_symlinks(tmp_path):
    tree = spark_tree(
        [
            PortSpec("rocep1s0f0", address="192.168.200.12"),
            PortSpec("rocep1s0f1", state=DOWN, phys_state="3: Disabled"),
            PortSpec("roceP2p1s0f0", address="192.168.201.12", mtu=1500),
        ]
    )
    root = write_tree(tmp_path / "sys", tree)
    assert (root / "class/infiniband/rocep1s0f0").is_symlink()
    code, report = run_facts(root)
    assert code == Exit.OK, report
    facts = node_facts("spark-1", report)
    assert [p.hca for p in facts.ports] == ["roceP2p1s0f0:1", "rocep1s0f0:1", "rocep1s0f1:1"]
    port = facts.port("rocep1s0f0:1")
    assert port.active and port.link_layer == "Ethernet" and port.phys_state == "5: LinkUp"
    # Link-local v1/v2, then the IPv4-mapped v1/v2; the zeroed entries are left out.
    assert [(g.index, g.type) for g in port.gids] == [
        (0, "IB/RoCE v1"),
        (1, ROCE_V2),
        (2, "IB/RoCE v1"),
        (3, ROCE_V2),
    ]
    assert port.gids[3].gid == ipv4_gid("192.168.200.12") == "0000:0000:0000:0000:0000:ffff:c0a8:c80c"
    assert port.gids[3].ipv4 == "192.168.200.12" and port.gids[1].ipv4 is None
    assert not facts.port("rocep1s0f1:1").active
    assert facts.port("rocep1s0f1:1").gids[0].ndev == "enp1s0f1np1"
    assert facts.port("roceP2p1s0f0:1").device_netdevs == ("enP2p1s0f0np0",)
    assert facts.netdevs["enP2p1s0f0np0"].mtu == 1500
    assert facts.socket.name == "enp1s0f0np0" and facts.socket.up
    assert facts.socket.addresses == ("192.168.200.12",) and facts.socket.mtu == 9000


def test_an_unused_entry_that_fails_with_einval_is_left_out(tmp_path, monkeypatch):
    root = write_tree(tmp_path / "sys", spark_tree([PortSpec("rocep1s0f0", address="10.0.0.1")]))
    real_open = open

    def einval_for_unused(path, *args, **kwargs):
        # What the kernel answers for a GID slot past the used ones.
        if str(path).endswith(("/gids/6", "/gids/7")):
            raise OSError(errno.EINVAL, "Invalid argument", str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(fabric_facts, "open", einval_for_unused, raising=False)
    code, report = fabric_facts.facts(
        {"sysfs": str(root), "socket_ifname": "enp1s0f0np0", "addresses": str(root / "ip-addr.json")}
    )
    assert code == Exit.OK, report
    assert [g["index"] for g in report["devices"][0]["ports"][0]["gids"]] == [0, 1, 2, 3]
    # Any other failure to read is not "unused": it stops the program with its traceback.
    monkeypatch.setattr(
        fabric_facts, "open", lambda *a, **k: (_ for _ in ()).throw(OSError(errno.EIO, "EIO")), raising=False
    )
    with pytest.raises(OSError, match="EIO"):
        fabric_facts.read(str(root / "class/net/enp1s0f0np0/mtu"))


def test_a_node_without_rdma_is_a_fact_not_a_crash(tmp_path):
    tree = spark_tree([], socket="eth0", socket_address="10.0.0.7")
    root = write_tree(tmp_path / "sys", tree)
    assert not (root / "class/infiniband").exists()
    code, report = run_facts(root, socket="eth0")
    assert code == Exit.OK
    assert report["devices"] == []
    assert report["netdevs"]["eth0"]["addresses"] == ["10.0.0.7"]


def test_a_missing_socket_interface_is_reported_absent(tmp_path):
    root = write_tree(tmp_path / "sys", spark_tree([PortSpec("rocep1s0f0", address="10.0.0.1")]))
    code, report = run_facts(root, socket="enp9s0")
    assert code == Exit.OK
    assert report["netdevs"]["enp9s0"] == {"exists": False, "operstate": None, "mtu": None, "addresses": []}


def test_unreadable_addresses_exit_with_their_own_code_and_refuse(tmp_path):
    root = write_tree(tmp_path / "sys", spark_tree([PortSpec("rocep1s0f0", address="10.0.0.1")]))
    (root / "ip-addr.json").write_text("not json")
    code, report = run_facts(root)
    assert code == Exit.ADDRESSES
    assert "addresses could not be read" in report["error"]
    with pytest.raises(FabricCheckError, match="spark-1: the fabric facts could not be read"):
        node_facts("spark-1", report)


def test_a_bad_spec_is_a_usage_error():
    from components.node_programs import program_argv

    proc = subprocess.run(
        program_argv("fabric_facts", ["[]"], sys.executable), capture_output=True, timeout=60
    )
    assert proc.returncode == Exit.USAGE
    assert b"usage: fabric_facts" in proc.stderr


def test_addresses_come_from_ip_on_a_real_node():
    # Without a lab tree the program runs `ip -j addr show`: nothing is read from a file.
    props = {"socket_ifname": "enp1s0f0np0"}
    argv = facts_argv(props)
    spec = json.loads(argv[-1])
    assert spec == {"addresses": "ip", "socket_ifname": "enp1s0f0np0", "sysfs": "/sys"}
    assert argv[:3] == ["python3", "-I", "-S"]
