"""What can go wrong with a ReadinessGate, as exception types."""

from __future__ import annotations

from components.errors import Qwen35Error
from components.remote import RemoteError, stderr_tail


class GateFailed(RemoteError):
    """The probe ran and said no; the message carries its whole report, not only the last lines."""

    def _message(self) -> str:
        if self.transport_failed:
            return super()._message()
        lines = [f"{self.node}: the deployment is not ready (probe exit {self.returncode})"]
        lines.append(stderr_tail(self.stderr, lines=60))
        if self.hint:
            lines.append(f"  next: {self.hint}")
        return "\n".join(lines)


class ServingTransportRefused(Qwen35Error):
    """Under `fabric.node_proof: enforce`, the serving ranks' NCCL said it used TCP sockets on a node
    whose HCAs were given: the server answers, but over the slow path. The message names each node and
    quotes NCCL's own lines."""
