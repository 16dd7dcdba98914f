"""The scripts under patches/ loaded as modules (they are standalone files, not a package)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

PATCHES = Path(__file__).resolve().parents[2] / "patches"


def load_patch_module(name: str) -> ModuleType:
    """patches/<name>.py as a module (the scripts are standalone files, not a package)."""
    spec = importlib.util.spec_from_file_location(name, PATCHES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module
