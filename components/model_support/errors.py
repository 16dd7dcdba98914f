"""What can go wrong with a ModelSupportCheck, as exception types (the package's only ones)."""

from __future__ import annotations

from components.errors import Qwen35Error


class ModelSupportError(Qwen35Error, RuntimeError):
    """The check could not prove support (or could not run); the message says what to do."""


class MemoryFitError(Qwen35Error, ValueError):
    """The model does not fit the declared nodes; the message carries the numbers."""


class ServeArgsError(Qwen35Error, RuntimeError):
    """The argument proof gave no report; the message says what to do."""
