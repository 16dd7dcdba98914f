"""StackClaim: the pure collision rule, the ports a stack claims, the node program's records, and the
claim's place in the graph (before every volume and container on its node)."""

from __future__ import annotations

import copy
import json
import subprocess

import pytest

from components.config import parse_stack_config
from components.node_programs import program_argv
from components.node_programs.stack_claim import EXIT_CLAIMED, clashes
from components.stack_claim import RAY_CLIENT_SERVER_PORT, claimed_ports, refusal
from tests.support.program import stack_config
from tests.unit.test_deployment import run_graph


def raw(name: str) -> dict:
    return {k.split(":", 1)[1]: v for k, v in stack_config(name).items()}


@pytest.mark.parametrize(
    ("other", "expected"),
    [
        ({"owner": "p/b", "prefix": "other", "ports": [[9000, 9000]]}, []),
        ({"owner": "p/b", "prefix": "qwen35", "ports": []}, [["containers qwen35-*"]]),
        ({"owner": "p/b", "prefix": "x", "ports": [[8000, 8000]]}, [["ports 8000"]]),
        ({"owner": "p/b", "prefix": "x", "ports": [[17250, 17400]]}, [["ports 17250-17299"]]),
        ({"owner": "p/a", "prefix": "qwen35", "ports": [[8000, 8000]]}, []),  # its own claim
    ],
)
def test_clashes(other, expected):
    mine = {"owner": "p/a", "prefix": "qwen35", "ports": [[8000, 8000], [17200, 17299]]}
    assert [c["clash"] for c in clashes(mine, [other])] == expected


def test_the_lab_head_claims_its_ray_and_server_ports():
    config = parse_stack_config(raw("lab"))
    head, worker = config.nodes
    ports = claimed_ports(config, head)
    for port in (16379, 18265, 18000, 17101, RAY_CLIENT_SERVER_PORT):
        assert [port, port] in ports, ports
    assert [17200, 17299] in ports
    assert [18000, 18000] not in claimed_ports(config, worker)


def test_the_refusal_names_the_other_stack_and_the_way_out():
    text = refusal(
        "node-a", "qwen35-spark/two", [{"owner": "qwen35-spark/one", "clash": ["containers qwen35-*"]}]
    )
    assert "node-a: stack qwen35-spark/two cannot deploy here" in text
    assert "stack qwen35-spark/one: containers qwen35-*" in text
    assert "containers.name_prefix" in text
    assert "remove ~/.qwen35/stacks/qwen35-spark--one.json on node-a" in text


def run_program(home, mode: str, spec: dict) -> tuple[int, dict]:
    done = subprocess.run(
        program_argv("stack_claim", [mode, json.dumps(spec)]),
        env={"HOME": str(home), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=False,
    )
    return done.returncode, json.loads(done.stdout)


def test_the_node_program_takes_refuses_and_drops(tmp_path):
    one = {"owner": "p/one", "prefix": "qwen35", "ports": [[8000, 8000]]}
    assert run_program(tmp_path, "take", one) == (0, {"taken": True})
    assert run_program(tmp_path, "take", one) == (0, {"taken": True})  # again: its own claim
    code, report = run_program(tmp_path, "take", {**one, "owner": "p/two", "ports": []})
    assert code == EXIT_CLAIMED and report["clashes"][0]["owner"] == "p/one"
    assert run_program(tmp_path, "take", {"owner": "p/two", "prefix": "b", "ports": [[8001, 8001]]})[0] == 0
    assert run_program(tmp_path, "held", one)[1]["held"] is True
    assert run_program(tmp_path, "drop", {"owner": "p/two"}) == (0, {"dropped": True})
    assert run_program(tmp_path, "held", one)[1]["record"]["prefix"] == "qwen35"  # the other stays
    assert run_program(tmp_path, "take", {"owner": "bad owner"})[0] == 6


def test_every_volume_and_container_waits_for_its_nodes_claim(monkeypatch):
    graph = run_graph(monkeypatch, copy.deepcopy(stack_config("dev")))
    for name in ("qwen35-ray-tmp", "qwen35-compile-cache-spark-1", "qwen35-ray-head", "qwen35-vllm"):
        assert "qwen35-claim-spark-1" in graph.deps[name], (name, graph.deps[name])
    for name in ("qwen35-compile-cache-spark-2", "qwen35-ray-worker-spark-2"):
        assert "qwen35-claim-spark-2" in graph.deps[name], (name, graph.deps[name])
    (claim,) = [r for r in graph.run.resources if r.name == "qwen35-claim-spark-1"]
    assert claim.inputs["prefix"] == "qwen35" and "/" in claim.inputs["owner"]


def test_nothing_is_copied_before_every_nodes_claim(monkeypatch):
    graph = run_graph(monkeypatch, copy.deepcopy(stack_config("dev")))
    claims = {"qwen35-claim-spark-1", "qwen35-claim-spark-2"}
    for name in ("qwen35-image-spark-1", "qwen35-image-spark-2", "qwen35-checkpoint-spark-1"):
        assert claims <= graph.deps[name], (name, graph.deps[name])
