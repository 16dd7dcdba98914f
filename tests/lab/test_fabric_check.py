"""FabricCheck for real over SSH on a lab node. The lab's kernel has no RDMA, so each test writes a
sysfs tree modelled on a DGX Spark onto node-a (symlinks into devices/, as real sysfs; `ip-addr.json`
standing in for `ip -j addr show`) and points the check at it (`sysfs_root`, the lab-only setting).

- The facts program runs on the node and reads the tree through its symlinks.
- The provider's create refuses (enforce) an MTU that is not fabric.mtu, naming node, netdev and fix.
- Refresh (read) after the tree is edited on the node returns the changed outputs (drift).
"""

from __future__ import annotations

import secrets

import pytest

import lab
from components.fabric_check import FabricCheckError, FabricCheckProvider, plan, read_facts
from tests.support.fabric_trees import DOWN, PortSpec, Tree, spark_tree, writer_source
from tests.support.program import run_program, stack_config
from tests.support.provider_host import Engine, ProviderFailed, ProviderHost

pytestmark = pytest.mark.lab

FABRIC_IP = "192.168.200.12"


def write_on_node(node: lab.LabNode, root: str, tree: Tree) -> None:
    """Write `tree` at `root` on the node itself (over SSH), replacing what was there."""
    result = lab.on_node(node, ["python3", "-", root], input=writer_source(tree), timeout=60)
    assert result.out.strip() == root, result.err


@pytest.fixture
def tree_root(node_a):
    root = f"/tmp/qwen35-fabric-{secrets.token_hex(4)}"
    yield root
    lab.on_node(node_a, ["rm", "-rf", "--", root], timeout=60)


def props(node: lab.LabNode, root: str, **overrides) -> dict:
    return {
        "node": {"name": node.name, **lab.node_config(node)},
        "fabric_ip": FABRIC_IP,
        "socket_ifname": "enp1s0f0np0",
        "mode": "enforce",
        "pin": None,
        "gid": "resolve",
        "mtu_expected": None,
        "sysfs_root": root,
        "reference": None,
        **overrides,
    }


def spark(**first) -> Tree:
    return spark_tree(
        [
            PortSpec("rocep1s0f0", address=FABRIC_IP, **first),
            PortSpec("rocep1s0f1", state=DOWN, phys_state="3: Disabled"),
            PortSpec("roceP2p1s0f0", address="192.168.201.12"),
        ]
    )


def test_the_facts_program_reads_a_tree_on_the_node(node_a, tree_root):
    write_on_node(node_a, tree_root, spark())
    facts = read_facts(props(node_a, tree_root))
    assert facts.node == "node-a" and facts.sysfs == tree_root
    assert [(p.hca, p.active) for p in facts.ports] == [
        ("roceP2p1s0f0:1", True),
        ("rocep1s0f0:1", True),
        ("rocep1s0f1:1", False),
    ]
    assert facts.port("rocep1s0f0:1").gids[3].ipv4 == FABRIC_IP
    assert facts.socket.addresses == (FABRIC_IP,) and facts.socket.mtu == 9000


def test_create_refuses_an_mtu_that_is_not_fabric_mtu(node_a, tree_root):
    write_on_node(node_a, tree_root, spark(mtu=1500))
    with pytest.raises(FabricCheckError) as raised:
        FabricCheckProvider().create(props(node_a, tree_root, mtu_expected=9000))
    message = str(raised.value)
    assert message.startswith("fabric check on node-a: the fabric is not fit for NCCL")
    assert "node-a: enp1s0f0np0 has MTU 1500, below fabric.mtu 9000" in message
    assert "`sudo ip link set enp1s0f0np0 mtu 9000`" in message and "netplan" in message


def test_refresh_after_the_tree_is_edited_is_drift(node_a, tree_root):
    write_on_node(node_a, tree_root, spark())
    provider = FabricCheckProvider()
    outs = provider.create(props(node_a, tree_root)).outs
    assert (outs["verdict"], outs["gid_index"], outs["ib_hca"]) == (
        "pass",
        3,
        ["roceP2p1s0f0:1", "rocep1s0f0:1"],
    )
    assert provider.read(outs["node"]["name"], outs).outs == outs
    # A netplan change adds a global IPv6 address: the RoCE v2 IPv4 entry moves from 3 to 5.
    write_on_node(node_a, tree_root, spark(ipv6_global=True))
    moved = provider.read("fabric-node-a", outs).outs
    assert moved["gids"]["rocep1s0f0:1"] == 5
    # The two ports now disagree: resolve cannot give NCCL one index, and says so.
    assert moved["gid_index"] is None and moved["verdict"] == "fail"
    assert any("differs between ports" in p for p in moved["problems"])
    # The port goes DOWN: it leaves the node's HCAs.
    write_on_node(node_a, tree_root, spark(state=DOWN))
    down = provider.read("fabric-node-a", outs).outs
    assert down["ib_hca"] == ["roceP2p1s0f0:1"] and down["gid_index"] == 3


def test_a_port_whose_table_holds_another_netdevs_entry_first_gets_its_own(node_a, tree_root):
    """rocep1s0f1's table holds enp1s0f0np0's RoCE v2 IPv4 entry at 3, its own at 5: read on the
    node, the check resolves 5 and the port's MTU path is its own netdev."""
    tree = spark_tree(
        [
            PortSpec("rocep1s0f0", address=FABRIC_IP),
            PortSpec("rocep1s0f1", address="192.168.202.12", foreign=(FABRIC_IP, "enp1s0f0np0"), mtu=1500),
        ]
    )
    write_on_node(node_a, tree_root, tree)
    facts = read_facts(props(node_a, tree_root))
    assert [(g.index, g.ndev) for g in facts.port("rocep1s0f1:1").gids if g.roce_v2 and g.ipv4] == [
        (3, "enp1s0f0np0"),
        (5, "enp1s0f1np1"),
    ]
    outs = FabricCheckProvider().create(props(node_a, tree_root, mode="report", pin=["rocep1s0f1:1"])).outs
    assert outs["gids"] == {"rocep1s0f1:1": 5} and outs["gid_index"] == 5
    # Its own netdev's MTU (1500) is on the path, not enp1s0f0np0's. NCCL runs each connection at the
    # smaller end's MTU, so the difference is a warning naming the fix, not a refusal.
    assert outs["paths"] == {"enp1s0f0np0": 9000, "enp1s0f1np1": 1500}
    assert not any("MTU" in p for p in outs["problems"]), outs["problems"]
    s = plan.settings(props(node_a, tree_root, mode="report", pin=["rocep1s0f1:1"]))
    warned = plan.decide(s, facts).warnings
    assert any("sudo ip link set enp1s0f1np1 mtu 9000" in w for w in warned), warned


def test_through_the_provider_host_as_pulumi_up_drives_it(node_a, tree_root):
    """The check the lab stack registers for node-a (with `fabric.check: enforce`, `gid_index: 3` and
    node-a's tree), pickled by the SDK and served by a fresh `python -m pulumi.dynamic`: numbers
    arrive as the engine sends them. It passes, refresh after the index moved records the failure,
    and the next `up` refuses it."""
    config = stack_config("lab")
    config["qwen35-spark:fabric"] = {"socket_ifname": "lo", "check": "enforce", "gid_index": 3, "mtu": 9000}
    config["qwen35-spark:nodes"][0] = {**config["qwen35-spark:nodes"][0], "sysfs_root": tree_root}
    declared = run_program(config).named("qwen35-fabric-node-a")

    def lab_tree(**first) -> Tree:
        # node-a's socket interface is lo (the lab's "fabric"), holding its fabric_ip.
        return spark_tree(
            [PortSpec("rocep1s0f0", address=FABRIC_IP, **first)], socket="lo", socket_address="127.0.0.2"
        )

    write_on_node(node_a, tree_root, lab_tree())
    with ProviderHost() as host:
        engine = Engine(host, stack="lab")
        state = engine.create(declared.typ, declared.name, declared.inputs, timeout=120)
        outputs = state.public_outputs()
        assert (outputs["verdict"], outputs["ib_hca"], outputs["gid_index"]) == ("pass", ["rocep1s0f0:1"], 3)
        assert engine.up(state, declared.inputs).op == "same"
        write_on_node(node_a, tree_root, lab_tree(ipv6_global=True))
        refreshed = engine.refresh(state, timeout=120)
        assert refreshed.public_outputs()["verdict"] == "fail"
        assert refreshed.public_outputs()["gids"] == {"rocep1s0f0:1": 5}
        with pytest.raises(ProviderFailed) as raised:
            engine.up(refreshed, declared.inputs, timeout=120)
        assert "pinned GID index 3 on rocep1s0f0:1 is RoCE v2 fd00:" in raised.value.details
        assert "the RoCE v2 IPv4 entry is 5" in raised.value.details
