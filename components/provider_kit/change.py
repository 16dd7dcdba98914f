"""What `pulumi up` does to one of the program's resources, as diff decides it from inputs alone."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Change:
    """The inputs that replace the resource, those recorded in place (an update), and whether a
    replacement deletes the old resource before it creates the new one (else it creates first)."""

    replaces: tuple[str, ...]
    updates: tuple[str, ...]
    delete_before_replace: bool = False

    @property
    def changes(self) -> bool:
        return bool(self.replaces or self.updates)

    def updates_any(self, keys: tuple[str, ...]) -> bool:
        """Whether any of `keys` is among the updated inputs (what decides whether an update does the
        work again: probe, measure, check, read)."""
        return any(key in keys for key in self.updates)
