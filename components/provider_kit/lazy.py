"""Names a package gives but loads on first use (PEP 562), for its modules that import Pulumi.

A resource package's `__init__` gives its provider and resource by name. Importing them there would
load the Pulumi SDK for every reader of the package's pure parts (`status` among them), so the package
names them here instead, and they load when first asked for: `getattr(package, name)`, `from package
import name`, and pickle's load of a provider stored in a stack by reference (`components.<pkg>.<Name>`)
all pass through the package's `__getattr__`.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(
    package: str, names: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The `__getattr__` and `__dir__` of module `package` for `names`: each name and the module that
    defines it, relative to the package (`.provider`) or absolute (`components.health_secret`).

    In the package's `__init__`: `__getattr__, __dir__ = lazy_exports(__name__, {"Name": ".provider"})`.
    """
    where = dict(names)

    def __getattr__(name: str) -> Any:
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(where[name], package), name)
        # Kept on the package, so the next lookup finds it without coming here.
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *where})

    return __getattr__, __dir__
