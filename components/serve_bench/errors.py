"""What can go wrong with a ServeBench, as exception types."""

from __future__ import annotations

from components.errors import Qwen35Error
from components.remote import RemoteError, stderr_tail


class BenchFailed(RemoteError):
    """The bench ran on the head and could not measure (a request failed, or its deadline passed)."""

    def _message(self) -> str:
        if self.transport_failed:
            return super()._message()
        lines = [f"{self.node}: the serve bench could not measure (exit {self.returncode})"]
        lines.append(stderr_tail(self.stderr, lines=20))
        if self.hint:
            lines.append(f"  next: {self.hint}")
        return "\n".join(lines)


class BelowFloor(Qwen35Error):
    """Under `bench.mode: enforce`, a figure below its floor: each one named, with what to check."""

    def __init__(self, node: str, shortfalls: list[str], causes: list[str]):
        self.node = node
        self.shortfalls = shortfalls
        self.causes = causes
        lines = [f"serve bench on {node}: {len(shortfalls)} figure(s) below the floor:"]
        lines += [f"  - {s}" for s in shortfalls]
        lines.append("  likely causes, from what this stack can see:")
        lines += [f"  - {c}" for c in causes]
        lines.append(
            "  (bench.mode: enforce stops here; fix the cause and `pulumi up` measures again, or lower "
            "the floor, or set bench.mode to report)"
        )
        super().__init__("\n".join(lines))
