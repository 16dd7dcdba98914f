"""What a caller gives a transfer (`Stage`s in a `Transfer`) and what it gets back (a `TransferResult`
of `StageOutcome`s, its `Failure` classified); the conversation: `components/transfer/__init__.py`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum

from components.remote import shell_join
from components.transfer.endpoints import Endpoint


class Failure(str, Enum):
    """How a transfer failed, which decides what to tell the operator (and whether to retry)."""

    NONE = "none"
    PEER = "peer"  # the source could not connect to the destination: nothing was sent
    TRANSPORT = "transport"  # a link failed, stalled or passed the deadline (either SSH hop)
    STAGE = "stage"  # a producer stage or the consumer failed for its own reasons


@dataclass(frozen=True)
class Stage:
    """One command of a transfer: a name for messages, and its argument list."""

    name: str
    argv: tuple[str, ...]

    def __init__(self, name: str, argv: Sequence[str]):
        shell_join(list(argv))  # refuses what could not travel to a node safely
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "argv", tuple(argv))


@dataclass(frozen=True)
class Transfer:
    """What a caller provides: producers run on the source (their output is the stream), a consumer
    run on the destination (reads the stream, prints one JSON line on stdout), the byte total for
    progress, and an operation name (the progress file's name on the source)."""

    operation: str
    producers: tuple[Stage, ...]
    consumer: Stage
    bytes_total: int = 0


@dataclass
class StageOutcome:
    name: str
    status: int | None
    stderr: list[str] = field(default_factory=list)
    report: dict | None = None  # the stage's own `qwen35-report` line


@dataclass
class TransferResult:
    """What a caller gets back."""

    source: Endpoint
    destination: Endpoint
    stages: list[StageOutcome]
    bytes_sent: int
    consumer_report: dict | None
    failure: Failure
    why: str
    detail: list[str]
    seconds: float = 0.0
    forward: str = ""  # "used", "not used: why", or "" (no forward offered)

    @property
    def ok(self) -> bool:
        return self.failure is Failure.NONE

    def stage(self, name: str) -> StageOutcome | None:
        return next((stage for stage in self.stages if stage.name == name), None)

    def statuses(self) -> str:
        """Every stage's exit status, for messages."""
        return ", ".join(f"{s.name} exited {s.status}" for s in self.stages if s.status is not None)

    def error(self, what: str, placed: str, next_step: str) -> str:
        """A failure worded for people: what, between which nodes, why, each stage, what to do."""
        lines = [f"{what} from {self.source.label} to {self.destination.label} failed: {self.why}"]
        if self.stages and any(s.status for s in self.stages):
            lines[0] += f" [{self.statuses()}]"
        if self.detail:
            lines.append("  stderr: " + "\n          ".join(self.detail[-6:]))
        lines.append(f"  {placed}; next: {next_step}")
        return "\n".join(lines)
