"""What can go wrong with a HealthSecret, as exception types."""

from __future__ import annotations


class SecretMissing(ValueError):
    """The recorded state holds no secret to keep: the message says how to draw a new one."""
