"""What can go wrong with a FabricCheck, as exception types."""

from __future__ import annotations

from components.errors import Qwen35Error


class FabricCheckError(Qwen35Error, RuntimeError):
    """The fabric of a node is not fit for NCCL (or its facts could not be read): the message names
    the node, device and port, what was found, and the next step."""
