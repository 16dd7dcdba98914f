"""The fabric probe's pure parts (argv, inputs, verdict) and its node program run here on loopback."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest

from components.fabric_check.plan import Decision, Settings, probe_input_problems, probe_verdict, with_probe
from components.fabric_check.programs import PROBE_HINTS, probe_argv, probe_spec
from components.layout import probe_input
from components.node_programs import fabric_probe
from components.node_programs.fabric_probe import Exit
from tests.support.ports import free_port
from tests.unit.test_fabric_check_config import parse, problems, without_pin

WORKER = Settings(node="node-b", fabric_ip="127.0.0.3", socket_ifname="enp1s0f1np1")
PROBE = {
    "head": {"name": "node-a"},
    "head_name": "node-a",
    "host": "127.0.0.2",
    "port": 29590,
    "min_gbps": None,
}


def test_the_spec_is_bounded_to_one_gib_or_three_seconds():
    spec = probe_spec(PROBE)
    assert spec == {
        "host": "127.0.0.2",
        "port": 29590,
        "deadline_s": 20.0,
        "max_bytes": 1 << 30,
        "max_s": 3.0,
    }
    argv = probe_argv("send", PROBE)
    assert argv[:3] == ["python3", "-I", "-S"] and argv[-2:] == ["send", json.dumps(spec, sort_keys=True)]
    with pytest.raises(ValueError, match="listen or send"):
        probe_argv("serve", PROBE)


def test_the_figure_is_bytes_over_the_listeners_seconds():
    verdict = probe_verdict(WORKER, PROBE, {"exit": 0, "bytes": 11_800_000_000, "seconds": 1.0}, {"exit": 0})
    assert verdict.line == "node-b → node-a 11.8 GB/s over enp1s0f1np1"
    assert verdict.gbytes_s == 11.8 and not verdict.problems and not verdict.warnings


def test_below_min_gbps_warns_and_does_not_refuse():
    # min_gbps is in Gb/s (a link's rate): 5 GB/s is 40 Gb/s, below a floor of 100 Gb/s.
    verdict = probe_verdict(
        WORKER, {**PROBE, "min_gbps": 100}, {"exit": 0, "bytes": 5e9, "seconds": 1.0}, {"exit": 0}
    )
    assert not verdict.problems
    (warning,) = verdict.warnings
    assert "5.0 GB/s over enp1s0f1np1 (40.0 Gb/s), below fabric.min_gbps 100 Gb/s" in warning
    assert "ethtool enp1s0f1np1" in warning


@pytest.mark.parametrize(
    "gbytes, floor, warns",
    [
        # 11.8 GB/s is 94.4 Gb/s: read as GB/s, a floor of 20 would wrongly warn.
        (11.8e9, 20, False),
        (11.8e9, 94.4, False),
        (11.8e9, 95, True),
        # The link that came up at 10 Gb/s instead of 200: 1.2 GB/s against a 150 Gb/s floor.
        (1.2e9, 150, True),
        (1.2e9, None, False),
    ],
)
def test_min_gbps_is_gigabits_against_the_figure_times_eight(gbytes, floor, warns):
    listened = {"exit": 0, "bytes": gbytes, "seconds": 1.0}
    verdict = probe_verdict(WORKER, {**PROBE, "min_gbps": floor}, listened, {"exit": 0})
    assert bool(verdict.warnings) is warns, verdict.warnings
    assert verdict.gbytes_s == round(gbytes / 1e9, 3)


def test_an_unreachable_head_is_a_problem_naming_both_nodes_and_the_address():
    listened = {"exit": int(Exit.NOT_LOCAL), "hint": PROBE_HINTS[Exit.NOT_LOCAL]}
    verdict = probe_verdict(WORKER, PROBE, listened, {"exit": int(Exit.UNREACHABLE)})
    assert verdict.line == "node-b → node-a unreachable at 127.0.0.2:29590"
    (problem,) = verdict.problems
    assert problem.startswith("node-b: cannot reach node-a's fabric address 127.0.0.2:29590")
    assert "correct nodes[].fabric_ip" in problem and "next:" in problem


def test_the_probe_joins_the_decision_as_problems_warnings_and_an_output():
    decision = Decision(ib_hca=("rocep1s0f1",), gid_index=None, gids={}, mtu=9000, paths={})
    verdict = probe_verdict(WORKER, PROBE, None, None)
    joined = with_probe(decision, verdict)
    assert joined.verdict == "fail" and joined.outputs()["throughput"]["gbytes_s"] is None
    # Refresh decides without a probe: `throughput` is left out, so the recorded one stays.
    assert "throughput" not in decision.outputs()


@pytest.mark.parametrize(
    "probe, expect",
    [
        (None, []),
        ({**PROBE, "port": 80}, ["port 80"]),
        ({**PROBE, "port": 29590.0}, []),
        ({**PROBE, "min_gbps": 0}, ["min_gbps 0"]),
        ({"host": "127.0.0.2"}, ["give head"]),
    ],
)
def test_probe_inputs(probe, expect):
    found = [reason for _key, reason in probe_input_problems(probe)]
    assert len(found) == len(expect) and all(e in f for e, f in zip(expect, found, strict=True)), found


def test_config_keys_default_and_validate():
    cfg = parse(without_pin())
    assert cfg.fabric.probe_port == 29590 and cfg.fabric.min_gbps is None
    head = {"name": cfg.head.name}
    assert probe_input(parse(without_pin(min_gbps=12.5)), head)["min_gbps"] == 12.5
    assert probe_input(cfg, head)["host"] == cfg.head.fabric_ip
    assert any("fabric.probe_port" in p for p in problems(without_pin(probe_port=22)))
    assert any("fabric.min_gbps" in p for p in problems(without_pin(min_gbps=-1)))


def run(verb: str, spec: dict) -> subprocess.Popen:
    argv = [sys.executable, fabric_probe.__file__, verb, json.dumps(spec)]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def outcome(proc: subprocess.Popen) -> tuple[int, dict]:
    out, _err = proc.communicate(timeout=30)
    return proc.returncode, json.loads(out.strip().splitlines()[-1])


def test_the_program_measures_a_bounded_copy_on_loopback():
    spec = {"host": "127.0.0.1", "port": free_port(), "deadline_s": 10, "max_bytes": 64 << 20, "max_s": 3}
    sender = run("send", spec)  # before the listener: the sender retries until it is up
    listener = run("listen", spec)
    (code_l, listened), (code_s, sent) = outcome(listener), outcome(sender)
    assert (code_l, code_s) == (0, 0), (listened, sent)
    assert listened["bytes"] == sent["bytes"] == 64 << 20 and listened["seconds"] > 0


def test_a_busy_port_and_a_silent_head_end_by_their_deadlines():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        spec = {
            "host": "127.0.0.1",
            "port": busy.getsockname()[1],
            "deadline_s": 2,
            "max_bytes": 1,
            "max_s": 1,
        }
        assert outcome(run("listen", spec))[0] == Exit.PORT_BUSY
    spec = {**spec, "port": free_port()}
    assert outcome(run("send", spec))[0] == Exit.UNREACHABLE
    assert outcome(run("listen", spec))[0] == Exit.NO_PEER


@pytest.mark.parametrize(
    ("changes", "expect"),
    [
        ({"serve": {"port": 29590}}, "29590 is serve.port too"),
        ({"ray": {"dashboard_port": 29590}}, "29590 is ray.dashboard_port too"),
        ({"fabric": {"probe_port": 6379}}, "6379 is ray.port too"),
        ({"cluster": {"executor": "mp", "master_port": 29590}}, "29590 is cluster.master_port too"),
        ({"nodes": {"ray_ports": {"min_worker_port": 29000, "max_worker_port": 29999}}},
         "29590 is inside nodes.0.ray_ports.min_worker_port–max_worker_port (29000–29999) too"),
        # What Ray binds on the head when config leaves it to Ray (the StackClaim claims both).
        ({"fabric": {"probe_port": 10001}}, "10001 is Ray's client server port"),
        ({"fabric": {"probe_port": 52365}}, "52365 is Ray's default dashboard agent port"),
        ({"fabric": {"probe_port": 29591}}, None),
        # No probe runs: nothing to collide with.
        ({"serve": {"port": 29590}, "fabric": {"check": "off"}}, None),
    ],
)  # fmt: skip
def test_the_probe_port_is_none_of_the_heads_other_ports(changes, expect):
    raw = without_pin()
    for section, keys in changes.items():
        if section == "nodes":
            raw["nodes"] = [{**raw["nodes"][0], **keys}, *raw["nodes"][1:]]
        else:
            raw[section] = {**(raw.get(section) or {}), **keys}
    if expect is None:
        parse(raw)  # valid
        return
    (problem,) = [p for p in problems(raw) if p.startswith("fabric.probe_port")]
    assert expect in problem and "choose another fabric.probe_port" in problem


@pytest.mark.parametrize(
    ("workers", "after"),
    [
        ([], {}),
        (["spark-2"], {"spark-2": None}),
        # Three or more nodes: one probe at a time on the head's one listener port.
        (["spark-2", "spark-3", "spark-4"], {"spark-2": None, "spark-3": "spark-2", "spark-4": "spark-3"}),
    ],
)
def test_worker_probes_run_one_after_another(workers, after):
    from components.fabric_check import probe_after

    assert probe_after(workers) == after
