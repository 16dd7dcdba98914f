"""FabricCheck carried out over SSH: run the facts program on the node, parse, decide (`plan.py`).
The only I/O of the package: `ensure` (create, update: the check, refused under enforce) and
`observe` (refresh: the facts again, never refused); a check leaves nothing to release."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from components.fabric_check.errors import FabricCheckError
from components.fabric_check.facts import NodeFacts, node_facts
from components.fabric_check.plan import Decision, Probe, decide, probe_verdict, refusal, settings, with_probe
from components.fabric_check.programs import (
    EXIT_HINTS,
    PROBE_DEADLINE_S,
    PROBE_HINTS,
    facts_argv,
    probe_argv,
)
from components.nodes import transport_to
from components.provider_kit.reports import read_report, run_program
from components.remote import RemoteError, Transport

FACTS_TIMEOUT_S = 60


def node_transport(node: Mapping[str, Any]) -> Transport:
    """The SSH transport to the node of the `node` input."""
    return transport_to("FabricCheck node", node, FabricCheckError)


def facts_report(props: Mapping[str, Any], transport: Transport | None = None) -> dict[str, Any]:
    """The facts program's report from the node (plain JSON values); RemoteError when it gave none."""
    transport = transport or node_transport(props["node"])
    _, report = run_program(
        transport, facts_argv(props), timeout=FACTS_TIMEOUT_S, hints=EXIT_HINTS, accept=(0, *EXIT_HINTS)
    )
    return report


def read_facts(props: Mapping[str, Any], transport: Transport | None = None) -> NodeFacts:
    """The node's fabric facts, read on the node."""
    return node_facts(props["node"]["name"], facts_report(props, transport))


def _probe_end(transport: Transport, argv: list[str], into: dict[str, Any], hints: Mapping) -> None:
    """Run one end of the probe; its report (with the hint for its exit status) lands in `into`."""
    try:
        result = transport.run(argv, timeout=PROBE_DEADLINE_S + 30)
    except RemoteError as exc:  # a transport failure: no report, the verdict says unreachable
        into["report"] = {"exit": None, "hint": str(exc).splitlines()[0]}
        return
    report = read_report(result) or {"exit": result.returncode}
    hint = hints.get(result.returncode)
    into["report"] = {**report, **({"hint": hint} if hint else {})}


def probe_head(
    props: Mapping[str, Any], transport: Transport | None = None, head: Transport | None = None
) -> Probe:
    """The worker's probe to the head: the listener on the head (in a thread), the sender here."""
    probe = props["probe"]
    head = head or node_transport(probe["head"])
    listened: dict[str, Any] = {}
    listener = threading.Thread(
        target=_probe_end, args=(head, probe_argv("listen", probe), listened, PROBE_HINTS), daemon=True
    )
    listener.start()
    sent: dict[str, Any] = {}
    _probe_end(transport or node_transport(props["node"]), probe_argv("send", probe), sent, {})
    listener.join(PROBE_DEADLINE_S + 40)  # bounded: the listener's own deadline ends it first
    return probe_verdict(settings(props), probe, listened.get("report"), sent.get("report"))


def _checked(props: Mapping[str, Any], transport: Transport | None = None) -> Decision:
    """Read and decide, then (on a worker) probe the head; FabricCheckError when the fabric is
    refused (mode enforce)."""
    decision = decide(settings(props), read_facts(props, transport))
    if props.get("probe") and not decision.problems:
        decision = with_probe(decision, probe_head(props, transport))
    message = refusal(settings(props), decision)
    if message:
        raise FabricCheckError(message)
    return decision


def ensure(
    props: Mapping[str, Any], olds: Mapping[str, Any] | None = None, *, transport: Transport | None = None
) -> dict[str, Any]:
    """Check the node's fabric (`_checked`), tell the operator what it found, and return the check's
    outputs (the inputs and the decision's); FabricCheckError when refused (mode enforce)."""
    import pulumi  # here, not at the top: `status` reads facts with this module, and no Pulumi

    decision = _checked(props, transport)
    if decision.problems:  # mode report: recorded, and `up` goes on
        pulumi.log.warn("\n".join(decision.problems) + "\n  (fabric.check: report: continuing)")
    if decision.warnings:  # MTUs that differ, a slow link (below fabric.min_gbps): either mode
        pulumi.log.warn("\n".join(decision.warnings))
    if decision.throughput:
        pulumi.log.info(f"fabric probe: {decision.throughput['line']}")
    return {**props, **decision.outputs()}


def observe(props: Mapping[str, Any], *, transport: Transport | None = None) -> dict[str, Any]:
    """The check's outputs as the node shows them now (a port gone DOWN, a new MTU, a GID index that
    moved), never refused: the next `up` does (plan_change). No probe runs."""
    decision = decide(settings(props), read_facts(props, transport))
    return {**props, **decision.outputs()}
