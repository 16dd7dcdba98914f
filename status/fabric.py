"""The fabric's cells and rows: each node's fabric as its FabricCheck would judge it now, the last
probe's figures, and what the last `pulumi up` recorded of the node proof and the serving transport."""

from __future__ import annotations

from typing import Any

from components.config import StackConfig
from components.fabric_check import FabricCheckError, decide, node_facts, settings
from components.fabric_check.plan import Decision, floor_warning
from components.layout import fabric_check_inputs
from status.problem import OK, Problem, first_line


def _fabric_problem(node: str, text: str) -> Problem:
    """One of FabricCheck's problem lines (`node: what; next: step`) as a Problem."""
    what, _, step = text.removeprefix(f"{node}: ").partition("; next: ")
    return Problem(node, what, step or "see docs/troubleshooting.md, `fabric check on … is not fit for NCCL`")


def judge_fabric(
    config: StackConfig,
    cells: dict[str, dict[str, str]],
    reports: dict[str, Any],
    found: dict[str, str] | None = None,
    warned: list[Problem] | None = None,
) -> list[Problem]:
    """Each node's fabric as its FabricCheck would judge it now (the head first: its MTU is the
    workers' reference), into `found` what it found (`ports …, GID …, MTU …`) and into `warned` its
    warnings (MTUs that differ); nothing when `fabric.check` is off (no report was asked)."""
    found = {} if found is None else found
    warned = [] if warned is None else warned
    problems: list[Problem] = []
    reference = None
    for node in [config.head, *config.workers]:
        fabric = (reports.get(node.name) or {}).get("fabric")
        if fabric is None:
            continue
        if fabric.get("error"):
            cells[node.name]["fabric"] = "unknown"
            # The error's hint is the next step (python3, iproute2, ssh).
            problems.append(
                Problem(node.name, "its fabric facts could not be read", first_line(fabric["error"]))
            )
            continue
        props = {**fabric_check_inputs(config, node, {"name": node.name}), "reference": reference}
        try:
            decision = decide(settings(props), node_facts(node.name, fabric["report"]))
        except FabricCheckError as exc:
            cells[node.name]["fabric"] = "unknown"
            what, _, step = str(exc).removeprefix(f"{node.name}: ").partition("\n  next: ")
            problems.append(Problem(node.name, what, step))
            continue
        if node is config.head:
            reference = {"node": node.name, "mtu": decision.mtu, "paths": dict(decision.paths)}
        found[node.name] = (
            f"ports {', '.join(decision.ib_hca) or 'none'}, {_gid_text(decision)}, MTU {decision.mtu or '?'}"
        )
        gid = "" if decision.gid_index is None else f" gid {decision.gid_index}"
        shown = f"{','.join(decision.ib_hca) or 'no HCA'} mtu {decision.mtu}{gid}"
        cells[node.name]["fabric"] = (
            OK + f" ({shown})" if not decision.problems else f"{len(decision.problems)} problem(s)"
        )
        problems += [_fabric_problem(node.name, text) for text in decision.problems]
        warned += [_fabric_problem(node.name, text) for text in decision.warnings]
    return problems


def _gid_text(decision: Decision) -> str:
    """`GID 3` where the used ports share one RoCE v2 IPv4 index (the one given, under resolve or a
    pin), else each port's; `GID none` where none was found."""
    if decision.gid_index is not None:
        return f"GID {decision.gid_index}"
    found = set(decision.gids.values())
    if not found or found == {None}:
        return "GID none"
    if len(found) == 1:
        return f"GID {found.pop()}"
    return "GIDs " + ", ".join(f"{hca} {index}" for hca, index in decision.gids.items())


def _recorded_speed(config: StackConfig, recorded: dict[str, Any], name: str) -> tuple[str, Problem | None]:
    """The last probe's figure as the stack output `fabric` recorded it (`pulumi up` measured it;
    `status` sends nothing), and a warning when it is below `fabric.min_gbps` (Gb/s)."""
    if name == config.head.name:
        return ("the workers' probes end here" if config.workers else "no probe (one node)"), None
    if recorded.get("error") or not isinstance(recorded.get("output"), dict):
        return f"last speed unknown ({first_line(recorded.get('error') or 'not asked')})", None
    node = ((recorded["output"].get("nodes") or {}).get(name)) or {}
    throughput = node.get("throughput")
    if not isinstance(throughput, dict) or not throughput.get("line"):
        return "no probe recorded (`pulumi up` records one once the node's check passes)", None
    line, rate = str(throughput["line"]), throughput.get("gbytes_s")
    if not isinstance(rate, int | float):
        return line, None
    declared = next((n for n in config.nodes if n.name == name), None)
    ifname = config.socket_ifname(declared) if declared else config.fabric.socket_ifname
    slow = floor_warning(name, line, float(rate), config.fabric.min_gbps, ifname)
    return line, _fabric_problem(name, slow) if slow else None


def fabric_lines(
    config: StackConfig, facts: dict[str, Any], found: dict[str, str]
) -> tuple[dict[str, str], list[Problem]]:
    """One line per node, e.g. `node-b: ports rocep1s0f1:1, GID 3, MTU 9000; node-b → node-a
    11.8 GB/s over enp1s0f1np1`: the ports, GID and MTU read now, the TCP probe's figure the last
    `up` measured (the stack output `fabric`); and a warning per figure below `fabric.min_gbps`. `found`: each
    node's `ports …, GID …, MTU …` as `judge_fabric` judged them."""
    lines: dict[str, str] = {}
    warnings: list[Problem] = []
    recorded = facts.get("fabric_output") or {}
    for node in [config.head, *config.workers]:
        speed, slow = _recorded_speed(config, recorded, node.name)
        lines[node.name] = f"{node.name}: {found.get(node.name, 'fabric facts not read')}; {speed}"
        warnings += [slow] if slow else []
    return lines, warnings


PROOF_NEXT = (
    "see docs/fabric.md (the node proof); `pulumi up` proves again once an image or a node's NCCL "
    "settings change"
)


def proof_line(recorded: dict[str, Any]) -> tuple[str, list[Problem]]:
    """The `node proof` row: the verdict the last `pulumi up` recorded (the stack output
    `fabric.proof`: each node's transport as NCCL named it, the group's bus bandwidth), and a warning
    per problem it recorded (under `fabric.node_proof: report`)."""
    output = recorded.get("output")
    proof = output.get("proof") if isinstance(output, dict) else None
    if recorded.get("error") or not isinstance(proof, dict):
        return f"not recorded ({first_line(recorded.get('error') or 'no proof in the stack output')})", []
    if not proof.get("verdict"):
        return "not run yet (the next `pulumi up` runs it before any serving container)", []
    if proof["verdict"] == "skipped":  # the serving containers held the memory at the last `up`
        said = "; ".join(str(w).split(" (the serving containers")[0] for w in proof.get("warnings") or [])
        return f"skipped by the last `pulumi up` ({said}): nothing proved then", []
    results = proof.get("results") or {}
    nets = ", ".join(
        f"{name} {r.get('network') or '?'}" + (f" ({', '.join(r['hcas'])})" if r.get("hcas") else "")
        for name, r in results.items()
    )
    figure = proof.get("busbw_gbs")
    speed = f"{figure:.2f} GB/s bus bandwidth" if isinstance(figure, int | float) else "no bandwidth measured"
    line = (
        f"{proof['verdict']} over {proof.get('backend')}: {nets}; {speed}{kernels_said(results)} "
        "(proved by `pulumi up`, not now)"
    )
    problems = [Problem("cluster", f"node proof: {p}", PROOF_NEXT) for p in proof.get("problems") or []]
    return line, problems


def serving_line(recorded: dict[str, Any]) -> tuple[str, list[Problem]]:
    """The `serving transport` row: what each node's serving ranks logged about their transport at
    the last `pulumi up` (the stack output `fabric.serving`, read by the readiness gate), and a warning
    per node whose ranks used sockets while HCAs were given."""
    output = recorded.get("output")
    serving = output.get("serving") if isinstance(output, dict) else None
    if recorded.get("error") or not isinstance(serving, dict) or not serving:
        why = recorded.get("error") or "no `serving` in the stack output `fabric`"
        return f"not recorded ({first_line(why)}): the next `pulumi up` reads the ranks' logs", []
    said = "; ".join(
        f"{name} {(r or {}).get('said') or '?'}" + (" (FAIL)" if (r or {}).get("verdict") == "fail" else "")
        for name, r in sorted(serving.items())
    )
    problems = [
        Problem("cluster", f"serving ranks on {name}: {p}", PROOF_NEXT)
        for name, r in sorted(serving.items())
        if (r or {}).get("verdict") == "fail"
        for p in (r or {}).get("problems") or []
    ]
    return f"{said} (their logs, read by `pulumi up`'s readiness gate)", problems


def kernels_said(results: dict[str, Any]) -> str:
    """The kernels each node's proof ran, as `; kernels: NODE op KERNEL (state), …` (none: empty)."""
    said = [
        f"{name} {op} {(found or {}).get('kernel') or '-'} ({(found or {}).get('state')})"
        for name, result in results.items()
        for op, found in ((result or {}).get("kernels") or {}).items()
        if (found or {}).get("state") != "not callable alone"
    ]
    return f"; kernels: {', '.join(said)}" if said else ""
