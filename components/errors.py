"""The root of this program's own errors (stdlib only: the dynamic providers import it too)."""

from __future__ import annotations


class Qwen35Error(Exception):
    """A failure this program explains: its message says what failed, on which node (when a node is
    involved), the last lines of stderr, and what to do next. Anything else is a bug."""
