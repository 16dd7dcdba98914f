"""The claim carried out over SSH: take it, say whether it is still held, drop it. The only I/O of
the package."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from components.node_programs.stack_claim import Exit as ClaimExit
from components.nodes import transport_to
from components.remote import with_retries
from components.stack_claim.errors import ClaimRefused
from components.stack_claim.facts import claim_report, held_as_claimed
from components.stack_claim.plan import refusal
from components.stack_claim.programs import claim_argv

SSH_TIMEOUT_S = 60.0


def _run(props: Mapping[str, Any], mode: str) -> tuple[int, dict[str, Any]]:
    """Run the claim program in `mode` on the node: its exit status and its report."""
    transport = transport_to("StackClaim", props["node"])
    argv = claim_argv(props, mode)
    result = with_retries(lambda: transport.run(argv, timeout=SSH_TIMEOUT_S), deadline_s=20.0)
    if result.returncode not in (ClaimExit.OK, ClaimExit.CLAIMED):
        result.check(f"check that {transport.target.label} is reachable over SSH (`make status`)")
    return result.returncode, claim_report(result)


def ensure(props: Mapping[str, Any], olds: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Take the claim on the node; its outputs (the inputs), or ClaimRefused naming the other stack."""
    code, report = _run(props, "take")
    if code == ClaimExit.CLAIMED:
        name = props["node"]["name"]
        raise ClaimRefused(name, [], code, "", refusal(name, props["owner"], report.get("clashes") or []))
    return dict(props)


def observe(props: Mapping[str, Any]) -> dict[str, Any] | None:
    """The claim's outputs while the node still holds it with this prefix, None when it does not."""
    _, report = _run(props, "held")
    return dict(props) if held_as_claimed(report, props) else None


def release(props: Mapping[str, Any]) -> None:
    """Drop the claim on the node."""
    _run(props, "drop")
