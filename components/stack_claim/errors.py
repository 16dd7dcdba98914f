"""What can go wrong with a StackClaim, as exception types."""

from __future__ import annotations

from components.remote import RemoteError


class ClaimRefused(RemoteError):
    """Another stack holds this node's names or ports; the message names it and the way out."""

    def _message(self) -> str:
        return self.hint
