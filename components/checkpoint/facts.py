"""What a node's checkpoint programs report, parsed into values: pure, no I/O.

Each node program (`components/node_programs/hf_checkpoint.py`, `hub_fetch.py`) answers with a
one-line JSON report on stdout; `programs.py` builds their argument lists, `execute.py` runs them,
and the decisions on the reports are in `plan.py`.
"""

from __future__ import annotations

from typing import Any

from components.checkpoint.errors import CheckpointError
from components.node_programs import hf_checkpoint
from components.provider_kit.reports import read_report
from components.remote import SSH_TRANSPORT_FAILURE, Result, stderr_tail

# What a receive's exit status means (declared once, in the node program).
RECEIVE_EXITS = {
    hf_checkpoint.Exit.BAD_INPUT: "bad input to the receiving program",
    hf_checkpoint.Exit.STREAM: "the stream ended early or was malformed (the link was cut?)",
    hf_checkpoint.Exit.VERIFY: "a received file did not match its hash or size",
    hf_checkpoint.Exit.IO: "the destination's disk refused a write",
}


def program_report(node: str, what: str, done: Result) -> tuple[int, dict[str, Any]]:
    """A node program's exit status and JSON report; CheckpointError naming the node when SSH could
    not reach it or the program gave no report."""
    report = read_report(done)
    if done.returncode == SSH_TRANSPORT_FAILURE and report is None:
        raise CheckpointError(
            f"{node}: could not be reached over SSH for {what} (exit 255):\n"
            f"  stderr: {stderr_tail(done.stderr, 4)}\n  next: check the node is up and its pinned host key"
        )
    if report is None or (done.returncode != 0 and "error" not in report):
        raise CheckpointError(
            f"{node}: {what} exited {done.returncode} without a report:\n"
            f"  stderr: {stderr_tail(done.stderr, 6)}"
        )
    return done.returncode, report
