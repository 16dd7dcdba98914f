"""`status` with FabricCheck on: each node's fabric read as the check reads it (the real facts
program on trees written here) and judged by the check's own plan, the head's MTU the reference."""

from __future__ import annotations

from pathlib import Path

import pytest

from components.config import parse_stack_config
from components.remote import LocalTransport
from status import gather, render
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
        gathered["nodes"][node.name]["fabric"] = gather.fabric_facts(config, LocalTransport(), node.name)
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


def test_a_worker_whose_mtu_is_not_the_heads_is_a_warning_with_its_fix(tmp_path):
    # NCCL runs each connection at the smaller end's MTU: a mismatch works (slower), so it warns.
    config = fabric_config(tmp_path)
    trees = {"node-a": tree("127.0.0.2"), "node-b": tree("127.0.0.3", mtu=1500)}
    verdict = judge(config, gathered_with(config, trees))
    assert verdict.nodes["node-a"]["fabric"].startswith("ok")
    assert verdict.nodes["node-b"]["fabric"].startswith("ok")
    assert verdict.problems == []
    (warning,) = verdict.warnings
    assert warning.node == "node-b"
    assert "fabric MTU 1500" in warning.what and "but node-a's is 9000" in warning.what, warning.what
    assert warning.next.startswith("on node-b: `sudo ip link set")


def test_an_mtu_below_fabric_mtu_is_a_problem(tmp_path):
    config = fabric_config(tmp_path, mtu=9000)
    trees = {"node-a": tree("127.0.0.2"), "node-b": tree("127.0.0.3", mtu=1500)}
    verdict = judge(config, gathered_with(config, trees))
    assert verdict.nodes["node-b"]["fabric"] == "1 problem(s)"
    (problem,) = verdict.problems
    assert problem.node == "node-b" and "below fabric.mtu 9000" in problem.what


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
    monkeypatch.setattr(gather, "fabric_facts", lambda *a: asked.append(a) or {})
    monkeypatch.setattr(gather, "ask_node", lambda *a: {"reachable": False, "error": "down"})
    monkeypatch.setattr(gather, "server_facts", lambda *a: {})
    gathered = gather.gather(config, None, connect_timeout=1)
    assert asked == [] and all("fabric" not in n for n in gathered["nodes"].values())
    assert "fabric" not in render.text(judge(config, gathered), "lab")


@pytest.mark.parametrize("reachable", [True, False])
def test_gather_asks_each_reachable_node_for_its_fabric(tmp_path, monkeypatch, reachable):
    config = fabric_config(tmp_path)
    monkeypatch.setattr(gather, "fabric_facts", lambda cfg, transport, name: {"report": name})
    monkeypatch.setattr(gather, "ask_node", lambda *a: {"reachable": reachable})
    monkeypatch.setattr(gather, "server_facts", lambda *a: {})
    gathered = gather.gather(config, None, connect_timeout=1)
    expect = {"node-a": {"report": "node-a"}, "node-b": {"report": "node-b"}} if reachable else {}
    assert {n: r["fabric"] for n, r in gathered["nodes"].items() if "fabric" in r} == expect


def recorded(gbytes_s=11.8, line="node-b → node-a 11.8 GB/s over enp1s0f0np0") -> dict:
    """The stack output `fabric` as `pulumi stack output fabric --json` prints it after an `up`."""
    probe = {"line": line, "gbytes_s": gbytes_s, "problems": []}
    return {
        "output": {
            "check": "report",
            "nodes": {
                "node-a": {"ib_hca": ["rocep1s0f0:1"], "verdict": "pass", "throughput": None},
                "node-b": {"ib_hca": ["rocep1s0f0:1"], "verdict": "pass", "throughput": probe},
            },
        }
    }


def healthy_trees():
    return {"node-a": tree("127.0.0.2"), "node-b": tree("127.0.0.3")}


def test_one_fabric_line_per_node_with_the_last_measured_speed(tmp_path):
    config = fabric_config(tmp_path)
    gathered = gathered_with(config, healthy_trees()) | {"fabric_output": recorded()}
    verdict = judge(config, gathered)
    assert verdict.ok and verdict.warnings == [], (verdict.problems, verdict.warnings)
    assert verdict.fabric == {
        "node-a": "node-a: ports rocep1s0f0:1, GID 3, MTU 9000; the workers' probes end here",
        "node-b": "node-b: ports rocep1s0f0:1, GID 3, MTU 9000; node-b → node-a 11.8 GB/s over enp1s0f0np0",
    }
    text = render.text(verdict, "lab")
    assert "\n  node-b: ports rocep1s0f0:1, GID 3, MTU 9000; node-b → node-a 11.8 GB/s" in text
    # The figure is the TCP probe's, named for what it is.
    assert "TCP probe: reachability and a floor on socket throughput, not RDMA" in text
    assert "warning" not in text and text.endswith("everything is as declared\n")
    assert verdict.as_dict()["fabric"] == verdict.fabric


@pytest.mark.parametrize(
    ("min_gbps", "warns"),
    [
        # 11.8 GB/s is 94.4 Gb/s: fabric.min_gbps is in Gb/s, a link's rate.
        (None, False),
        (90, False),
        (94.4, False),
        (100, True),
        (200, True),
    ],
)
def test_a_speed_below_min_gbps_warns_and_status_still_passes(tmp_path, min_gbps, warns):
    config = fabric_config(tmp_path, **({} if min_gbps is None else {"min_gbps": min_gbps}))
    verdict = judge(config, gathered_with(config, healthy_trees()) | {"fabric_output": recorded()})
    assert verdict.ok, verdict.problems  # a slow link is a warning: exit 0
    assert bool(verdict.warnings) is warns
    if warns:
        (warning,) = verdict.warnings
        assert warning.node == "node-b"
        assert warning.what == (
            f"node-b → node-a 11.8 GB/s over enp1s0f0np0 (94.4 Gb/s), below fabric.min_gbps {min_gbps:g} Gb/s"
        )
        assert warning.next.startswith("check the link speed of enp1s0f0np0 on both nodes (`ethtool")
        text = render.text(verdict, "lab")
        assert "1 warning(s):\nnode-b: node-b → node-a 11.8 GB/s" in text


@pytest.mark.parametrize(
    ("output", "speed"),
    [
        ({"error": "no Pulumi CLI here to read the stack output `fabric`"},
         "last speed unknown (no Pulumi CLI here to read the stack output `fabric`)"),
        (None, "last speed unknown (not asked)"),
        (recorded(gbytes_s=None, line="node-b → node-a unreachable at 127.0.0.2:29590"),
         "node-b → node-a unreachable at 127.0.0.2:29590"),
        ({"output": {"check": "report", "nodes": {"node-b": {"throughput": None}}}},
         "no probe recorded (`pulumi up` records one once the node's check passes)"),
    ],
)  # fmt: skip
def test_the_speed_when_no_figure_was_recorded(tmp_path, output, speed):
    config = fabric_config(tmp_path, min_gbps=100)
    gathered = gathered_with(config, healthy_trees())
    if output is not None:
        gathered["fabric_output"] = output
    verdict = judge(config, gathered)
    assert verdict.fabric["node-b"] == f"node-b: ports rocep1s0f0:1, GID 3, MTU 9000; {speed}"
    assert verdict.warnings == []


def test_a_node_whose_facts_were_not_read_keeps_its_line(tmp_path):
    config = fabric_config(tmp_path)
    gathered = gathered_with(config, healthy_trees()) | {"fabric_output": recorded()}
    gathered["nodes"]["node-b"]["fabric"] = {"error": "the node needs `ip` (iproute2) with JSON output"}
    verdict = judge(config, gathered)
    assert verdict.fabric["node-b"] == (
        "node-b: fabric facts not read; node-b → node-a 11.8 GB/s over enp1s0f0np0"
    )


def test_with_the_check_off_there_is_no_fabric_line():
    config = parse_stack_config({k.split(":", 1)[1]: v for k, v in stack_config("lab").items()})
    verdict = judge(config, healthy() | {"fabric_output": recorded()})
    assert verdict.fabric == {} and "fabric (" not in render.text(verdict, "lab")


def fake_cli(tmp_path, script: str) -> str:
    cli = tmp_path / "pulumi"
    cli.write_text("#!/bin/sh\n" + script)
    cli.chmod(0o755)
    return str(cli)


def test_the_stack_output_is_read_with_the_pulumi_cli(tmp_path):
    printed = '{"check": "enforce", "nodes": {"node-b": {"throughput": {"gbytes_s": 11.8}}}}'
    cli = fake_cli(
        tmp_path,
        f'[ "$1 $2 $3 $4 $5 $6" = "stack output fabric --json --stack lab" ] && echo \'{printed}\' '
        '&& exit 0\necho "error: no stack named lab" >&2; exit 255\n',
    )
    got = gather.stack_fabric("lab", cwd=tmp_path, which=lambda _: cli)
    assert got == {"output": {"check": "enforce", "nodes": {"node-b": {"throughput": {"gbytes_s": 11.8}}}}}
    missing = gather.stack_fabric("dev", cwd=tmp_path, which=lambda _: cli)
    assert missing == {"error": "`pulumi stack output fabric --stack dev`: error: no stack named lab"}
    nothing_built = {"QWEN35_CACHE": str(tmp_path)}
    assert "no Pulumi CLI" in gather.stack_fabric("lab", which=lambda _: None, env=nothing_built)["error"]
    assert gather.stack_fabric("lab", cwd=tmp_path, which=lambda _: fake_cli(tmp_path, "echo oops\n")) == {
        "error": "`pulumi stack output fabric` printed no JSON"
    }


@pytest.mark.parametrize("stack", ["lab", None])
def test_gather_reads_the_stack_output_where_a_stack_is_named(tmp_path, monkeypatch, stack):
    config = fabric_config(tmp_path)
    asked = []
    monkeypatch.setattr(gather, "stack_fabric", lambda name: asked.append(name) or {"output": {}})
    monkeypatch.setattr(gather, "fabric_facts", lambda *a: {})
    monkeypatch.setattr(gather, "ask_node", lambda *a: {"reachable": True})
    monkeypatch.setattr(gather, "server_facts", lambda *a: {})
    gathered = gather.gather(config, None, connect_timeout=1, stack=stack)
    assert asked == ([stack] if stack else [])
    assert ("fabric_output" in gathered) is bool(stack)


def test_status_names_its_stack_to_gather(tmp_path, monkeypatch):
    from status import __main__ as cli

    config = fabric_config(tmp_path)
    seen = {}
    monkeypatch.setattr(gather, "load_config", lambda path: config)
    monkeypatch.setattr(gather, "api_key", lambda stack: (None, ""))
    monkeypatch.setattr(gather, "gather", lambda cfg, key, **kw: seen.update(kw) or healthy())
    cli.main(["--file", str(tmp_path / "Pulumi.edge.yaml")])
    assert seen["stack"] == "edge"
