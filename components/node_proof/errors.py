"""What can go wrong with a NodeProof, as exception types."""

from __future__ import annotations

from components.errors import Qwen35Error


class NodeProofError(Qwen35Error):
    """The node proof refused a node (`fabric.node_proof: enforce`), or was given bad input."""
