"""patches/patch_vllm_qwen35.py against the real vLLM 0.14.0 tree (donor: 0.17.1), plus edge cases."""

from __future__ import annotations

import ast
import difflib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.patch_modules import PATCHES, load_patch_module

patcher = load_patch_module("patch_vllm_qwen35")
FILES = tuple(patcher.ENTRIES)


@pytest.fixture
def base_copy(base_tree: Path, tmp_path: Path) -> Path:
    """The three registry files of the real 0.14.0 tree, at their paths under a scratch `vllm` dir."""
    root = tmp_path / "vllm"
    for rel in FILES:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(base_tree / rel, root / rel)
    return root


def _snapshot(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _run(root: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, str(PATCHES / "patch_vllm_qwen35.py"), "--vllm-dir", str(root), *extra]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


def _value(node: ast.expr) -> object:
    try:
        return ast.literal_eval(node)
    except ValueError:
        return ast.dump(node)


def _registries(path: Path) -> dict[str, dict[str, object]]:
    """Every module-level dict literal / keyword call / list of a file, as plain values."""
    out: dict[str, dict[str, object]] = {}
    for stmt in ast.parse(path.read_text()).body:
        target = stmt.targets[0] if isinstance(stmt, ast.Assign) else getattr(stmt, "target", None)
        if not isinstance(target, ast.Name) or not isinstance(stmt, (ast.Assign, ast.AnnAssign)):
            continue
        node = stmt.value
        if isinstance(node, ast.Dict):
            out[target.id] = {
                k.value: _value(v)
                for k, v in zip(node.keys, node.values, strict=True)
                if isinstance(k, ast.Constant)
            }
        elif isinstance(node, ast.Call) and node.keywords:
            out[target.id] = {kw.arg: _value(kw.value) for kw in node.keywords if kw.arg}
        elif isinstance(node, ast.List):
            out[target.id] = dict.fromkeys(map(_value, node.elts))
    return out


def _qwen35(entries: dict[str, object]) -> dict[str, object]:
    return {k: v for k, v in entries.items() if k.lower().startswith("qwen3_5")}


def test_entries_are_exactly_what_the_donor_registers(donor_tree: Path) -> None:
    # Every Qwen3.5 key of every registry in the donor, no more and no less (no causal-LM variant there).
    for rel, anchors in patcher.ENTRIES.items():
        donor = {name: _qwen35(d) for name, d in _registries(donor_tree / rel).items() if _qwen35(d)}
        assert donor == anchors, rel
    donor_registry = _registries(donor_tree / patcher.REGISTRY)
    assert not _qwen35(donor_registry["_TEXT_GENERATION_MODELS"])


def test_base_lacks_qwen35_and_check_says_so(base_copy: Path) -> None:
    before = _snapshot(base_copy)
    result = _run(base_copy, "--check")
    assert result.returncode == patcher.EXIT_NEEDS_PATCH, result.stderr
    assert "_MULTIMODAL_MODELS['Qwen3_5ForConditionalGeneration']" in result.stdout
    assert _snapshot(base_copy) == before


def test_patches_real_base_with_insertions_only(base_copy: Path, base_tree: Path, donor_tree: Path) -> None:
    result = _run(base_copy)
    assert result.returncode == 0, result.stderr
    for rel, anchors in patcher.ENTRIES.items():
        old = (base_tree / rel).read_text().splitlines()
        new = (base_copy / rel).read_text().splitlines()
        matcher = difflib.SequenceMatcher(a=old, b=new, autojunk=False)
        ops = [op for op in matcher.get_opcodes() if op[0] != "equal"]
        assert {op[0] for op in ops} == {"insert"}, rel  # nothing else in the file changed
        added = sum(j2 - j1 for _, _, _, j1, j2 in ops)
        assert added == sum(len(v) for v in anchors.values()), rel
        patched = _registries(base_copy / rel)
        base = _registries(base_tree / rel)
        for anchor, wanted in anchors.items():
            assert _qwen35(patched[anchor]) == wanted
            assert {k: v for k, v in patched[anchor].items() if k not in wanted} == base[anchor]
    donor_mm = _registries(donor_tree / patcher.REGISTRY)["_MULTIMODAL_MODELS"]
    patched_mm = _registries(base_copy / patcher.REGISTRY)["_MULTIMODAL_MODELS"]
    assert _qwen35(patched_mm) == _qwen35(donor_mm)
    lines = (base_copy / patcher.CONFIG).read_text().splitlines()
    assert '    qwen3_5="Qwen3_5Config",' in lines  # the keyword-call style of LazyConfigDict(...)


def test_second_run_changes_nothing(base_copy: Path) -> None:
    assert _run(base_copy).returncode == 0
    after_first = _snapshot(base_copy)
    second = _run(base_copy)
    assert second.returncode == 0
    assert "already registered" in second.stdout
    assert _snapshot(base_copy) == after_first
    assert _run(base_copy, "--check").returncode == 0


def test_keeps_file_mode_and_leaves_no_temp_files(base_copy: Path) -> None:
    os.chmod(base_copy / patcher.CONFIG, 0o640)
    assert _run(base_copy).returncode == 0
    assert (base_copy / patcher.CONFIG).stat().st_mode & 0o777 == 0o640
    assert not [p for p in base_copy.rglob("*.tmp")]


@pytest.mark.parametrize(
    ("rel", "anchor"),
    [
        (patcher.REGISTRY, "_MULTIMODAL_MODELS"),
        (patcher.REGISTRY, "_SPECULATIVE_DECODING_MODELS"),
        (patcher.CONFIGS_INIT, "_CLASS_TO_MODULE"),
        (patcher.CONFIGS_INIT, "__all__"),
        (patcher.CONFIG, "_CONFIG_REGISTRY"),
    ],
)
def test_refuses_tree_without_anchor_and_changes_nothing(base_copy: Path, rel: str, anchor: str) -> None:
    path = base_copy / rel
    text = path.read_text().replace(f"{anchor} =", f"{anchor}_RENAMED =", 1)
    path.write_text(text.replace(f"{anchor}: ", "x: ", 1))
    before = _snapshot(base_copy)
    for extra in ((), ("--check",)):
        result = _run(base_copy, *extra)
        assert result.returncode == patcher.EXIT_CANNOT_PATCH
        assert str(path) in result.stderr and f"`{anchor}`" in result.stderr
    assert _snapshot(base_copy) == before  # the other, patchable files were not touched either


def test_refuses_missing_file_naming_it(tmp_path: Path) -> None:
    result = _run(tmp_path)
    assert result.returncode == patcher.EXIT_CANNOT_PATCH
    assert patcher.REGISTRY in result.stderr and "not found" in result.stderr


def test_refuses_conflicting_entry(base_copy: Path) -> None:
    path = base_copy / patcher.CONFIG
    conflict = '    qwen3_5="SomethingElse",\n    tarsier2='
    path.write_text(path.read_text().replace("    tarsier2=", conflict, 1))
    result = _run(base_copy)
    assert result.returncode == patcher.EXIT_CANNOT_PATCH
    assert "_CONFIG_REGISTRY['qwen3_5']" in result.stderr and "SomethingElse" in result.stderr


def test_failed_rename_leaves_original_and_no_temp(base_copy: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    before = _snapshot(base_copy)

    def boom(src: str, dst: str) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(patcher.os, "replace", boom)
    with pytest.raises(OSError):
        patcher.run(base_copy, check=False)
    assert _snapshot(base_copy) == before


# Source shapes the registries could take, and the exact text the patcher must produce.
SHAPES = [
    (
        'X = {\n    "a": 1,\n}\n',
        'X = {\n    "a": 1,\n    "k": "v",\n}\n',
    ),
    (
        'X = {\n    "a": 1  # no trailing comma\n}\n',
        'X = {\n    "a": 1,  # no trailing comma\n    "k": "v",\n}\n',
    ),
    ('X = {"a": 1}\n', 'X = {"a": 1, "k": "v"}\n'),
    ("X: dict[str, str] = {}\n", 'X: dict[str, str] = {"k": "v"}\n'),
    (
        'X = LazyDict(\n    a="1",\n    # trailing comment\n)\n',
        'X = LazyDict(\n    a="1",\n    k="v",\n    # trailing comment\n)\n',
    ),
    ('X = LazyDict({"a": 1})\n', 'X = LazyDict({"a": 1, "k": "v"})\n'),
    ('X = {\n    "é": "ü", "a": 1,\n}\n', 'X = {\n    "é": "ü", "a": 1,\n    "k": "v",\n}\n'),
]


@pytest.mark.parametrize(("source", "expected"), SHAPES)
def test_insertion_keeps_formatting(tmp_path: Path, source: str, expected: str) -> None:
    (tmp_path / "m.py").write_text(source, encoding="utf-8")
    plan = patcher.plan_file(tmp_path, "m.py", {"X": {"k": "v"}})
    assert plan.new_text == expected
    (tmp_path / "m.py").write_text(plan.new_text, encoding="utf-8")
    assert patcher.plan_file(tmp_path, "m.py", {"X": {"k": "v"}}).missing == ()


def test_list_anchor(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text('__all__ = [\n    "A",\n]\n')
    plan = patcher.plan_file(tmp_path, "m.py", {"__all__": dict.fromkeys(["B", "A"])})
    assert plan.new_text == '__all__ = [\n    "A",\n    "B",\n]\n'


def test_refuses_computed_registry(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text("X = make_registry()\n")
    with pytest.raises(patcher.PatchError, match="X is a Call"):
        patcher.plan_file(tmp_path, "m.py", {"X": {"k": "v"}})


def test_smoke_import_fails_clearly_without_qwen35(tmp_path: Path) -> None:
    # A stand-in vllm whose registries lack Qwen3.5: the smoke must fail and say what is missing.
    pkg = tmp_path / "vllm"
    (pkg / "model_executor" / "models").mkdir(parents=True)
    (pkg / "transformers_utils").mkdir()
    for d in (pkg, pkg / "model_executor", pkg / "model_executor" / "models", pkg / "transformers_utils"):
        (d / "__init__.py").write_text("")
    (pkg / "model_executor" / "models" / "registry.py").write_text(
        "class _R:\n    models = {}\n\n    def get_supported_archs(self):\n        return set()\n\n"
        "ModelRegistry = _R()\n"
    )
    (pkg / "transformers_utils" / "config.py").write_text("_CONFIG_REGISTRY = {}\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    argv = [sys.executable, str(PATCHES / "smoke_import.py")]
    result = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode == 1
    assert "Qwen3_5ForConditionalGeneration is not registered" in result.stderr
    assert "qwen3_5 does not resolve" in result.stderr
