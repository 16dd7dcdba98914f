"""`components/layout.py` is the one place where config becomes a resource's inputs: the graph's stages
(components/deployment/) that build the node resources below read no config section for their inputs,
but take them from layout. Checked over the source, so a new input read inline fails here.

What it holds: in every function of components/deployment/ that builds one of `FROM_LAYOUT`, and in
every function of the package it calls by name from there, no `<config>.<section>` is read (a
section: a field of StackConfig but `nodes`; the node set, `head` and `workers` wire per-node outputs).
What it leaves to the graph: the test of an `if` (whether a resource exists at all, e.g. none under
`answers.mode: off`), and what `Qwen35Deployment`'s own methods derive from FabricCheck's outputs.
"""

from __future__ import annotations

import ast
from pathlib import Path

from components.config import StackConfig

ROOT = Path(__file__).resolve().parents[2]
DEPLOYMENT = ROOT / "components" / "deployment"
# The resources whose inputs come from layout (each with a `*_inputs` function there).
FROM_LAYOUT = {
    "AnswerCheck",
    "FabricCheck",
    "ModelSupportCheck",
    "NodeProof",
    "ReadinessGate",
    "ServeBench",
    "StackClaim",
}
# Functions of the package not followed, each with why.
NOT_FOLLOWED = {
    # The stack output `fabric` (outputs.py), handed to ServeBench whole: it explains a figure below
    # its floor with what the stack reports, not with inputs of its own.
    "fabric_outputs",
}
SECTIONS = set(StackConfig.model_fields) - {"nodes"}


def is_config(node: ast.expr) -> bool:
    """`cfg`, `config`, or `<anything>.config` (the deployment's)."""
    return (isinstance(node, ast.Name) and node.id in ("cfg", "config")) or (
        isinstance(node, ast.Attribute) and node.attr == "config"
    )


def functions() -> dict[str, tuple[str, ast.FunctionDef]]:
    """Every module-level function of the deployment package, by name: (module file, its tree)."""
    found = {}
    for path in sorted(DEPLOYMENT.glob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef):
                found[node.name] = (path.name, node)
    return found


def section_reads(function: ast.FunctionDef) -> list[tuple[int, str]]:
    """(line, `section`) of each config section read in `function`, but in the test of an `if`."""
    skipped = {id(n) for stmt in ast.walk(function) if isinstance(stmt, ast.If) for n in ast.walk(stmt.test)}
    return [
        (node.lineno, node.attr)
        for node in ast.walk(function)
        if isinstance(node, ast.Attribute)
        and node.attr in SECTIONS
        and is_config(node.value)
        and id(node) not in skipped
    ]


def called(function: ast.FunctionDef) -> set[str]:
    """The names `function` calls directly (`f(...)`, not `obj.f(...)`)."""
    return {n.func.id for n in ast.walk(function) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}


def builders(package: dict[str, tuple[str, ast.FunctionDef]]) -> set[str]:
    """The package's functions that build one of FROM_LAYOUT."""
    return {name for name, (_, fn) in package.items() if called(fn) & FROM_LAYOUT}


def test_every_resource_from_layout_is_built_in_the_graph():
    # So the check below is not vacuous: each resource named is built by some stage.
    package = functions()
    built = set().union(*(called(fn) for _, fn in package.values()))
    assert not FROM_LAYOUT - built, FROM_LAYOUT - built


def test_the_graph_takes_these_resources_inputs_from_layout():
    package = functions()
    todo, seen, reads = sorted(builders(package)), set(), []
    while todo:
        name = todo.pop()
        if name in seen or name in NOT_FOLLOWED or name not in package:
            continue
        seen.add(name)
        module, fn = package[name]
        reads += [f"{module}:{line} {name} reads config.{section}" for line, section in section_reads(fn)]
        todo += sorted(called(fn))
    assert not reads, "\n".join(["read these through components/layout.py:", *reads])


def test_the_check_sees_an_inline_read():
    source = (
        "def stage(deployment):\n"
        "    cfg = deployment.config\n"
        "    return StackClaim(prefix=cfg.containers.name_prefix)\n"
    )
    fn = ast.parse(source).body[0]
    assert isinstance(fn, ast.FunctionDef)
    assert builders({"stage": ("x.py", fn)}) == {"stage"}
    assert section_reads(fn) == [(3, "containers")]
