"""The packages' names loaded on first use (components/provider_kit/lazy.py): each provider a stack
pickled by reference as `components.<pkg>.<Name>` still loads as its class, in a fresh interpreter
where nothing of the package was imported before (as in the engine's provider process)."""

from __future__ import annotations

import importlib
import subprocess
import sys
import types
from pathlib import Path

import pulumi.dynamic as dynamic
import pytest
from pulumi.dynamic.dynamic import serialize_provider

from components.provider_kit.lazy import lazy_exports

ROOT = Path(__file__).resolve().parents[2]


def package_providers() -> list[tuple[str, str]]:
    """(package, class name) of every provider in a package with a provider.py, from the tree."""
    found = []
    for path in sorted((ROOT / "components").glob("*/provider.py")):
        name = path.parent.name
        module = importlib.import_module(f"components.{name}.provider")
        found += [
            (f"components.{name}", cls.__name__)
            for cls in vars(module).values()
            if isinstance(cls, type)
            and issubclass(cls, dynamic.ResourceProvider)
            and cls.__module__ == f"components.{name}"
        ]
    return found


# Where stacks made before the secret had its own package pickled its provider (a leftover, removed
# when components/health/__init__.py says).
EARLIER = [("components.health", "HealthSecretProvider")]

# Run in a fresh interpreter: argv = package, class name; stdin = the SDK's pickle of an instance.
FRESH = """
import base64, importlib, sys
import dill

package, name = sys.argv[1:3]
module = importlib.import_module(package)
# The package alone loads none of its Pulumi modules.
loaded = sorted(m for m in sys.modules if m == "pulumi" or m.startswith("pulumi."))
assert loaded == [], loaded
stored = dill.loads(base64.b64decode(sys.stdin.read()))
cls = getattr(module, name)
assert type(stored) is cls, (type(stored), cls)
assert type(dill.loads(dill.dumps(cls()))) is cls
print(f"{type(stored).__module__}.{type(stored).__qualname__}")
"""


@pytest.mark.parametrize(("package", "name"), package_providers() + EARLIER, ids=lambda v: v)
def test_a_stored_provider_loads_as_its_class_in_a_fresh_interpreter(package, name):
    cls = getattr(importlib.import_module(package), name)
    done = subprocess.run(
        [sys.executable, "-c", FRESH, package, name],
        input=serialize_provider(cls()),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == f"{cls.__module__}.{cls.__qualname__}"


def test_every_package_with_a_provider_is_checked():
    packages = {package for package, _name in package_providers()}
    assert packages == {f"components.{p.parent.name}" for p in (ROOT / "components").glob("*/provider.py")}


@pytest.fixture
def package(monkeypatch):
    """A module `lazy_demo` in sys.modules that gives `dumps` (json's), loaded on first use."""
    module = types.ModuleType("lazy_demo")
    monkeypatch.setitem(sys.modules, "lazy_demo", module)
    module.__getattr__, module.__dir__ = lazy_exports("lazy_demo", {"dumps": "json"})
    return module


def test_a_lazy_name_loads_on_first_use_and_is_kept(package):
    import json

    assert "dumps" not in vars(package)
    assert package.dumps is json.dumps
    assert vars(package)["dumps"] is json.dumps
    from lazy_demo import dumps  # the form the packages' readers use

    assert dumps is json.dumps


def test_a_name_not_given_is_an_attribute_error_naming_the_module(package):
    with pytest.raises(AttributeError, match="'lazy_demo' has no attribute 'loads'"):
        package.loads  # noqa: B018
    assert not hasattr(package, "loads")


def test_dir_lists_the_lazy_names_before_they_load(package):
    assert "dumps" in dir(package) and "dumps" not in vars(package)
