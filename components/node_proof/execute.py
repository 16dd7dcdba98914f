"""The node proof carried out: one short-lived container per node, all at once (they form one
group), over each node's SSH transport; the package's only I/O. `ensure` (create, update) runs
it; `observe` (refresh) never does. Every container is removed whatever happens (`--rm`, and a
forced removal after a run that did not end), so a proof leaves nothing on a node."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Mapping
from typing import Any

from components.nccl import parse_nccl_log
from components.node_programs.health_wire import mem_available
from components.node_proof.errors import NodeProofError
from components.node_proof.facts import HOST_KEYS, node_software
from components.node_proof.plan import ENFORCE, drift_said, judged, refusal, skipped
from components.node_proof.programs import (
    EXIT_HINTS,
    SOFTWARE_HINTS,
    proof_argv,
    proof_program,
    remove_argv,
    software_argv,
)
from components.nodes import transport_to
from components.provider_kit.reports import read_report, run_program
from components.remote import RemoteError, Transport

# Beyond the proof's own deadline (and the program's 15 s of grace): SSH, `docker run`, the removal.
TRANSPORT_SLACK_S = 60
REMOVE_TIMEOUT_S = 30
MEMINFO_TIMEOUT_S = 30
SOFTWARE_TIMEOUT_S = 60


def _remove(transport: Transport, props: Mapping[str, Any]) -> None:
    # Nothing there, or the node is gone: the next run removes it first.
    with contextlib.suppress(RemoteError):
        transport.run(remove_argv(props), timeout=REMOVE_TIMEOUT_S)


def run_node(props: Mapping[str, Any], entry: Mapping[str, Any], transport: Transport) -> dict[str, Any]:
    """One node's proof: its combined output and exit, or the error that kept it from running."""
    _remove(transport, props)  # a container a killed run left would refuse this one by name
    try:
        result = transport.run(
            proof_argv(props, entry),
            stdin=proof_program(),
            timeout=float(props["deadline_s"]) + TRANSPORT_SLACK_S,
        )
    except RemoteError as exc:
        _remove(transport, props)
        said = f"{exc.node}: {exc.hint}" if exc.hint else str(exc).splitlines()[0]
        return {"text": "", "report": None, "error": said, "exit": None}
    text = result.text + "\n" + result.stderr.decode(errors="replace")
    return {
        "report": read_report(result),
        "text": text,
        "exit": result.returncode,
        "stderr": result.err,
        "hint": EXIT_HINTS.get(result.returncode),
    }


def node_transports(
    props: Mapping[str, Any], given: Mapping[str, Transport] | None = None
) -> dict[str, Transport]:
    """Node -> its SSH transport (or the one `given`, in tests), made once for every step."""
    return {
        str(entry["name"]): (given or {}).get(str(entry["name"]))
        or transport_to("NodeProof node", entry["node"], NodeProofError)
        for entry in props["nodes"]
    }


def memory_short(props: Mapping[str, Any], transports: Mapping[str, Transport]) -> dict[str, int]:
    """Node -> MemAvailable for each node below `min_available_bytes` (none without the GPU step or
    that floor). Read with `cat /proc/meminfo`: on unified memory it is what the GPU has left too."""
    floor = props.get("min_available_bytes")
    if not props.get("gpu") or not floor:
        return {}
    short = {}
    for name, transport in transports.items():
        try:
            found = mem_available(transport.run(["cat", "/proc/meminfo"], timeout=MEMINFO_TIMEOUT_S).text)
        except RemoteError:
            found = None  # unknown: the proof's own steps will say what is wrong with the node
        if found is not None and found < float(floor):
            short[name] = found
    return short


def run_all(props: Mapping[str, Any], transports: Mapping[str, Transport]) -> dict[str, dict]:
    """Every node's proof at once (rank 0 on the head holds the group's store); node -> run."""
    runs: dict[str, dict] = {}
    threads = []
    for entry in props["nodes"]:
        name = str(entry["name"])
        transport = transports[name]

        def one(entry: Mapping[str, Any] = entry, transport: Transport = transport, name: str = name) -> None:
            try:
                runs[name] = run_node(props, entry, transport)
            except Exception as exc:  # noqa: BLE001 -- a thread's failure is that node's finding
                runs[name] = {"text": "", "error": f"{type(exc).__name__}: {exc}", "exit": None}

        threads.append(threading.Thread(target=one, daemon=True, name=f"node-proof-{name}"))
    for thread in threads:
        thread.start()
    bound = float(props["deadline_s"]) + TRANSPORT_SLACK_S + 2 * REMOVE_TIMEOUT_S + 10
    end = time.monotonic() + bound
    for thread in threads:
        # Each run is bounded by its own timeout; this only guards the guard, one deadline for all.
        thread.join(max(0.0, end - time.monotonic()))
    for entry in props["nodes"]:
        runs.setdefault(
            str(entry["name"]), {"text": "", "error": f"no answer within {bound:.0f}s", "exit": None}
        )
    return runs


def ensure(
    props: Mapping[str, Any],
    olds: Mapping[str, Any] | None = None,
    *,
    transports: Mapping[str, Transport] | None = None,
) -> dict[str, Any]:
    """Run the proof on every node and judge it: its outputs; NodeProofError under enforce when a
    node is refused (nothing recorded: the next `up` proves again)."""
    import pulumi  # here, not at the top: importing the package loads no Pulumi (provider_kit/lazy.py)

    transports = node_transports(props, transports)
    host = host_software(props, transports)
    short = memory_short(props, transports)
    if short:  # the serving containers hold the memory: the proof would compete with them
        outs = skipped(props, short)
        for line in outs["warnings"]:
            pulumi.log.warn(f"node proof: {line}")
        return {**props, **outs, **software_outputs(host, {})}
    runs = run_all(props, transports)
    outs = judged(props, runs, {name: parse_nccl_log(run.get("text") or "") for name, run in runs.items()})
    if outs["problems"] and props["mode"] == ENFORCE:
        raise NodeProofError(refusal(outs["problems"]))
    for line in outs["problems"]:
        pulumi.log.warn(f"node proof: {line} (fabric.node_proof: report: continuing)")
    for line in outs["warnings"]:
        pulumi.log.warn(f"node proof: {line}")
    figure = outs["busbw_gbs"]
    said = f"{figure:.2f} GB/s bus bandwidth" if figure is not None else "no bandwidth measured"
    pulumi.log.info(f"node proof: {outs['verdict']} on {len(runs)} node(s) over {outs['backend']}; {said}")
    return {**props, **outs, **software_outputs(host, runs)}


def host_software(props: Mapping[str, Any], transports: Mapping[str, Transport]) -> dict[str, dict | None]:
    """Node -> its host's software facts (`node_programs/node_software.py` over SSH, no container),
    or None where they could not be read (the node out of reach: its proof says why)."""
    found: dict[str, dict | None] = {}
    for entry in props["nodes"]:
        name = str(entry["name"])
        try:
            _, report = run_program(
                transports[name], software_argv(entry), timeout=SOFTWARE_TIMEOUT_S, hints=SOFTWARE_HINTS
            )
        except RemoteError:
            report = None
        found[name] = {key: report.get(key) for key in HOST_KEYS} if report else None
    return found


def software_outputs(host: Mapping[str, dict | None], runs: Mapping[str, Mapping[str, Any]]) -> dict:
    """`node_software` (what the proof ran under: the host's facts and the image's versions) and
    `observed_software` (the host's facts as read now: the same, until a refresh reads otherwise)."""
    software = {
        name: node_software(facts, (runs.get(name) or {}).get("report")) for name, facts in host.items()
    }
    return {"node_software": software, "observed_software": {name: dict(s) for name, s in software.items()}}


def observe(props: Mapping[str, Any], *, transports: Mapping[str, Transport] | None = None) -> dict[str, Any]:
    """Refresh: what `up` proved, unchanged (a proof is run by `up` alone: it claims the head's
    port and a GPU for seconds), with each node's host software read again (`observed_software`;
    a node out of reach keeps what was recorded). A change is drift: the next `up` proves again."""
    recorded = props.get("node_software") or {}
    host = host_software(props, node_transports(props, transports))
    observed = {
        name: {**(recorded.get(name) or {}), **(facts if facts is not None else {})}
        for name, facts in host.items()
    }
    outs = {**props, "observed_software": observed}
    import pulumi  # here, not at the top: see `ensure`

    for line in drift_said(outs):
        pulumi.log.warn(
            f"node proof: host software changed since the proof ({line}); the next `up` proves again"
        )
    return outs
