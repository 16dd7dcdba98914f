"""The house rules a reader relies on, checked over the tree rather than one module:

- no function over 70 lines and no class over 300 in components/, status/, bench/ and patches/,
  but those named in TOO_LONG_FOR_NOW, each with its reason;
- every node resource package in the one shape: the same files, `plan_change` in plan.py, `ensure` in
  execute.py, and each provider class's `__module__` pinned to a path it is importable from;
- every provider the one base (components/provider_kit/provider_base.py) over its package's verbs;
- every dynamic provider pickles (as the SDK stores it in a stack's state) by reference to (module,
  class) pairs that import today.
"""

from __future__ import annotations

import ast
import base64
import importlib
import inspect
import pickletools
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import dill
import pulumi.dynamic as dynamic
import pytest
from pulumi.dynamic.dynamic import serialize_provider

from components.errors import PROVIDER_METHODS
from components.provider_kit.change import Change
from components.provider_kit.provider_base import NodeResourceProvider, Verbs

ROOT = Path(__file__).resolve().parents[2]
LONGEST_FUNCTION = 70  # lines, from `def` to its last line, docstring included
LONGEST_CLASS = 300  # lines, from `class` to its last line
SHIPPED = ("components", "status", "bench", "patches")
# Over a limit for now, each with why: (file, function or class) -> reason. Remove an entry once
# its split lands (test_every_length_exception_says_why_and_is_still_over_its_limit says when).
TOO_LONG_FOR_NOW: dict[tuple[str, str], str] = {}

# The files of a resource that runs programs on a node, and the job of each:
NODE_RESOURCE_FILES = (
    "facts.py",  # the node programs' reports parsed into values, pure
    "programs.py",  # the argv to run on a node
    "plan.py",  # the pure decisions: plan_change -> Change
    "execute.py",  # the only I/O
    "provider.py",  # the dynamic provider, its __module__ pinned
    "resource.py",  # the Pulumi resource
    "errors.py",  # the package's errors, in one place
)
# The packages whose shape differs from NODE_RESOURCE_FILES, each with its files and why.
SHAPE_EXCEPTIONS = {
    "health_secret": (
        ("plan.py", "execute.py", "provider.py", "resource.py", "errors.py"),
        "touches no node (create draws a secret here): no facts or programs",
    ),
}


def contract_packages(root: Path) -> dict[str, tuple[str, ...]]:
    """Every package of `root`/components with a provider.py, and the files its shape holds: the
    contract is derived from the tree, so a new package cannot slip past it."""
    found = sorted(p.parent.name for p in (root / "components").glob("*/provider.py"))
    return {name: SHAPE_EXCEPTIONS.get(name, (NODE_RESOURCE_FILES, ""))[0] for name in found}


SHAPES = contract_packages(ROOT)


def test_the_contract_is_every_package_with_a_provider_and_each_exception_is_one(tmp_path):
    assert set(SHAPE_EXCEPTIONS) <= set(SHAPES), "an exception names a package that has no provider.py"
    assert all(why for _files, why in SHAPE_EXCEPTIONS.values()), "every exception says why"
    # A package added with a provider alone is in the contract, held to the whole shape.
    (tmp_path / "components" / "throwaway").mkdir(parents=True)
    (tmp_path / "components" / "throwaway" / "provider.py").write_text("")
    (tmp_path / "components" / "not_a_resource").mkdir()
    assert contract_packages(tmp_path) == {"throwaway": NODE_RESOURCE_FILES}
    missing = [f for f in NODE_RESOURCE_FILES if not (tmp_path / "components" / "throwaway" / f).is_file()]
    assert missing == [f for f in NODE_RESOURCE_FILES if f != "provider.py"]


def too_long(roots: tuple[str, ...]) -> list[tuple[str, str, str]]:
    """(file, name, `file:line name (N lines)`) for every function or method over LONGEST_FUNCTION
    lines and every class over LONGEST_CLASS."""
    found = []
    for root in roots:
        for path in sorted((ROOT / root).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    limit = LONGEST_FUNCTION
                elif isinstance(node, ast.ClassDef):
                    limit = LONGEST_CLASS
                else:
                    continue
                length = node.end_lineno - node.lineno + 1
                if length > limit:
                    where = path.relative_to(ROOT).as_posix()
                    found.append((where, node.name, f"{where}:{node.lineno} {node.name} ({length} lines)"))
    return found


def test_no_function_over_70_lines_nor_class_over_300_in_what_ships():
    offenders = [text for where, name, text in too_long(SHIPPED) if (where, name) not in TOO_LONG_FOR_NOW]
    assert offenders == [], (
        f"functions over {LONGEST_FUNCTION} lines or classes over {LONGEST_CLASS} (split them):\n"
        + "\n".join(offenders)
    )


def test_every_length_exception_says_why_and_is_still_over_its_limit():
    over = {(where, name) for where, name, _text in too_long(SHIPPED)}
    assert all(TOO_LONG_FOR_NOW.values()), "every exception says why"
    stale = sorted(set(TOO_LONG_FOR_NOW) - over)
    assert stale == [], f"no longer over the limit (remove them from TOO_LONG_FOR_NOW): {stale}"


def test_the_length_check_sees_a_long_function_and_a_long_class(tmp_path, monkeypatch):
    body = "".join(f"        x{i} = {i}\n" for i in range(LONGEST_FUNCTION))
    fields = "".join(f"    y{i} = {i}\n" for i in range(LONGEST_CLASS))
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "long.py").write_text(
        f"def short():\n    pass\n\n\nclass C:\n    def long(self):\n{body}\n\nclass D:\n{fields}"
    )
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    assert {text for _where, _name, text in too_long(("pkg",))} == {
        f"pkg/long.py:6 long ({LONGEST_FUNCTION + 1} lines)",
        f"pkg/long.py:{LONGEST_FUNCTION + 9} D ({LONGEST_CLASS + 1} lines)",
    }


def package(name: str) -> Path:
    return ROOT / "components" / name


def top_level_functions(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    return {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}


def top_level_classes(path: Path) -> dict[str, bool]:
    """Each class the file defines: whether its body assigns `__module__` (pins the pickled path)."""

    def pins(body: list[ast.stmt]) -> bool:
        targets = [t for s in body if isinstance(s, (ast.Assign, ast.AnnAssign)) for t in assigned(s)]
        return any(isinstance(t, ast.Name) and t.id == "__module__" for t in targets)

    tree = ast.parse(path.read_text(), str(path))
    return {n.name: pins(n.body) for n in tree.body if isinstance(n, ast.ClassDef)}


def assigned(statement: ast.Assign | ast.AnnAssign) -> list[ast.expr]:
    return statement.targets if isinstance(statement, ast.Assign) else [statement.target]


@pytest.mark.parametrize(("name", "files"), SHAPES.items(), ids=SHAPES)
def test_each_resource_package_has_the_files_of_the_shape(name, files):
    missing = [f for f in files if not (package(name) / f).is_file()]
    assert missing == [], f"components/{name}/ lacks {', '.join(missing)}"


@pytest.mark.parametrize("name", [n for n, files in SHAPES.items() if "plan.py" in files])
def test_each_plan_defines_plan_change(name):
    plan = package(name) / "plan.py"
    assert plan.is_file(), f"components/{name}/plan.py is missing"
    assert "plan_change" in top_level_functions(plan), f"components/{name}/plan.py defines no plan_change"


@pytest.mark.parametrize("name", [n for n, files in SHAPES.items() if "execute.py" in files])
def test_each_execute_defines_ensure(name):
    execute = package(name) / "execute.py"
    assert execute.is_file(), f"components/{name}/execute.py is missing"
    assert "ensure" in top_level_functions(execute), f"components/{name}/execute.py defines no ensure"


@pytest.mark.parametrize("name", SHAPES)
def test_each_provider_pins_its_module_to_a_path_it_imports_from(name):
    source = package(name) / "provider.py"
    assert source.is_file(), f"components/{name}/provider.py is missing"
    module = importlib.import_module(f"components.{name}.provider")
    classes = {getattr(module, c): pinned for c, pinned in top_level_classes(source).items()}
    providers = {
        c: p for c, p in classes.items() if isinstance(c, type) and issubclass(c, dynamic.ResourceProvider)
    }
    assert providers, f"components/{name}/provider.py defines no dynamic.ResourceProvider"
    for cls, pinned in providers.items():
        # Stacks pickle the class by reference to its __module__: set in the class, not left to the file.
        assert pinned, f"{cls.__name__} (components/{name}/provider.py) does not pin __module__"
        assert getattr(importlib.import_module(cls.__module__), cls.__name__, None) is cls, (
            f"{cls.__name__} is not importable from {cls.__module__}, where its pickle points"
        )


# Where stacks made before the one rule below pickled a provider: each must still import, as the class.
# Leftovers, each removed with its re-export when its module's docstring says (components/health,
# components/checkpoint/provider.py).
EARLIER_PICKLE_PATHS = {
    "components.checkpoint.provider": "CheckpointProvider",
    "components.health": "HealthSecretProvider",
}


def package_providers(name: str) -> list[type]:
    """The dynamic provider classes components/<name>/provider.py defines (not those it imports, such
    as the base)."""
    module = importlib.import_module(f"components.{name}.provider")
    classes = [getattr(module, c) for c in top_level_classes(package(name) / "provider.py")]
    return [c for c in classes if issubclass(c, dynamic.ResourceProvider)]


@pytest.mark.parametrize("name", SHAPES)
def test_every_provider_is_pickled_by_reference_to_its_package(name):
    for cls in package_providers(name):
        assert cls.__module__ == f"components.{name}", (
            f"{cls.__name__} pins {cls.__module__}: every provider pins its package, components.{name}"
        )


@pytest.mark.parametrize(("module", "name"), EARLIER_PICKLE_PATHS.items())
def test_what_earlier_stacks_pickled_still_imports_as_the_class(module, name):
    cls = getattr(importlib.import_module(module), name)
    assert cls is resolve(cls.__module__, cls.__qualname__)


def providers() -> list[type]:
    """Every dynamic provider class the program defines (its packages imported first)."""
    importlib.import_module("components.deployment.component")
    for name in SHAPES:
        importlib.import_module(f"components.{name}")

    def below(cls: type):
        for sub in cls.__subclasses__():
            yield sub
            yield from below(sub)

    ours = {c for c in below(dynamic.ResourceProvider) if c.__module__.startswith(("components", "status"))}
    return sorted(ours, key=lambda c: (c.__module__, c.__name__))


def pickled_globals(data: bytes) -> list[tuple[str, str]]:
    """The (module, name) pairs a pickle loads by reference (GLOBAL and STACK_GLOBAL)."""
    pushed: list[object] = []
    memo: dict[int, object] = {}
    pairs = []
    for op, arg, _pos in pickletools.genops(data):
        if op.name in ("FRAME", "PROTO", "STOP"):
            continue
        if op.name == "MEMOIZE":
            memo[len(memo)] = pushed[-1] if pushed else None
        elif op.name in ("PUT", "BINPUT", "LONG_BINPUT"):
            memo[arg] = pushed[-1] if pushed else None
        elif op.name in ("GET", "BINGET", "LONG_BINGET"):
            pushed.append(memo.get(arg))
        elif "UNICODE" in op.name or "STRING" in op.name:
            pushed.append(arg)
        elif op.name in ("GLOBAL", "INST"):
            pairs.append(tuple(arg.split(" ", 1)))
            pushed.append(None)
        elif op.name == "STACK_GLOBAL":
            module, qualname = pushed[-2:]
            assert isinstance(module, str) and isinstance(qualname, str), pickletools.dis(data)
            pairs.append((module, qualname))
            pushed.append(None)
        else:
            pushed.append(None)
    return pairs


def resolve(module: str, qualname: str) -> object:
    found = importlib.import_module(module)
    for part in qualname.split("."):
        found = getattr(found, part)
    return found


def test_every_package_of_the_shape_has_its_provider():
    # So the pickle test below covers each: a provider outside its package's path would be missed.
    packages = {c.__module__.split(".")[1] for c in providers() if c.__module__.startswith("components.")}
    assert set(SHAPES) - packages == set(), [f"{c.__module__}.{c.__name__}" for c in providers()]


@pytest.mark.parametrize("cls", providers(), ids=lambda c: c.__name__)
def test_each_provider_pickles_by_reference_to_what_imports_now(cls):
    # The bytes the SDK stores in every stack's state: a changed or vanished path breaks those stacks.
    pickled = base64.b64decode(serialize_provider(cls()))
    pairs = pickled_globals(pickled)
    assert (cls.__module__, cls.__qualname__) in pairs, (cls.__name__, pairs)
    unresolved = []
    for module, qualname in pairs:
        try:
            resolve(module, qualname)
        except (ImportError, AttributeError) as missing:
            unresolved.append(f"{module}:{qualname} ({missing})")
    assert unresolved == [], f"{cls.__name__}'s pickle names what does not import: {unresolved}"
    assert resolve(cls.__module__, cls.__qualname__) is cls
    assert type(dill.loads(pickled)) is cls


def test_the_pickle_reader_follows_memo_references():
    class_ref = base64.b64decode(serialize_provider(dynamic.ResourceProvider()))
    assert pickled_globals(class_ref) == [("pulumi.dynamic.dynamic", "ResourceProvider")]
    twice = dill.dumps([dynamic.ResourceProvider, dynamic.CheckResult], protocol=4)
    assert pickled_globals(twice) == [
        ("pulumi.dynamic.dynamic", "ResourceProvider"),
        ("pulumi.dynamic.dynamic", "CheckResult"),
    ]


# A class no module holds (as one in a script's __main__), pickled by the SDK in a fresh interpreter:
# pulumi's serialize_provider wraps pickle's _batch_setitems again on every call and never unwraps it,
# so after the unit tier's many calls any by-value pickle (a class dict) exceeds the recursion limit.
BY_VALUE = """
import pulumi.dynamic as dynamic
from pulumi.dynamic.dynamic import serialize_provider

from components.errors import PROVIDER_METHODS
from components.provider_kit.change import Change
from components.provider_kit.provider_base import NodeResourceProvider, Verbs

unimportable = type("Unimportable", (dynamic.ResourceProvider,), {"__module__": "__main__"})
print(serialize_provider(unimportable()))
"""


def test_a_provider_pickled_by_value_is_told_apart():
    done = subprocess.run([sys.executable, "-c", BY_VALUE], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    pairs = pickled_globals(base64.b64decode(done.stdout))
    assert ("dill._dill", "_create_type") in pairs and ("__main__", "Unimportable") not in pairs


def imported_modules(path: Path) -> set[str]:
    """Every module a file imports (`import x.y`, `from x.y import z`), by its dotted name."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
    return found


# Functions that read JSON line by line but no node program's report, each with why.
NOT_REPORTS = {("components/node_image/facts.py", "parse_images"): "docker's tab-separated image lines"}


def line_readers(paths) -> set[tuple[str, str]]:
    """(file, function) of each function that calls both json.loads and .splitlines(): a reader of
    a program's report off its stdout."""
    found = set()
    for path in paths:
        for fn in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(fn, ast.FunctionDef):
                continue
            calls = set()
            for node in ast.walk(fn):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                    calls.add(node.func.attr)
                    if isinstance(node.func.value, ast.Name):
                        calls.add(f"{node.func.value.id}.{node.func.attr}")
            if {"json.loads", "splitlines"} <= calls:
                found.add((path.relative_to(ROOT).as_posix(), fn.name))
    return found


def test_one_reader_of_node_programs_reports():
    # node_programs/ run on the nodes with the standard library only: they cannot import provider_kit.
    paths = [
        p for top in ("components", "status", "bench") for p in (ROOT / top).rglob("*.py")
        if "node_programs" not in p.parts
    ]  # fmt: skip
    readers = line_readers(paths) - set(NOT_REPORTS)
    assert readers == {("components/provider_kit/reports.py", "last_json_object")}, (
        "read a node program's report with components.provider_kit.reports (read_report, "
        f"require_report, run_program), not a parser of its own: {sorted(readers)}"
    )


def test_the_report_reader_check_sees_a_parser_of_its_own(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    own = tmp_path / "own.py"
    own.write_text("import json\ndef parse(out):\n    return json.loads(out.strip().splitlines()[-1])\n")
    assert line_readers([own]) == {("own.py", "parse")}


def test_status_reads_the_layout_not_the_graph():
    """`status` needs the containers' names and the resources' inputs from config: components/layout.py
    gives them without the Pulumi graph (components/deployment/), which declares resources."""
    for path in sorted((ROOT / "status").rglob("*.py")):
        graph = {m for m in imported_modules(path) if m.startswith("components.deployment")}
        assert not graph, f"{path.relative_to(ROOT)} imports {sorted(graph)}: take it from components.layout"
    layout = imported_modules(ROOT / "components" / "layout.py")
    assert not {m for m in layout if m.split(".")[0] in ("pulumi", "pulumi_docker")}, sorted(layout)
    assert not {m for m in layout if m.startswith("components.deployment")}, sorted(layout)


# ---- the node resource contract: one signature per role -------------------------------------------------

CONTRACT_PACKAGES = [name for name in SHAPES]


def parameters(function) -> list[inspect.Parameter]:
    return list(inspect.signature(function).parameters.values())


@pytest.mark.parametrize("name", CONTRACT_PACKAGES)
def test_every_node_resource_package_keeps_the_contract(name):
    """execute: `ensure(props, olds=None) -> dict` (what else it takes, keyword-only), and where the
    package has them `observe(props) -> dict | None` and `release(props)` (without them the provider
    keeps the SDK's read and delete); plan: `validate(props) -> list[tuple[str, str]]`,
    `plan_change(olds, news) -> Change`."""
    execute = importlib.import_module(f"components.{name}.execute")
    plan = importlib.import_module(f"components.{name}.plan")
    ensure = parameters(execute.ensure)
    assert [p.name for p in ensure[:2]] == ["props", "olds"] and ensure[1].default is None, ensure
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in ensure[2:]), ensure
    assert inspect.signature(execute.ensure).return_annotation == "dict[str, Any]"
    if hasattr(execute, "observe"):
        observe = parameters(execute.observe)
        assert observe[0].name == "props", observe
        assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in observe[1:]), observe
        returns = inspect.signature(execute.observe).return_annotation
        assert returns in ("dict[str, Any]", "dict[str, Any] | None"), returns
    if hasattr(execute, "release"):
        assert [p.name for p in parameters(execute.release)] == ["props"]
    assert [p.name for p in parameters(plan.validate)] == ["props"]
    assert inspect.signature(plan.validate).return_annotation == "list[tuple[str, str]]"
    assert [p.name for p in parameters(plan.plan_change)] == ["olds", "news"]
    assert inspect.signature(plan.plan_change).return_annotation == "Change"


# Each call the engine makes on a provider: the package's verb that carries it out, and its arguments.
ENGINE_CALLS = {
    "check": ("validate", ({}, {})),
    "diff": ("plan_change", ("id", {}, {})),
    "create": ("ensure", ({},)),
    "update": ("ensure", ("id", {}, {})),
    "read": ("observe", ("id", {})),
    "delete": ("release", ("id", {})),
}


class RecordedVerbs:
    """Stand-ins for a package's verbs that record which ran, to follow the engine's calls."""

    def __init__(self) -> None:
        self.ran: list[str] = []

    def verbs(self) -> Verbs:
        def verb(name: str, result: Any) -> Callable[..., Any]:
            return lambda *_args: self.ran.append(name) or result

        return Verbs(
            validate=verb("validate", []),
            plan_change=verb("plan_change", Change((), ())),
            ensure=verb("ensure", {}),
            resource_id=lambda _props, _outs: "id",
            observe=verb("observe", {}),
            release=verb("release", None),
        )


@pytest.mark.parametrize("name", CONTRACT_PACKAGES)
def test_every_provider_is_the_base_over_the_package_s_verbs(name):
    """The provider is the engine's face of the package, one class for all
    (components/provider_kit/provider_base.py): check runs `validate`, diff `plan_change`, create and
    update `ensure`, read `observe` and delete `release` (the SDK's read and delete where the package
    has none). A provider overrides `update` alone, where its package's update is not `ensure`."""
    execute = importlib.import_module(f"components.{name}.execute")
    plan = importlib.import_module(f"components.{name}.plan")
    [cls] = package_providers(name)
    assert issubclass(cls, NodeResourceProvider), f"{cls.__name__} is not a NodeResourceProvider"
    verbs = cls.verbs
    assert verbs.validate is plan.validate and verbs.plan_change is plan.plan_change, cls.__name__
    assert verbs.ensure is execute.ensure, cls.__name__
    assert verbs.observe is getattr(execute, "observe", None), f"{cls.__name__}: observe is not execute's"
    assert verbs.release is getattr(execute, "release", None), f"{cls.__name__}: release is not execute's"
    overridden = [method for method in PROVIDER_METHODS if method in vars(cls)]
    assert overridden in ([], ["update"]), f"{cls.__name__} overrides {overridden}"
    # Through the base, each call reaches its verb (stand-ins here, so nothing runs).
    recorded = RecordedVerbs()
    stand_in = type(cls.__name__, (cls,), {"verbs": recorded.verbs(), "__module__": __name__})()
    for method, (verb, args) in ENGINE_CALLS.items():
        if method not in overridden:
            recorded.ran.clear()
            getattr(stand_in, method)(*args)
            assert recorded.ran == [verb], f"{cls.__name__}.{method} ran {recorded.ran}, not {verb}"


# Inside a node resource package the modules import one way: facts.py (reports parsed into values)
# imports neither programs.py nor plan.py; programs.py (argv, from facts' values) does not import
# plan.py; plan.py (the decisions) may import both; execute.py imports whatever it runs.
MAY_NOT_IMPORT = {
    "facts": ("programs", "plan", "execute"),
    "programs": ("plan", "execute"),
    "plan": ("execute",),
}


@pytest.mark.parametrize("name", [n for n, files in SHAPES.items() if files == NODE_RESOURCE_FILES])
def test_a_package_s_modules_import_one_way(name):
    for module, forbidden in MAY_NOT_IMPORT.items():
        path = package(name) / f"{module}.py"
        imported = imported_modules(path)
        wrong = sorted(m for m in imported if any(m.startswith(f"components.{name}.{f}") for f in forbidden))
        wrong += sorted(
            f"components.{name}.{m.rsplit('.', 1)[1]}"
            for m in imported
            if m.startswith(f"components.{name}.") and m.rsplit(".", 1)[1] in forbidden
        )
        assert not wrong, (
            f"components/{name}/{module}.py imports {sorted(set(wrong))}: facts -> programs -> plan"
        )
