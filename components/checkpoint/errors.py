"""What can go wrong with a Checkpoint, as an exception type (the package's only one)."""

from __future__ import annotations

from components.errors import Qwen35Error


class CheckpointError(Qwen35Error, RuntimeError):
    """The checkpoint could not be placed or checked; the message names the node and what to do next."""
