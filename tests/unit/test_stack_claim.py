"""StackClaim: the pure collision rule, the ports a stack claims, the node program's records, and the
claim's place in the graph (before every volume and container on its node)."""

from __future__ import annotations

import copy
import json
import subprocess

import pytest

from components.config import RAY_CLIENT_SERVER_PORT, parse_stack_config
from components.layout import claimed_ports
from components.node_programs import program_argv
from components.node_programs.stack_claim import Exit, clashes
from components.stack_claim import StackClaimProvider, refusal
from tests.support.program import dev_raw, stack_config
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


def claims_with(**changes) -> list[list[list[int]]]:
    """Each node's claimed ports in the dev stack (two nodes) with sections merged in."""
    raw_config = dev_raw()
    for section, keys in changes.items():
        raw_config[section] = {**(raw_config.get(section) or {}), **keys}
    config = parse_stack_config(raw_config)
    return [claimed_ports(config, node) for node in config.nodes]


@pytest.mark.parametrize("executor", ["ray", "mp"])
def test_the_head_claims_the_fabric_probe_port_where_a_probe_runs(executor):
    head, worker = claims_with(fabric={"probe_port": 29600}, cluster={"executor": executor})
    assert [29600, 29600] in head and head == sorted(head)
    assert [29600, 29600] not in worker  # the worker only connects


def test_no_probe_port_without_the_check_or_without_a_worker():
    (head, worker) = claims_with(fabric={"check": "off"})
    assert [29590, 29590] not in head + worker
    raw_config = dev_raw()
    raw_config["nodes"] = raw_config["nodes"][:1]
    raw_config["serve"] = {**raw_config["serve"], "tensor_parallel_size": 1}
    config = parse_stack_config(raw_config)
    assert [29590, 29590] not in claimed_ports(config, config.head)
    assert [29590, 29590] in claims_with()[0]


def test_an_existing_stacks_new_probe_port_is_a_claim_update_not_a_replacement(tmp_path):
    # The stack before this version claimed the head's ports without the probe port.
    (head, _worker) = claims_with()
    before = [r for r in head if r != [29590, 29590]]
    olds = {"owner": "p/one", "prefix": "qwen35", "ports": before, "node": {"name": "spark-1"}}
    news = {**olds, "ports": head}
    diff = StackClaimProvider().diff("spark-1/p/one", olds, news)
    assert diff.changes is True and not diff.replaces
    # The update takes the claim again on the node: its own record grows, nothing is refused.
    assert run_program(tmp_path, "take", olds)[0] == 0
    assert run_program(tmp_path, "take", news) == (0, {"taken": True})
    assert run_program(tmp_path, "held", olds)[1]["record"]["ports"] == head
    # And another stack that would take the probe port over is refused, naming it.
    code, report = run_program(tmp_path, "take", {"owner": "p/two", "prefix": "b", "ports": [[29590, 29590]]})
    assert code == Exit.CLAIMED and report["clashes"][0]["clash"] == ["ports 29590"]


def test_a_changed_probe_port_changes_the_claim_and_no_container(monkeypatch):
    """The containers' inputs do not carry the claim's ports (only a dependency on the claim), so
    the engine updates the claim in place and replaces no container."""

    def graph(port: int):
        config = copy.deepcopy(stack_config("dev"))
        config["qwen35-spark:fabric"] = {**config["qwen35-spark:fabric"], "probe_port": port}
        return {r.name: r.inputs for r in run_graph(monkeypatch, config).run.resources}

    one, two = graph(29590), graph(29600)
    changed = sorted(name for name in one if one[name] != two[name])
    assert "qwen35-claim-spark-1" in changed, changed
    assert not [n for n in changed if n.startswith(("qwen35-ray", "qwen35-vllm"))], changed
    assert "qwen35-claim-spark-2" not in changed


def test_every_fabric_check_waits_for_its_nodes_claim_and_the_heads(monkeypatch):
    graph = run_graph(monkeypatch, copy.deepcopy(stack_config("dev")))
    assert "qwen35-claim-spark-1" in graph.deps["qwen35-fabric-spark-1"]
    assert {"qwen35-claim-spark-1", "qwen35-claim-spark-2"} <= graph.deps["qwen35-fabric-spark-2"]


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
    assert code == Exit.CLAIMED and report["clashes"][0]["owner"] == "p/one"
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


@pytest.mark.parametrize(
    ("answer", "held"),
    [
        ((0, {"held": True, "record": {"prefix": "qwen35"}}), True),
        ((0, {"held": True, "record": {"prefix": "other"}}), False),  # another stack's prefix now
        ((0, {"held": False}), False),
        ((0, {}), False),
    ],
)
def test_observe_and_ensure_read_the_programs_answer(monkeypatch, answer, held):
    from components.stack_claim import ClaimRefused, ensure, execute, observe

    props = {"owner": "p/one", "prefix": "qwen35", "ports": [[8000, 8000]], "node": {"name": "spark-1"}}
    monkeypatch.setattr(execute, "_run", lambda _props, _mode: answer)
    assert (observe(props) == props) is held
    assert ensure(props) == props
    clash = {"owner": "p/two", "clash": ["ports 8000"]}
    monkeypatch.setattr(execute, "_run", lambda _props, _mode: (Exit.CLAIMED, {"clashes": [clash]}))
    with pytest.raises(ClaimRefused) as raised:
        ensure(props)
    assert str(raised.value).startswith("spark-1: stack p/one cannot deploy here")
    assert "stack p/two: ports 8000" in str(raised.value)
