"""FabricCheck carried out over SSH: run the facts program on the node, parse, decide (`plan.py`).
The only I/O of the package."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from components.fabric_check.errors import FabricCheckError
from components.fabric_check.facts import NodeFacts, parse_report
from components.fabric_check.plan import Decision, decide, refusal, settings
from components.fabric_check.programs import EXIT_HINTS, facts_argv, parse_stdout
from components.nodes import NodeDictError, checked_target
from components.remote import RemoteError, SshTransport, Transport

FACTS_TIMEOUT_S = 60


def node_transport(node: Mapping[str, Any]) -> Transport:
    """The SSH transport to the node of the `node` input."""
    try:
        return SshTransport(checked_target("FabricCheck node", node))
    except NodeDictError as exc:
        raise FabricCheckError(str(exc)) from None


def facts_report(props: Mapping[str, Any], transport: Transport | None = None) -> dict[str, Any]:
    """The facts program's report from the node (plain JSON values); RemoteError when it gave none."""
    transport = transport or node_transport(props["node"])
    argv = facts_argv(props)
    result = transport.run(argv, timeout=FACTS_TIMEOUT_S)
    report = parse_stdout(result.out) if result.returncode in (0, *EXIT_HINTS) else None
    if report is None:
        raise RemoteError(
            props["node"]["name"], argv, result.returncode, result.stderr,
            EXIT_HINTS.get(result.returncode, "the node needs python3 (every node program runs on it)"),
        )  # fmt: skip
    return report


def read_facts(props: Mapping[str, Any], transport: Transport | None = None) -> NodeFacts:
    """The node's fabric facts, read on the node."""
    return parse_report(props["node"]["name"], facts_report(props, transport))


def run_check(props: Mapping[str, Any], transport: Transport | None = None) -> Decision:
    """Read and decide; FabricCheckError when the fabric is refused (mode enforce)."""
    decision = decide(settings(props), read_facts(props, transport))
    message = refusal(settings(props), decision)
    if message:
        raise FabricCheckError(message)
    return decision
