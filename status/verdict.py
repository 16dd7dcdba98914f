"""Judging `status` facts against the stack's declaration. Pure: facts in, cells and problems out.

Each problem names the node (or `cluster`), what is wrong, and the next step, in the words of the
troubleshooting and drift rows in docs/troubleshooting.md. `judge` assembles the verdict; each job is
a module of its own: `node_cells` (a node's cells), `fabric`, `serving` (Ray, the server, concurrency,
cold start), `watchdog` and `checks` (the bench and the answers recorded by `pulumi up`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from components.config import CheckMode, StackConfig
from components.layout import node_container_names
from components.vllm_server import vllm_container_name
from status.checks import answers_line, bench_line
from status.fabric import fabric_lines, judge_fabric, proof_line, serving_line
from status.node_cells import judge_node
from status.problem import Problem
from status.serving import cold_start_line, concurrency_line, judge_ray, judge_server
from status.watchdog import judge_watchdog


@dataclass
class Verdict:
    """Per-node cells (column -> text), cluster cells, operations in flight, and every problem."""

    nodes: dict[str, dict[str, str]] = field(default_factory=dict)
    cluster: dict[str, str] = field(default_factory=dict)
    operations: list[dict[str, Any]] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    # image.keep_previous, and the replaced images each node keeps for a rollback.
    retention: dict[str, Any] = field(default_factory=dict)
    # FabricCheck on: one line per node (ports, GID, MTU, the last measured speed).
    fabric: dict[str, str] = field(default_factory=dict)
    # What is worth a look but is not a difference from the declaration (a slow link): exit 0.
    warnings: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "nodes": self.nodes,
            "cluster": self.cluster,
            "operations": self.operations,
            "problems": [asdict(p) for p in self.problems],
            "retention": self.retention,
            "fabric": self.fabric,
            "warnings": [asdict(w) for w in self.warnings],
        }


def judge(config: StackConfig, facts: dict[str, Any]) -> Verdict:
    """The verdict on gathered facts (`status.gather.gather`) for this stack."""
    verdict = Verdict()
    head_report = facts["nodes"].get(config.head.name, {})
    containers = node_container_names(config)
    verdict.retention = {
        "keep_previous": config.image.keep_previous,
        "previous": {
            n.name: list(((facts["nodes"].get(n.name) or {}).get("image") or {}).get("previous") or [])
            for n in config.nodes
        },
    }
    for node in config.nodes:
        judge_node(config, node, facts["nodes"].get(node.name), head_report, containers[node.name], verdict)
    found: dict[str, str] = {}
    warned: list[Problem] = []
    verdict.problems += judge_fabric(config, verdict.nodes, facts["nodes"], found, warned)
    if config.fabric.check is not CheckMode.OFF:
        verdict.fabric, slow = fabric_lines(config, facts, found)
        verdict.warnings = warned + slow
    if config.fabric.proof is not CheckMode.OFF:
        verdict.cluster["node proof"], recorded = proof_line(facts.get("fabric_output") or {})
        verdict.warnings += recorded
    if len(config.nodes) > 1 and "fabric_output" in facts:
        verdict.cluster["serving transport"], refused = serving_line(facts["fabric_output"])
        verdict.warnings += refused
    verdict.problems += judge_ray(config, verdict.cluster, head_report)
    verdict.problems += judge_server(verdict.cluster, facts.get("server") or {}, vllm_container_name(config))
    verdict.cluster["concurrency"] = concurrency_line(config, head_report)
    verdict.problems += judge_watchdog(config, verdict.cluster, head_report)
    if config.answers.mode is not CheckMode.OFF:
        verdict.cluster["answers"], refused = answers_line(config, facts.get("answers_output") or {})
        verdict.warnings += refused
    if config.bench.mode is not CheckMode.OFF:
        verdict.cluster["bench"], slow = bench_line(config, facts.get("bench_output") or {})
        verdict.warnings += slow
    if "cold_start_output" in facts:
        watched = ((head_report.get("watchdog") or {}).get("state") or {}).get("cold_start")
        verdict.cluster["cold start"] = cold_start_line(
            facts["cold_start_output"], watched, head_report.get("now")
        )
    return verdict
