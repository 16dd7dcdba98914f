"""The FabricCheck provider with the node replaced by this machine (LocalTransport): create refuses
under enforce and records under report; refresh (read) sees a port gone DOWN, a changed MTU and a
GID index that moved as changed outputs; check and diff do no I/O."""

from __future__ import annotations

import pytest

from components.fabric_check import FabricCheckError, FabricCheckProvider, execute
from components.remote import LocalTransport
from tests.support.fabric_trees import DOWN, PortSpec, spark_tree, write_tree

SPARK1 = "192.168.200.12"


@pytest.fixture
def transports(monkeypatch):
    """Every node is this machine; record which nodes were reached (diff and check reach none)."""
    reached: list[str] = []

    def local(node):
        reached.append(node["name"])
        return LocalTransport(name=node["name"])

    monkeypatch.setattr(execute, "node_transport", local)
    return reached


def props(root, **overrides) -> dict:
    return {
        "node": {"name": "spark-1", "host": "10.1.230.180", "known_hosts": "/dev/null"},
        "fabric_ip": SPARK1,
        "socket_ifname": "enp1s0f0np0",
        "mode": "enforce",
        "pin": None,
        "gid": "resolve",
        "mtu_expected": None,
        "sysfs_root": str(root),
        "reference": None,
        **overrides,
    }


def good_ports(**first) -> list[PortSpec]:
    return [PortSpec("rocep1s0f0", address=SPARK1, **first), PortSpec("rocep1s0f1", state=DOWN)]


def test_create_passes_and_records_what_nccl_is_given(tmp_path, transports):
    root = write_tree(tmp_path / "sys", spark_tree(good_ports()))
    created = FabricCheckProvider().create(props(root))
    assert created.id == "fabric-spark-1"
    outs = created.outs
    assert (outs["ib_hca"], outs["gid_index"], outs["mtu"], outs["verdict"]) == (
        ["rocep1s0f0:1"],
        3,
        9000,
        "pass",
    )
    assert transports == ["spark-1"]


def test_create_refuses_under_enforce_and_records_under_report(tmp_path, transports):
    root = write_tree(tmp_path / "sys", spark_tree(good_ports(state=DOWN)))
    with pytest.raises(FabricCheckError) as raised:
        FabricCheckProvider().create(props(root))
    assert "fabric check on spark-1" in str(raised.value)
    assert "no ACTIVE RDMA port (found: rocep1s0f0:1 1: DOWN" in str(raised.value)
    outs = FabricCheckProvider().create(props(root, mode="report")).outs
    assert outs["verdict"] == "fail" and outs["ib_hca"] == [] and outs["gid_index"] is None
    assert any("no ACTIVE RDMA port" in p for p in outs["problems"])


@pytest.mark.parametrize(
    ("after", "changed"),
    [
        (good_ports(state=DOWN), {"verdict": "fail", "ib_hca": [], "gid_index": None}),
        (good_ports(mtu=1500), {"mtu": 1500}),
        (good_ports(ipv6_global=True), {"gid_index": 5}),
    ],
)
def test_refresh_sees_drift_as_changed_outputs(tmp_path, transports, after, changed):
    root = tmp_path / "sys"
    write_tree(root, spark_tree(good_ports()))
    provider = FabricCheckProvider()
    outs = provider.create(props(root)).outs
    assert provider.read("fabric-spark-1", outs).outs == outs
    write_tree(root, spark_tree(after))
    read = provider.read("fabric-spark-1", outs)
    assert read.id == "fabric-spark-1"
    assert {key: read.outs[key] for key in changed} == changed
    assert {key for key in outs if outs[key] != read.outs[key]} >= set(changed)
    # Under enforce a recorded failure makes the next `up` check again (and refuse).
    assert provider.diff("fabric-spark-1", read.outs, props(root)).changes is (read.outs["verdict"] == "fail")


def test_check_and_diff_reach_no_node(tmp_path, transports):
    provider = FabricCheckProvider()
    base = props(tmp_path)
    assert provider.check({}, base).failures == []
    assert [f.property for f in provider.check({}, {**base, "gid": "auto"}).failures] == ["gid"]
    diff = provider.diff("fabric-spark-1", {**base, "verdict": "pass"}, {**base, "gid": "unset"})
    assert diff.changes and diff.replaces == []
    assert transports == []


def test_the_provider_pickles_by_reference_to_the_package():
    # Stacks hold it as the SDK serialized it: a reference to `components.fabric_check`, no code.
    import base64
    import pickletools

    import dill
    from pulumi.dynamic.dynamic import serialize_provider

    pickled = base64.b64decode(serialize_provider(FabricCheckProvider()))
    names = [arg for op, arg, _pos in pickletools.genops(pickled) if op.name == "SHORT_BINUNICODE"]
    assert names == ["components.fabric_check", "FabricCheckProvider"]
    assert type(dill.loads(pickled)) is FabricCheckProvider


class Answers:
    """A transport that answers every command with one Result (what the node said)."""

    name = "spark-1"

    def __init__(self, returncode: int, stdout: bytes = b"", stderr: bytes = b""):
        self.result = (returncode, stdout, stderr)

    def run(self, argv, stdin=None, timeout=None):
        from components.remote import Result

        return Result(tuple(argv), *self.result, node=self.name)


@pytest.mark.parametrize(
    ("answer", "error", "expect"),
    [
        # ssh itself failed: a transport failure, said as such.
        (
            Answers(255, stderr=b"ssh: connect to host 10.1.230.180 port 22: No route to host"),
            "RemoteError",
            "ssh",
        ),
        (Answers(127, stderr=b"python3: not found"), "RemoteError", "needs python3"),
        (Answers(2, stderr=b"usage: fabric_facts"), "RemoteError", "bad SPEC"),
        (
            Answers(
                3, stdout=b'{"error": "the node\'s addresses could not be read: ip: not found", "exit": 3}'
            ),
            "FabricCheckError",
            "needs python3 and `ip` (iproute2)",
        ),
    ],
)
def test_a_node_that_gives_no_report_says_why(tmp_path, answer, error, expect):
    from components.fabric_check import read_facts

    with pytest.raises(Exception) as raised:
        read_facts(props(tmp_path), transport=answer)
    assert type(raised.value).__name__ == error
    assert "spark-1" in str(raised.value) and expect in str(raised.value), str(raised.value)
