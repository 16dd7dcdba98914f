"""The bench's pure decisions: what a change is (`plan_change`), whether it measures again, the floor
verdict on a report and the likely causes of a slow figure. No I/O: diff() uses these, and the tests
are tables.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from enum import Enum
from typing import Any

from components.nccl import on_sockets
from components.provider_kit.change import Change
from components.provider_kit.inputs import node_problems
from components.serve_bench.facts import CHUNKS_COUNTED

ENFORCE, REPORT = "enforce", "report"
# Inputs whose change means "measure again": what is measured (the image on every node, the
# server's exact argv, the node set, the endpoint and model, what each node's serving containers give
# NCCL: HCAs, GID index, IB on or off) and how (the bench settings).
MEASURE_KEYS = ("url", "model", "image_ids", "server_argv", "nodes", "nccl_env", "settings")
# Inputs whose change means "judge the recorded figures again": the same figures, other floors.
JUDGE_KEYS = ("floors", "mode")
# Inputs recorded in place without measuring: how the head is reached, where its log is.
RECORD_KEYS = ("node", "log_container")
# Not compared at all: `api_key` (a rotated key serves the same speed; the next run reads the new
# one from its inputs) and `fabric` (FabricCheck's figures, read only to explain a slow figure).
UPDATE_KEYS = (*MEASURE_KEYS, *JUDGE_KEYS, *RECORD_KEYS)
# Figures made from the count of generated tokens (a chunk count, without usage, makes them low).
TOKEN_COUNTED = ("decode_tps", "aggregate_tps")
# What each floor holds, as (figure, how it is said, unit, a ceiling rather than a floor).
FLOORS = {
    "min_decode_tps": ("decode_tps", "decode", "tokens/s", False),
    "min_prefill_tps": ("prefill_tps", "prefill", "tokens/s", False),
    "min_aggregate_tps": ("aggregate_tps", "aggregate", "tokens/s", False),
    "max_ttft_s": ("ttft_s", "time to first token", "s", True),
}
# The outputs a run records (read back unchanged by refresh).
OUTPUT_KEYS = (
    "figures",
    "nccl_network",
    "measured_at",
    "elapsed_s",
    "verdict",
    "shortfalls",
    "causes",
    "error",
)


def plan_change(olds: Mapping[str, Any], news: Mapping[str, Any]) -> Change:
    """From recorded state and new inputs, no I/O: an update for each changed input, never a
    replacement (nothing of the bench stays on a node)."""
    return Change(replaces=(), updates=tuple(key for key in UPDATE_KEYS if olds.get(key) != news.get(key)))


def measures_again(change: Change) -> bool:
    """Whether an update runs the bench again (what it measures changed), or only records the inputs."""
    return change.updates_any(MEASURE_KEYS)


class Action(Enum):
    """What an update does: measure, judge the recorded figures again, or record the inputs."""

    MEASURE = "measure"
    JUDGE = "judge"
    RECORD = "record"


def update_action(olds: Mapping[str, Any], news: Mapping[str, Any]) -> Action:
    """An update's action, no I/O. New floors or mode over recorded figures judge those again (a
    minute of the server's time would measure the same); with nothing recorded, it measures."""
    change = plan_change(olds, news)
    if measures_again(change):
        return Action.MEASURE
    if change.updates_any(JUDGE_KEYS):
        return Action.JUDGE if olds.get("figures") else Action.MEASURE
    return Action.RECORD


def recorded_report(olds: Mapping[str, Any]) -> dict[str, Any]:
    """The last run's report as its outputs recorded it: what `judged` reads."""
    return {key: olds.get(key) for key in ("figures", "nccl_network", "measured_at", "elapsed_s")}


def shortfalls(figures: Mapping[str, Any] | None, floors: Mapping[str, Any] | None) -> list[str]:
    """Each floor a figure misses, naming the figure, its value and the floor (a figure not measured
    misses its floor too)."""
    missed = []
    for key, floor in (floors or {}).items():
        if floor is None or key not in FLOORS:
            continue
        figure, said, unit, ceiling = FLOORS[key]
        value = (figures or {}).get(figure)
        if not isinstance(value, int | float):
            missed.append(f"{said} was not measured (bench.{key} {float(floor):g} {unit})")
        elif (value > float(floor)) if ceiling else (value < float(floor)):
            where = "above" if ceiling else "below"
            chunked = figure in TOKEN_COUNTED and (figures or {}).get("counted") == "chunks"
            missed.append(
                f"{said} {value:g} {unit} is {where} bench.{key} {float(floor):g} {unit}"
                + (f" ({CHUNKS_COUNTED})" if chunked else "")
            )
    return missed


def likely_causes(
    fabric: Mapping[str, Any] | None,
    nccl_network: str | None,
    nodes: Sequence[str],
    server_argv: Sequence[str] | None = None,
) -> list[str]:
    """What this stack can see that slows serving: NCCL's transport (from the server's log), each
    node's MTU and probe figure (FabricCheck's outputs), the serving flags; what it cannot see is
    named as a thing to check."""
    causes = []
    if len(nodes) > 1:
        causes.append(_nccl_cause(nccl_network))
        causes += _serving_causes(fabric)
        causes += _fabric_causes(fabric)
    argv = list(server_argv or [])
    if "--enforce-eager" in argv:
        causes.append("serve.enforce_eager is on: no CUDA graphs, so every decode step pays its launches")
    if "--speculative-config" not in argv:
        causes.append("speculative decoding is off (serve.speculative null): the recipe's MTP-1 is faster")
    causes.append(
        "other work on the GPUs or in unified memory during the bench (`nvidia-smi`, MemAvailable on "
        "every node), and the serving flags (serve.max_num_seqs, serve.kv_cache_dtype)"
    )
    return causes


def _nccl_cause(nccl_network: str | None) -> str:
    if nccl_network is None:
        return (
            "whether NCCL used RDMA is not known (the server's log has no `NCCL INFO Using network` "
            "line: NCCL_DEBUG=INFO prints it): NCCL on TCP sockets halves decode over two nodes"
        )
    if on_sockets(nccl_network):
        return (
            f"NCCL used network {nccl_network} (TCP sockets, not RDMA), per the server's log: see "
            "docs/fabric.md (the HCAs, /dev/infiniband in the containers, NCCL_IB_HCA)"
        )
    if nccl_network == "IB":
        return "NCCL used network IB (RDMA), per the server's log"
    # HPC-X's IBext*, UCX, AWS Libfabric: a network plugin, not the TCP fallback (NCCL names that Socket).
    return f"NCCL used network {nccl_network} (a network plugin, not TCP sockets), per the server's log"


def _serving_causes(fabric: Mapping[str, Any] | None) -> list[str]:
    """What each node's serving ranks logged about their transport, as the readiness gate read it
    (the stack output `fabric.serving`), a sockets verdict first."""
    serving = (fabric or {}).get("serving")
    if not isinstance(serving, Mapping) or not serving:
        return []
    causes = []
    for name, record in sorted(serving.items()):
        record = record if isinstance(record, Mapping) else {}
        said = record.get("said") or "not recorded"
        problems = record.get("problems") or []
        if record.get("verdict") == "fail":
            why = problems[0] if problems else "refused"
            causes.insert(0, f"the serving ranks on {name} said {said}: {why}")
        else:
            causes.append(f"the serving ranks on {name} said {said} (the readiness gate read their log)")
    return causes


def _fabric_causes(fabric: Mapping[str, Any] | None) -> list[str]:
    """Each node's MTU and the probe's figure, as FabricCheck recorded them."""
    nodes = (fabric or {}).get("nodes") or {}
    if not fabric or fabric.get("check") == "off" or not nodes:
        return [
            "fabric.check is off, so nothing here read the fabric: check each node's MTU (`ip link`), "
            "link speed (`ethtool`) and RoCE ports (`rdma link show`)"
        ]
    causes = []
    mtus = {name: (node or {}).get("mtu") for name, node in sorted(nodes.items())}
    said = ", ".join(f"{name} {mtu if mtu is not None else '?'}" for name, mtu in mtus.items())
    if len({m for m in mtus.values()}) > 1:
        causes.append(f"the fabric MTUs differ ({said}): NCCL runs each connection at the smaller MTU")
    else:
        causes.append(f"fabric MTU {said}")
    for name, node in sorted(nodes.items()):
        throughput = (node or {}).get("throughput") or {}
        if throughput.get("line"):
            causes.append(f"the last fabric probe: {throughput['line']} (TCP, not RDMA)")
        if (node or {}).get("verdict") == "fail":
            problems = "; ".join((node or {}).get("problems") or []) or "see the stack output `fabric`"
            causes.append(f"FabricCheck on {name} found problems (fabric.check report): {problems}")
    return causes


def judged(props: Mapping[str, Any], report: Mapping[str, Any] | None, error: str | None = None) -> dict:
    """The outputs of one run: the report's figures, the floors' verdict and the likely causes of a
    miss; `error` when nothing was measured."""
    figures = dict(report["figures"]) if report else None
    floors = props.get("floors") or {}
    missed = shortfalls(figures, floors) if figures else []
    if figures is None:
        verdict = "failed"
    elif missed:
        verdict = "below"
    else:
        verdict = "pass" if floors else "measured"
    network = (report or {}).get("nccl_network")
    causes = (
        likely_causes(props.get("fabric"), network, props.get("nodes") or [], props.get("server_argv"))
        if missed or error
        else []
    )
    return {
        "figures": figures,
        "nccl_network": network,
        "measured_at": (report or {}).get("measured_at"),
        "elapsed_s": (report or {}).get("elapsed_s"),
        "verdict": verdict,
        "shortfalls": missed,
        "causes": causes,
        "error": error,
    }


def validate(props: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(field, reason) for each input `check` refuses: no I/O; a value not known yet passes."""
    return node_problems(props, "node")
