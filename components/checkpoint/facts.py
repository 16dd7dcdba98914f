"""What a node holds of a checkpoint, and what the Hub says a branch points at: reads, never changes.

Each fact is a node program's JSON report (`programs.py` builds the argument lists); the decisions
on them are in `plan.py`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from components.checkpoint import programs
from components.checkpoint.plan import CheckpointError, Manifest
from components.nodes import NodeDictError, checked_target
from components.remote import SSH_TRANSPORT_FAILURE, RemoteError, Result, SshTarget, SshTransport, stderr_tail


def node_target(raw: Mapping[str, Any], role: str) -> SshTarget:
    """How to reach the node of a node dict; CheckpointError naming `role` when it cannot be used."""
    try:
        return checked_target(f"Checkpoint {role}", raw)
    except NodeDictError as exc:
        raise CheckpointError(str(exc)) from None


def run_program(
    target: SshTarget, argv: list[str], what: str, stdin: bytes | None = None, timeout: float = 600
):
    """Run a node program; its JSON report, or an error naming the node and the program's words."""
    try:
        done: Result = SshTransport(target).run(argv, stdin=stdin, timeout=timeout)
    except RemoteError as exc:
        raise CheckpointError(f"{target.label}: {what}: {exc}") from None
    report = programs.parse_report(done.text)
    if done.returncode == SSH_TRANSPORT_FAILURE and report is None:
        raise CheckpointError(
            f"{target.label}: could not be reached over SSH for {what} (exit 255):\n"
            f"  stderr: {stderr_tail(done.stderr, 4)}\n  next: check the node is up and its pinned host key"
        )
    if report is None or (done.returncode != 0 and "error" not in report):
        raise CheckpointError(
            f"{target.label}: {what} exited {done.returncode} without a report:\n"
            f"  stderr: {stderr_tail(done.stderr, 6)}"
        )
    return done.returncode, report


def inventory(props: Mapping[str, Any], manifest: Manifest | None, full: bool) -> dict[str, Any]:
    """The node's inventory of the checkpoint (against `manifest` when given; every byte when `full`)."""
    target = node_target(props["node"], "node")
    argv = programs.inventory_argv(
        props.get("python") or "python3",
        props["cache_dir"],
        props["repo"],
        manifest.revision if manifest else props["requested_revision"],
        manifest.as_state() if manifest else None,
        full,
    )
    status, report = run_program(target, argv, "checkpoint inventory")
    if status != 0:
        raise CheckpointError(f"{target.label}: checkpoint inventory failed: {report.get('error')}")
    return report


def upstream_revision(props: Mapping[str, Any]) -> str | None:
    """The commit the configured branch or tag points at on the Hub now (refresh shows a newer one
    beside the recorded `revision`; nothing moves until the operator pins it). None when the Hub
    cannot be asked: refresh of the files on the node must not depend on the Hub."""
    requested = str(props.get("requested_revision") or "")
    if len(requested) == 40 and all(c in "0123456789abcdef" for c in requested):
        return requested
    try:
        target = node_target(props["node"], "node")
        token = props.get("hf_token") or ""
        status, report = run_program(
            target,
            programs.head_fetch_argv(props, None, resolve_only=True),
            "the Hub look-up",
            stdin=(token + "\n").encode(),
            timeout=120,
        )
    except CheckpointError:
        return props.get("upstream_revision")
    if status != 0 or "error" in report:
        return props.get("upstream_revision")
    return str(report.get("revision") or "") or None
