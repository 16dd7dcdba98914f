#!/usr/bin/env python3
"""Prove that modules copied from a donor vLLM tree will import inside a base vLLM tree.

    vllm_compat.py --base DIR --donor DIR [--files F ...] [--extra F ...] [--json] [--stage OUT]

DIR is a `vllm` package directory; F is a path inside it (default: the Qwen3.5 model and config
modules present in the donor). Every `vllm...` module and name the copied files import (at module
level, in class bodies or inside functions; `if TYPE_CHECKING:` imports are skipped because they never
run) must resolve in the base tree with the copies in place, following re-exports (`from .x import *`,
`__all__`, lazy `__getattr__` modules that list the name in `__all__` or declare it under TYPE_CHECKING).
Extension modules (`*.so`) must exist; the names imported from them cannot be read and are accepted.
Exit 0 when all resolve. Exit 1 listing each unresolved `module:name`, the copied file that needs it,
the donor files that provide it, and the closure of extra donor files the hybrid would need.
--extra adds files (e.g. the closure found earlier) to the default list. --stage OUT copies the
proven files into OUT (same relative paths) only when the proof passes, so nothing unproven reaches
an image. Exit 2 on bad arguments. Standard library only (runs inside the image build, Python 3.10+).
"""

from __future__ import annotations

import argparse
import ast
import json
import shutil
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path

EXIT_OK = 0
EXIT_UNRESOLVED = 1
EXIT_USAGE = 2

PACKAGE = "vllm"
DEFAULT_GLOBS = ("model_executor/models/qwen3_5*.py", "transformers_utils/configs/qwen3_5*.py")
MODULE_ITSELF = ""  # the `name` of a finding whose module is missing altogether


@dataclass(frozen=True)
class ImportUse:
    """One `vllm` name (or module, when name is empty) a file imports, and where."""

    module: str
    name: str
    file: str
    line: int
    lazy: bool  # inside a function: fails when called, not at import


@dataclass
class ModuleInfo:
    """What a module binds at top level, what it star-imports, its `__all__`, and its imports."""

    bound: set[str] = field(default_factory=set)
    stars: list[str] = field(default_factory=list)
    all_names: list[str] | None = None
    has_getattr: bool = False
    declared: set[str] = field(default_factory=set)  # bound only under `if TYPE_CHECKING:`
    uses: list[ImportUse] = field(default_factory=list)


def module_name(rel: str) -> str:
    """`model_executor/models/qwen3_5.py` -> `vllm.model_executor.models.qwen3_5`."""
    parts = [PACKAGE, *Path(rel).with_suffix("").parts]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


class Tree:
    """A `vllm` package directory read from disk, with parsed modules cached."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._infos: dict[str, ModuleInfo] = {}

    def module_file(self, module: str) -> str | None:
        """The path (relative to root) that defines `module`, or None. Extension modules count."""
        parts = module.split(".")
        if parts[0] != PACKAGE:
            return None
        base = self.root.joinpath(*parts[1:])
        for candidate in (base.with_suffix(".py") if len(parts) > 1 else None, base / "__init__.py"):
            if candidate is not None and candidate.is_file():
                return candidate.relative_to(self.root).as_posix()
        if len(parts) > 1 and base.parent.is_dir():
            for ext in sorted(base.parent.glob(base.name + ".*so")):
                return ext.relative_to(self.root).as_posix()
        if base.is_dir() and any(base.glob("*.py")):
            return base.relative_to(self.root).as_posix()  # namespace package
        return None

    def info(self, rel: str) -> ModuleInfo:
        if rel not in self._infos:
            self._infos[rel] = _parse_module(self.root / rel, rel)
        return self._infos[rel]


class Overlay:
    """The base tree with some files replaced or added from the donor tree."""

    def __init__(self, base: Tree, donor: Tree, copied: set[str]) -> None:
        self.base, self.donor, self.copied = base, donor, copied

    def locate(self, module: str) -> tuple[Tree, str] | None:
        rel = self.donor.module_file(module)
        if rel is not None and rel in self.copied:
            return self.donor, rel
        rel = self.base.module_file(module)
        return (self.base, rel) if rel is not None else None


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _absolute(rel: str, level: int, module: str | None) -> str:
    if level == 0:
        return module or ""
    package = module_name(rel).split(".")
    if not rel.endswith("__init__.py"):
        package.pop()
    package = package[: len(package) - (level - 1)]
    return ".".join(package + ([module] if module else []))


def _target_names(target: ast.expr) -> list[str]:
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, (ast.Tuple, ast.List)):
        return [n for elt in target.elts for n in _target_names(elt)]
    if isinstance(target, ast.Starred):
        return _target_names(target.value)
    return []


def _str_list(node: ast.expr) -> list[str] | None:
    if isinstance(node, (ast.List, ast.Tuple)) and all(
        isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts
    ):
        return [e.value for e in node.elts]
    return None


class _Reader(ast.NodeVisitor):
    """Collect module-level bindings and every `vllm` import with its context."""

    def __init__(self, rel: str) -> None:
        self.rel = rel
        self.info = ModuleInfo()
        self.depth = 0  # > 0 inside a function or class: no module-level bindings
        self.in_function = 0
        self.typing_only = False  # inside `if TYPE_CHECKING:`: declarations, not runtime bindings

    def _bind(self, *names: str) -> None:
        if self.depth == 0:
            (self.info.declared if self.typing_only else self.info.bound).update(names)

    def visit_If(self, node: ast.If) -> None:
        if _is_type_checking(node.test):
            # The body never runs; lazy modules (`__getattr__`) declare the names they serve there.
            self.typing_only, was = True, self.typing_only
            for stmt in node.body:
                self.visit(stmt)
            self.typing_only = was
            for stmt in node.orelse:
                self.visit(stmt)
            return
        self.generic_visit(node)

    def _visit_def(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self._bind(node.name)
        if node.name == "__getattr__" and self.depth == 0:
            self.info.has_getattr = True
        for expr in [*node.decorator_list, *node.args.defaults, *node.args.kw_defaults]:
            if expr is not None:
                self.visit(expr)
        self.depth += 1
        self.in_function += 1
        for stmt in node.body:
            self.visit(stmt)
        self.in_function -= 1
        self.depth -= 1

    visit_FunctionDef = _visit_def
    visit_AsyncFunctionDef = _visit_def

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self._bind(node.name)
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    def visit_Assign(self, node: ast.Assign) -> None:
        for target in node.targets:
            names = _target_names(target)
            self._bind(*names)
            if self.depth == 0 and names == ["__all__"]:
                self.info.all_names = _str_list(node.value)
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self._bind(*_target_names(node.target))
        if self.depth == 0 and _target_names(node.target) == ["__all__"] and node.value is not None:
            self.info.all_names = _str_list(node.value)
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        names = _target_names(node.target)
        self._bind(*names)
        extra = _str_list(node.value)
        if self.depth == 0 and names == ["__all__"] and extra is not None and self.info.all_names is not None:
            self.info.all_names.extend(extra)
        self.generic_visit(node)

    def visit_NamedExpr(self, node: ast.NamedExpr) -> None:
        self._bind(*_target_names(node.target))
        self.generic_visit(node)

    def _visit_loop_target(self, node: ast.For | ast.AsyncFor | ast.With | ast.AsyncWith) -> None:
        if isinstance(node, (ast.For, ast.AsyncFor)):
            self._bind(*_target_names(node.target))
        else:
            for item in node.items:
                if item.optional_vars is not None:
                    self._bind(*_target_names(item.optional_vars))
        self.generic_visit(node)

    visit_For = visit_AsyncFor = visit_With = visit_AsyncWith = _visit_loop_target

    def visit_ExceptHandler(self, node: ast.ExceptHandler) -> None:
        if node.name:
            self._bind(node.name)
        self.generic_visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._bind(alias.asname or alias.name.split(".")[0])
            if alias.name.split(".")[0] == PACKAGE:
                self._use(alias.name, MODULE_ITSELF, node.lineno)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = _absolute(self.rel, node.level, node.module)
        ours = module.split(".")[0] == PACKAGE
        for alias in node.names:
            if alias.name == "*":
                if self.depth == 0:
                    self.info.stars.append(module)
                if ours:
                    self._use(module, MODULE_ITSELF, node.lineno)
                continue
            self._bind(alias.asname or alias.name)
            if ours:
                self._use(module, alias.name, node.lineno)

    def _use(self, module: str, name: str, line: int) -> None:
        if self.typing_only:
            return
        self.info.uses.append(ImportUse(module, name, self.rel, line, lazy=self.in_function > 0))


def _parse_module(path: Path, rel: str) -> ModuleInfo:
    if path.suffix != ".py":  # extension module or namespace package: nothing to read
        return ModuleInfo()
    reader = _Reader(rel)
    with warnings.catch_warnings():  # invalid escapes etc. in vLLM's own sources are not our finding
        warnings.simplefilter("ignore")
        module = ast.parse(path.read_bytes(), filename=str(path))
    reader.visit(module)
    return reader.info


class Resolver:
    """Answers "does `from module import name` work?" in an overlay, following re-exports."""

    def __init__(self, overlay: Overlay) -> None:
        self.overlay = overlay
        self._exports: dict[str, set[str] | None] = {}

    def bound(self, module: str, seen: frozenset[str] = frozenset()) -> set[str] | None:
        """Names bound at top level of `module`, stars expanded; None when unknowable (extension)."""
        where = self.overlay.locate(module)
        if where is None:
            return set()
        tree, rel = where
        if (tree.root / rel).is_dir():
            return set()  # a namespace package binds nothing; its submodules are checked as modules
        if not rel.endswith(".py"):
            return None
        info = tree.info(rel)
        names = set(info.bound)
        for star in info.stars:
            if star in seen:
                continue
            exported = self.exported(star, seen | {module})
            if exported is None:
                return None
            names |= exported
        return names

    def exported(self, module: str, seen: frozenset[str] = frozenset()) -> set[str] | None:
        """What `from module import *` binds: `__all__` if literal, else the public bound names."""
        if module not in self._exports or seen:
            where = self.overlay.locate(module)
            info = where[0].info(where[1]) if where is not None and where[1].endswith(".py") else None
            if info is not None and info.all_names is not None:
                result: set[str] | None = set(info.all_names)
            else:
                names = self.bound(module, seen)
                result = None if names is None else {n for n in names if not n.startswith("_")}
            if seen:
                return result
            self._exports[module] = result
        return self._exports[module]

    def resolves(self, module: str, name: str) -> bool:
        where = self.overlay.locate(module)
        if where is None:
            return False
        if name == MODULE_ITSELF or self.overlay.locate(f"{module}.{name}") is not None:
            return True
        names = self.bound(module)
        if names is None or name in names:
            return True
        tree, rel = where
        info = tree.info(rel) if rel.endswith(".py") else ModuleInfo()
        # A lazy module serves what it lists in `__all__` or declares for type checkers.
        return info.has_getattr and (name in (info.all_names or []) or name in info.declared)


@dataclass(frozen=True)
class Finding:
    """An import that does not resolve, who needs it, and which donor files would provide it."""

    module: str
    name: str
    needed_by: tuple[str, ...]  # "file:line", lazy ones marked "(in function)"
    provided_by: tuple[str, ...]

    @property
    def label(self) -> str:
        return f"{self.module}:{self.name}" if self.name else f"{self.module} (module missing)"


def _donor_providers(
    donor_resolver: Resolver, module: str, name: str, seen: frozenset[str] = frozenset()
) -> tuple[str, ...]:
    """The donor files whose copies make `module:name` resolve, following star re-exports to the file
    that binds the name (other re-exports are imports of the copied file, checked in the next round)."""
    donor = donor_resolver.overlay.donor
    if name and (rel := donor.module_file(f"{module}.{name}")) is not None:
        return (rel,)
    rel = donor.module_file(module)
    if rel is None or (name and not donor_resolver.resolves(module, name)):
        return ()
    if not name or not rel.endswith(".py") or name in donor.info(rel).bound:
        return (rel,)
    for star in donor.info(rel).stars:
        if star not in seen and name in (donor_resolver.exported(star) or set()):
            return (rel, *_donor_providers(donor_resolver, star, name, seen | {module}))
    return (rel,)


def check(base: Tree, donor: Tree, copied: set[str]) -> list[Finding]:
    """Every unresolved `vllm` import of the copied files, with the donor files that would provide it."""
    resolver = Resolver(Overlay(base, donor, copied))
    donor_resolver = Resolver(Overlay(donor, donor, set()))
    needed: dict[tuple[str, str], list[str]] = {}
    for rel in sorted(copied):
        for use in donor.info(rel).uses:
            if not resolver.resolves(use.module, use.name):
                where = f"{use.file}:{use.line}" + (" (in function)" if use.lazy else "")
                # A missing module is one finding, however many names are imported from it.
                name = use.name if resolver.overlay.locate(use.module) is not None else MODULE_ITSELF
                needed.setdefault((use.module, name), []).append(where)
    return [
        Finding(module, name, tuple(who), _donor_providers(donor_resolver, module, name))
        for (module, name), who in sorted(needed.items())
    ]


def broken_base_imports(base: Tree, donor: Tree, copied: set[str]) -> list[Finding]:
    """Imports in untouched base files that a donor file overwriting its base version would break."""
    replaced = {module_name(rel) for rel in copied if (base.root / rel).is_file()}
    if not replaced:
        return []
    resolver = Resolver(Overlay(base, donor, copied))
    needed: dict[tuple[str, str], list[str]] = {}
    leaves = {module.rsplit(".", 1)[-1].encode() for module in replaced}
    for path in sorted(base.root.rglob("*.py")):
        rel = path.relative_to(base.root).as_posix()
        # Importing a module names its last component somewhere in the file: skip the parse otherwise.
        if rel in copied or not any(leaf in path.read_bytes() for leaf in leaves):
            continue
        for use in base.info(rel).uses:
            if use.module in replaced and not resolver.resolves(use.module, use.name):
                where = f"{use.file}:{use.line}" + (" (in function)" if use.lazy else "")
                needed.setdefault((use.module, use.name), []).append(where)
    return [Finding(module, name, tuple(who), ()) for (module, name), who in sorted(needed.items())]


@dataclass(frozen=True)
class Verdict:
    """The proof's answer for a file set, and the closure of donor files that would complete it."""

    files: tuple[str, ...]
    findings: tuple[Finding, ...]
    extra_files: tuple[str, ...]  # the closure: donor files the hybrid would additionally need
    replaces_base: tuple[str, ...]  # those of extra_files that overwrite a base file
    still_unresolved: tuple[Finding, ...]  # not provided by the donor either
    breaks_base: tuple[Finding, ...]  # base imports the closure's replacements would break

    @property
    def ok(self) -> bool:
        return not self.findings


def prove(base_dir: Path, donor_dir: Path, files: list[str]) -> Verdict:
    """Check `files` copied into the base, then grow the copy set until the donor offers nothing missing."""
    base, donor = Tree(base_dir), Tree(donor_dir)
    findings = check(base, donor, set(files))
    copied = set(files)
    remaining = findings
    while True:
        new = {rel for f in remaining for rel in f.provided_by} - copied
        if not new:
            break
        copied |= new
        remaining = check(base, donor, copied)
    extra = tuple(sorted(copied - set(files)))
    return Verdict(
        files=tuple(files),
        findings=tuple(findings),
        extra_files=extra,
        replaces_base=tuple(rel for rel in extra if (base_dir / rel).exists()),
        still_unresolved=tuple(remaining),
        breaks_base=tuple(broken_base_imports(base, donor, copied)),
    )


def default_files(donor_dir: Path) -> list[str]:
    """The Qwen3.5 model and config modules present in the donor."""
    return sorted(p.relative_to(donor_dir).as_posix() for g in DEFAULT_GLOBS for p in donor_dir.glob(g))


def to_json(verdict: Verdict, base_dir: Path, donor_dir: Path) -> dict[str, object]:
    def finding(f: Finding) -> dict[str, object]:
        return {
            "module": f.module,
            "name": f.name,
            "needed_by": list(f.needed_by),
            "provided_by": list(f.provided_by),
        }

    return {
        "base": str(base_dir),
        "donor": str(donor_dir),
        "files": list(verdict.files),
        "ok": verdict.ok,
        "unresolved": [finding(f) for f in verdict.findings],
        "closure": {
            "extra_files": list(verdict.extra_files),
            "replaces_base": list(verdict.replaces_base),
            "still_unresolved": [finding(f) for f in verdict.still_unresolved],
            "breaks_base": [finding(f) for f in verdict.breaks_base],
        },
    }


def report(verdict: Verdict) -> str:
    lines = [f"copied from donor: {', '.join(verdict.files)}"]
    if verdict.ok:
        lines.append("OK: every vllm module and name the copied files import resolves in the base tree")
        return "\n".join(lines)
    lines.append(f"UNRESOLVED: {len(verdict.findings)} vllm import(s) do not resolve in the base tree:")
    for f in verdict.findings:
        provider = ", ".join(f.provided_by) or "nothing in the donor either"
        lines.append(f"  {f.label}")
        lines.append(f"      needed by {', '.join(f.needed_by)}")
        lines.append(f"      provided by donor {provider}")
    lines.append(f"closure: the hybrid would additionally need {len(verdict.extra_files)} donor file(s):")
    for rel in verdict.extra_files:
        lines.append(
            f"  + {rel}" + ("  (replaces the base file)" if rel in verdict.replaces_base else "  (new)")
        )
    if verdict.still_unresolved:
        lines.append("still unresolved with the closure in place (the donor does not provide them):")
        lines.extend(f"  {f.label}  needed by {', '.join(f.needed_by)}" for f in verdict.still_unresolved)
    if verdict.breaks_base:
        lines.append("base imports the replaced files would break (the closure alone is not enough):")
        lines.extend(f"  {f.label}  imported by {', '.join(f.needed_by)}" for f in verdict.breaks_base)
    elif verdict.replaces_base:
        lines.append("no base import of the replaced file(s) breaks (names checked, not behaviour)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, type=Path, help="the base tree's `vllm` package directory")
    parser.add_argument("--donor", required=True, type=Path, help="the donor tree's `vllm` package directory")
    parser.add_argument("--files", nargs="+", help="donor files to copy, relative to the donor `vllm` dir")
    parser.add_argument("--extra", nargs="+", default=[], help="donor files to copy besides --files/defaults")
    parser.add_argument("--json", action="store_true", help="print the verdict as JSON")
    parser.add_argument("--stage", type=Path, help="on success, copy the proven files into this directory")
    args = parser.parse_args(argv)
    for label, root in (("--base", args.base), ("--donor", args.donor)):
        if not (root / "__init__.py").is_file():
            print(
                f"vllm_compat: {label} {root}: not a vllm package directory (no __init__.py)", file=sys.stderr
            )
            return EXIT_USAGE
    files = list(dict.fromkeys([*(args.files or default_files(args.donor)), *args.extra]))
    missing = [rel for rel in files if not (args.donor / rel).is_file() or not rel.endswith(".py")]
    if not files or missing:
        print(f"vllm_compat: donor {args.donor} lacks {missing or 'any Qwen3.5 module'}", file=sys.stderr)
        return EXIT_USAGE
    verdict = prove(args.base, args.donor, files)
    if args.json:
        print(json.dumps(to_json(verdict, args.base, args.donor), indent=2))
    else:
        print(report(verdict))
    if not verdict.ok:
        return EXIT_UNRESOLVED
    if args.stage is not None:
        stage(args.donor, files, args.stage)
    return EXIT_OK


def stage(donor_dir: Path, files: list[str], out: Path) -> None:
    """Copy the proven donor files into `out`, keeping their paths relative to the `vllm` dir."""
    for rel in files:
        target = out / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(donor_dir / rel, target)
        print(f"vllm_compat: staged {rel}", file=sys.stderr)


if __name__ == "__main__":
    raise SystemExit(main())
