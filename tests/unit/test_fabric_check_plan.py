"""FabricCheck's pure plan, as tables: sysfs trees modelled on two DGX Sparks (written here, read by
the real facts program), then the decisions: ports, GID index, MTU, problems, refusal, diff."""

from __future__ import annotations

import subprocess
import sys

import pytest

from components.fabric_check import (
    REPORT,
    RESOLVE,
    Settings,
    decide,
    facts_argv,
    node_facts,
    plan_change,
    refusal,
)
from components.provider_kit.reports import last_json_object
from tests.support.fabric_trees import (
    DOWN,
    LINK_LOCAL,
    ROCE_V1,
    ROCE_V2,
    PortSpec,
    ipv4_gid,
    spark_tree,
    write_tree,
)

SPARK1 = "192.168.200.12"
SPARK2 = "192.168.200.13"


def facts_of(
    tmp_path, node: str, ports: list[PortSpec], socket: str = "enp1s0f0np0", ask: str = "", **kwargs
):
    """The facts program's report on a tree of `ports` (asked about `ask`, else `socket`)."""
    root = write_tree(tmp_path / node, spark_tree(ports, socket=socket, **kwargs))
    argv = facts_argv({"sysfs_root": str(root), "socket_ifname": ask or socket}, sys.executable)
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True)
    return node_facts(node, last_json_object(proc.stdout))


def spark1_ports(**first) -> list[PortSpec]:
    """spark-1 cabled on rocep1s0f0 and roceP2p1s0f0 (its twins DOWN)."""
    return [
        PortSpec("rocep1s0f0", address=SPARK1, **first),
        PortSpec("rocep1s0f1", state=DOWN, phys_state="3: Disabled"),
        PortSpec("roceP2p1s0f0", address="192.168.201.12"),
        PortSpec("roceP2p1s0f1", state=DOWN, phys_state="3: Disabled"),
    ]


def spark2_ports(**first) -> list[PortSpec]:
    """spark-2 cabled on the other functions (rocep1s0f1, roceP2p1s0f1): port names differ per node."""
    return [
        PortSpec("rocep1s0f0", state=DOWN, phys_state="3: Disabled"),
        PortSpec("rocep1s0f1", address=SPARK2, **first),
        PortSpec("roceP2p1s0f0", state=DOWN, phys_state="3: Disabled"),
        PortSpec("roceP2p1s0f1", address="192.168.201.13"),
    ]


def settings(node="spark-1", ip=SPARK1, socket="enp1s0f0np0", **kwargs) -> Settings:
    return Settings(node=node, fabric_ip=ip, socket_ifname=socket, **kwargs)


def test_each_node_gets_its_own_active_ports(tmp_path):
    one = decide(settings(), facts_of(tmp_path, "spark-1", spark1_ports()))
    two = decide(
        settings("spark-2", SPARK2, "enp1s0f1np1"),
        facts_of(tmp_path, "spark-2", spark2_ports(), "enp1s0f1np1"),
    )
    assert one.verdict == two.verdict == "pass", (one.problems, two.problems)
    assert one.ib_hca == ("roceP2p1s0f0:1", "rocep1s0f0:1")
    assert two.ib_hca == ("roceP2p1s0f1:1", "rocep1s0f1:1")
    # Under `unset` nothing is given to NCCL, but what it will pick is recorded.
    assert one.gid_index is None and one.gids == {"roceP2p1s0f0:1": 3, "rocep1s0f0:1": 3}
    assert one.mtu == 9000 and one.paths == {"enp1s0f0np0": 9000, "enP2p1s0f0np0": 9000}


@pytest.mark.parametrize(
    ("gid", "ipv6_global", "expect"),
    [
        (RESOLVE, False, 3),
        # A global IPv6 address (a netplan change) moves the RoCE v2 IPv4 entry from 3 to 5.
        (RESOLVE, True, 5),
        (3, False, 3),
    ],
)
def test_the_roce_v2_ipv4_index_is_resolved_or_pinned(tmp_path, gid, ipv6_global, expect):
    ports = [PortSpec("rocep1s0f0", address=SPARK1, ipv6_global=ipv6_global)]
    decision = decide(settings(gid=gid), facts_of(tmp_path, "spark-1", ports))
    assert decision.verdict == "pass", decision.problems
    assert decision.gid_index == expect


def other_netdev_first(own: str | None) -> list[PortSpec]:
    """spark-1 with rocep1s0f1's GID table holding enp1s0f0np0's IPv4-mapped RoCE v2 entry (index 3,
    as a VLAN or a bond over both functions leaves it) before its own (index 5), or instead of it."""
    return [
        PortSpec("rocep1s0f0", address=SPARK1),
        PortSpec("rocep1s0f1", address=own, foreign=(SPARK1, "enp1s0f0np0")),
    ]


def test_the_gid_of_the_ports_own_netdev_wins_over_another_netdevs_lower_entry(tmp_path):
    decision = decide(
        settings(gid=RESOLVE, pin=("rocep1s0f1:1",)), facts_of(tmp_path, "s", other_netdev_first("10.0.2.12"))
    )
    assert decision.verdict == "pass", decision.problems
    # Index 3 maps SPARK1, enp1s0f0np0's address: the lowest RoCE v2 IPv4 entry, not this port's.
    assert decision.gids == {"rocep1s0f1:1": 5} and decision.gid_index == 5
    # The port's fabric path is its own netdev, though the table names enp1s0f0np0 first.
    assert decision.paths == {"enp1s0f0np0": 9000, "enp1s0f1np1": 9000}
    assert decision.ib_hca == ("rocep1s0f1:1",)


def test_another_netdevs_entry_is_taken_only_where_the_port_has_none_of_its_own(tmp_path):
    decision = decide(
        settings(gid=RESOLVE, pin=("rocep1s0f1:1",)), facts_of(tmp_path, "s", other_netdev_first(None))
    )
    assert decision.gids == {"rocep1s0f1:1": 3} and decision.verdict == "pass", decision.problems


def test_under_unset_a_lower_entry_of_another_netdev_warns_with_both_indices(tmp_path):
    # NCCL (unset) takes the lowest RoCE v2 IPv4 entry, index 3 of enp1s0f0np0 (a VLAN or bond's);
    # the check validated 5, the port's own netdev's. It passes, with a warning naming both.
    decision = decide(
        settings(pin=("rocep1s0f1:1",)), facts_of(tmp_path, "s", other_netdev_first("10.0.2.12"))
    )
    assert decision.verdict == "pass" and decision.gids == {"rocep1s0f1:1": 5}
    (warning,) = decision.warnings
    assert warning.startswith(
        "spark-1: on rocep1s0f1:1 NCCL takes GID index 3 (192.168.200.12 of enp1s0f0np0: the lowest "
        "RoCE v2 IPv4"
    )
    assert "not 5, the entry of its own netdev enp1s0f1np1" in warning
    assert "fabric.gid_index: resolve" in warning
    # Where NCCL's pick is the port's own entry, or the index is given to NCCL, nothing is said.
    assert decide(settings(), facts_of(tmp_path, "t", spark1_ports())).warnings == ()
    given = decide(
        settings(gid=RESOLVE, pin=("rocep1s0f1:1",)), facts_of(tmp_path, "u", other_netdev_first("10.0.2.12"))
    )
    assert given.warnings == ()


@pytest.mark.parametrize("pin", [3, 5])
def test_a_pinned_index_passes_on_any_roce_v2_ipv4_entry_not_only_resolves_choice(tmp_path, pin):
    # An existing stack pinned to 3 (another netdev's RoCE v2 IPv4 entry) kept working before the
    # own-netdev preference: a pin is held to being RoCE v2 IPv4, not to resolve's pick.
    facts = facts_of(tmp_path, "s", other_netdev_first("10.0.2.12"))
    decision = decide(settings(gid=pin, pin=("rocep1s0f1:1",)), facts)
    assert decision.verdict == "pass", decision.problems
    assert decision.gid_index == pin


def test_a_pinned_index_that_is_not_roce_v2_ipv4_is_refused_naming_the_entry(tmp_path):
    facts = facts_of(tmp_path, "s", other_netdev_first("10.0.2.12"))
    decision = decide(settings(gid=0, pin=("rocep1s0f1:1",)), facts)
    assert decision.verdict == "fail"
    assert any("pinned GID index 0 on rocep1s0f1:1" in p and "resolve" in p for p in decision.problems)


def test_unpinned_ports_are_in_one_order_whatever_order_the_facts_came_in(tmp_path):
    facts = facts_of(tmp_path, "spark-1", spark1_ports())
    shuffled = type(facts)(**{**facts.__dict__, "ports": tuple(reversed(facts.ports))})
    assert [p.hca for p in shuffled.ports][0] != "roceP2p1s0f0:1"
    first, again = decide(settings(), facts), decide(settings(), shuffled)
    assert first.ib_hca == again.ib_hca == ("roceP2p1s0f0:1", "rocep1s0f0:1")
    assert first.outputs() == again.outputs()
    # Pinned ports keep the operator's order.
    pinned = decide(settings(pin=("rocep1s0f0:1", "roceP2p1s0f0:1")), shuffled)
    assert pinned.ib_hca == ("rocep1s0f0:1", "roceP2p1s0f0:1")


def test_a_pinned_index_that_moved_is_refused_naming_the_new_one(tmp_path):
    ports = [PortSpec("rocep1s0f0", address=SPARK1, ipv6_global=True)]
    decision = decide(settings(gid=3), facts_of(tmp_path, "spark-1", ports))
    (problem,) = decision.problems
    assert problem.startswith("spark-1: pinned GID index 3 on rocep1s0f0:1 is RoCE v2 fd00:")
    assert "the RoCE v2 IPv4 entry is 5" in problem and "fabric.gid_index: resolve" in problem


def test_a_pinned_index_that_does_not_exist(tmp_path):
    decision = decide(
        settings(gid=9), facts_of(tmp_path, "spark-1", [PortSpec("rocep1s0f0", address=SPARK1)])
    )
    (problem,) = decision.problems
    assert "pinned GID index 9 on rocep1s0f0:1 does not exist (the RoCE v2 IPv4 entry is 3" in problem


def test_only_roce_v1_or_link_local_entries_are_refused(tmp_path):
    gids = [
        (LINK_LOCAL, ROCE_V1, "enp1s0f0np0"),
        (LINK_LOCAL, ROCE_V2, "enp1s0f0np0"),
        (ipv4_gid(SPARK1), ROCE_V1, "enp1s0f0np0"),
    ]
    decision = decide(
        settings(), facts_of(tmp_path, "spark-1", [PortSpec("rocep1s0f0", address=SPARK1, gids=gids)])
    )
    (problem,) = decision.problems
    assert problem.startswith("spark-1: rocep1s0f0:1 has no RoCE v2 GID for an IPv4 address of enp1s0f0np0")
    assert "2: IB/RoCE v1 0000:0000:0000:0000:0000:ffff:c0a8:c80c" in problem
    assert "next: give enp1s0f0np0 its fabric address" in problem


def test_resolve_refuses_ports_that_disagree(tmp_path):
    ports = [
        PortSpec("rocep1s0f0", address=SPARK1),
        PortSpec("roceP2p1s0f0", address="10.0.1.2", ipv6_global=True),
    ]
    decision = decide(settings(gid=RESOLVE), facts_of(tmp_path, "spark-1", ports))
    assert decision.gid_index is None
    assert any("differs between ports" in p and "fabric.gid_index: unset" in p for p in decision.problems)


def test_no_active_port(tmp_path):
    ports = [PortSpec("rocep1s0f0", state=DOWN, phys_state="3: Disabled", address=SPARK1)]
    decision = decide(settings(), facts_of(tmp_path, "spark-1", ports))
    assert decision.ib_hca == ()
    assert any(
        p.startswith("spark-1: no ACTIVE RDMA port (found: rocep1s0f0:1 1: DOWN (3: Disabled))")
        for p in decision.problems
    )


def test_a_node_without_rdma_devices(tmp_path):
    decision = decide(settings(), facts_of(tmp_path, "spark-1", [], socket_address=SPARK1))
    (problem,) = decision.problems
    assert "no ACTIVE RDMA port (found: no RDMA device under" in problem


@pytest.mark.parametrize(
    ("pin", "expect"),
    [
        (("rocep1s0f0",), None),
        (("rocep1s0f0:1", "roceP2p1s0f0:1"), None),
        (("rocep1s0f1",), "pinned HCA rocep1s0f1 is not ACTIVE (rocep1s0f1:1 1: DOWN (3: Disabled))"),
        (("rocep1s0f0:2",), "pinned HCA rocep1s0f0:2 does not exist (found: roceP2p1s0f0:1 4: ACTIVE"),
        (("mlx5_0",), "pinned HCA mlx5_0 does not exist"),
    ],
)
def test_pinned_hcas(tmp_path, pin, expect):
    decision = decide(settings(pin=pin), facts_of(tmp_path, "spark-1", spark1_ports()))
    # A pin is given to NCCL as written.
    assert decision.ib_hca == pin
    if expect is None:
        assert decision.problems == ()
    else:
        (problem,) = decision.problems
        assert problem.startswith(f"spark-1: {expect}"), problem


def head_reference(tmp_path) -> dict:
    head = decide(settings(), facts_of(tmp_path, "spark-1", spark1_ports()))
    return {"node": "spark-1", "mtu": head.mtu, "paths": dict(head.paths)}


def test_mtu_1500_against_the_heads_9000_warns_naming_both_and_the_fix(tmp_path):
    # NCCL takes the smaller MTU of the two ends (net_ib.cc, "Adjust the MTU"): it works, slower.
    ports = [PortSpec("rocep1s0f1", address=SPARK2, mtu=1500)]
    worker = decide(
        settings("spark-2", SPARK2, "enp1s0f1np1", reference=head_reference(tmp_path)),
        facts_of(tmp_path, "spark-2", ports, "enp1s0f1np1"),
    )
    assert worker.verdict == "pass" and worker.problems == ()
    (warning,) = worker.warnings
    assert warning.startswith("spark-2: fabric MTU 1500 ({'enp1s0f1np1': 1500}) but spark-1's is 9000")
    assert "NCCL takes the smaller of the two ends, so traffic between them runs at 1500" in warning
    assert "IBV_WC_RETRY_EXC_ERR" not in warning
    assert "on spark-2: `sudo ip link set enp1s0f1np1 mtu 9000`" in warning
    assert "/etc/netplan/90-qwen35-enp1s0f1np1.yaml" in warning and "{mtu: 9000}" in warning


def test_a_9000_9216_pair_passes_with_a_warning_and_no_refusal(tmp_path):
    ports = [PortSpec("rocep1s0f1", address=SPARK2, mtu=9216)]
    worker = decide(
        settings("spark-2", SPARK2, "enp1s0f1np1", reference=head_reference(tmp_path)),
        facts_of(tmp_path, "spark-2", ports, "enp1s0f1np1"),
    )
    assert worker.verdict == "pass" and refusal(settings("spark-2"), worker) is None
    (warning,) = worker.warnings
    assert "runs at 9000" in warning and "on spark-1: `sudo ip link set enp1s0f0np0 mtu 9216`" in warning


@pytest.mark.parametrize(("mtu", "refused"), [(9000, False), (9216, False), (8999, True), (1500, True)])
def test_fabric_mtu_refuses_only_an_mtu_below_it(tmp_path, mtu, refused):
    facts = facts_of(tmp_path, "spark-2", [PortSpec("rocep1s0f1", address=SPARK2, mtu=mtu)], "enp1s0f1np1")
    decision = decide(settings("spark-2", SPARK2, "enp1s0f1np1", mtu_expected=9000), facts)
    assert (decision.verdict == "fail") is refused
    if refused:
        (problem,) = decision.problems
        assert problem.startswith(f"spark-2: enp1s0f1np1 has MTU {mtu}, below fabric.mtu 9000; next:")
        assert "`sudo ip link set enp1s0f1np1 mtu 9000`" in problem


def test_a_head_with_the_smaller_mtu_is_the_one_to_fix(tmp_path):
    reference = {"node": "spark-1", "mtu": 1500, "paths": {"enp1s0f0np0": 1500}}
    worker = decide(
        settings("spark-2", SPARK2, "enp1s0f1np1", reference=reference),
        facts_of(tmp_path, "spark-2", [PortSpec("rocep1s0f1", address=SPARK2)], "enp1s0f1np1"),
    )
    (warning,) = worker.warnings
    assert "on spark-1: `sudo ip link set enp1s0f0np0 mtu 9000`" in warning and worker.problems == ()


def test_mtus_that_differ_on_one_node_warn_and_fabric_mtu_refuses_the_low_one(tmp_path):
    facts = facts_of(
        tmp_path, "spark-1", [*spark1_ports()[:2], PortSpec("roceP2p1s0f0", address="10.0.1.2", mtu=1500)]
    )
    decision = decide(settings(), facts)
    assert decision.problems == ()
    (within,) = decision.warnings
    assert within.startswith("spark-1: the fabric path's MTUs differ")
    assert "`sudo ip link set enP2p1s0f0np0 mtu 9000`" in within
    assert decide(settings(mtu_expected=1500), facts).problems == ()
    pinned = decide(settings(mtu_expected=9000), facts).problems
    assert [p.split(" has MTU")[0] for p in pinned] == ["spark-1: enP2p1s0f0np0"]
    assert "below fabric.mtu 9000" in pinned[0] and "mtu 9000`" in pinned[0]


def test_socket_interface_down_without_its_address_or_missing(tmp_path):
    facts = facts_of(tmp_path, "spark-1", [PortSpec("rocep1s0f0", address="10.9.9.9", operstate="down")])
    problems = decide(settings(), facts).problems
    assert any(
        "socket interface enp1s0f0np0 is down, not up; next: `sudo ip link set enp1s0f0np0 up`" in p
        for p in problems
    )
    assert any(
        "does not hold fabric_ip 192.168.200.12 (it holds 10.9.9.9); "
        "next: `sudo ip addr add 192.168.200.12/24" in p
        for p in problems
    )
    missing = decide(settings(socket="enp9s0"), facts_of(tmp_path, "other", spark1_ports(), ask="enp9s0"))
    assert len(missing.problems) == 1
    assert missing.problems[0].startswith(
        "spark-1: socket interface enp9s0 does not exist (interfaces seen: enP2p1s0f0np0"
    )


def test_enforce_refuses_with_every_problem_and_report_goes_on(tmp_path):
    facts = facts_of(tmp_path, "spark-1", [PortSpec("rocep1s0f0", state=DOWN, address=SPARK1)])
    decision = decide(settings(), facts)
    message = refusal(settings(), decision)
    assert message.startswith("fabric check on spark-1: the fabric is not fit for NCCL (1 problem(s)):")
    assert "fabric.check: enforce stops here" in message
    assert refusal(settings(mode=REPORT), decision) is None
    assert refusal(settings(), decide(settings(), facts_of(tmp_path, "two", spark1_ports()))) is None


@pytest.mark.parametrize(
    ("olds", "news", "updates"),
    [
        ({"mode": "enforce", "verdict": "pass"}, {"mode": "enforce"}, ()),
        ({"mode": "enforce", "gid": "unset"}, {"mode": "enforce", "gid": "resolve"}, ("gid",)),
        ({"reference": {"mtu": 9000}}, {"reference": {"mtu": 1500}}, ("reference",)),
        # A refresh recorded a failure: under enforce the next `up` checks again (and refuses).
        ({"mode": "enforce", "verdict": "fail"}, {"mode": "enforce"}, ("verdict",)),
        ({"mode": "report", "verdict": "fail"}, {"mode": "report"}, ()),
    ],
)
def test_plan_change(olds, news, updates):
    change = plan_change(olds, news)
    assert change.replaces == ()
    assert change.updates == updates
    assert change.changes == bool(updates)


def test_numbers_back_from_the_engine_as_floats_read_as_ints():
    # The engine hands a dynamic provider every number as a float.
    props = {
        "node": {"name": "spark-2"},
        "fabric_ip": SPARK2,
        "socket_ifname": "enp1s0f1np1",
        "mode": "enforce",
        "gid": 3.0,
        "mtu_expected": 9000.0,
        "reference": {"node": "spark-1", "mtu": 9000.0, "paths": {"enp1s0f0np0": 9000.0}},
    }
    from components.fabric_check import settings as to_settings
    from components.fabric_check import validate

    s = to_settings(props)
    assert (s.gid, s.mtu_expected, s.reference["mtu"], s.reference["paths"]) == (
        3,
        9000,
        9000,
        {"enp1s0f0np0": 9000},
    )
    assert all(type(v) is int for v in (s.gid, s.mtu_expected, s.reference["mtu"]))
    assert validate(props) == []
    assert [key for key, _ in validate({**props, "gid": "auto", "mode": "off"})] == ["mode", "gid"]
