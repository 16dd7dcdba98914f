"""The root of this program's own errors (stdlib only: the dynamic providers import it too)."""

from __future__ import annotations

import functools
import sys
import traceback
from collections.abc import Callable
from typing import Any

# The engine runs dynamic providers as `python -m pulumi.dynamic`.
PROVIDER_PROCESS = "pulumi.dynamic.__main__"
# Every method the engine calls on a dynamic provider.
PROVIDER_METHODS = ("check", "diff", "create", "update", "delete", "read")


class Qwen35Error(Exception):
    """A failure this program explains: its message says what failed, on which node (when a node is
    involved), the last lines of stderr, and what to do next. Anything else is a bug."""


class ProviderBug(Exception):
    """An error this program did not expect, its traceback carried in the message."""


def in_provider_process() -> bool:
    return getattr(getattr(sys.modules.get("__main__"), "__spec__", None), "name", None) == PROVIDER_PROCESS


def quiet_tracebacks() -> None:
    """In the engine's provider process, the SDK reports a failed call with `traceback.format_exc()`:
    with no frames, a Qwen35Error reads as its reason and next step alone. Set once, when this module
    is first imported there (unpickling a provider imports it), so it holds for every call alike."""
    if in_provider_process():
        sys.tracebacklimit = 0


def explained(method: Callable[..., Any]) -> Callable[..., Any]:
    """In the engine's provider process, an error reaches `pulumi up` as its message alone, and any
    other exception as ProviderBug with its full traceback in the message (frames are off there)."""

    @functools.wraps(method)
    def call(*args: Any, **kwargs: Any) -> Any:
        if not in_provider_process():
            return method(*args, **kwargs)
        try:
            return method(*args, **kwargs)
        except Qwen35Error as exc:
            raise exc from None
        except Exception as exc:
            frames = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__, limit=1000))
            # The provider the engine called, also when the method is its base's.
            where = f"{type(args[0]).__name__}.{method.__name__}" if args else method.__qualname__
            raise ProviderBug(f"{where} failed unexpectedly (a bug):\n{frames}") from None

    return call


class ExplainedErrors:
    """Mixin for the dynamic providers: every method reports errors as `explained` says."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for name in PROVIDER_METHODS:
            if name in cls.__dict__:
                setattr(cls, name, explained(cls.__dict__[name]))


quiet_tracebacks()
