#!/usr/bin/env python3
"""Register the Qwen3.5 architectures and configs in an older vLLM tree.

    patch_vllm_qwen35.py --vllm-dir DIR [--check]

DIR is the `vllm` package directory. The registries are found by parsing each file (ast); new entries
are inserted as source text before the closing bracket, so the rest of the file keeps its formatting.
Exit 0: patched (now or already). Exit 3 (--check): a patch is needed, nothing changed.
Exit 2: cannot patch (missing file, missing anchor, conflicting entry); nothing changed.
Standard library only: this runs inside the image build with the base image's python (3.10+).
"""

from __future__ import annotations

import argparse
import ast
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

EXIT_OK = 0
EXIT_CANNOT_PATCH = 2
EXIT_NEEDS_PATCH = 3

REGISTRY = "model_executor/models/registry.py"
CONFIGS_INIT = "transformers_utils/configs/__init__.py"
CONFIG = "transformers_utils/config.py"

# Module and class names exactly as vLLM 0.17.1 (the donor) registers them. The donor registers no
# Qwen3.5 causal-LM variant in _TEXT_GENERATION_MODELS (Qwen3_5ForCausalLM exists only as a class
# inside qwen3_5.py), so none is added here; tests/unit/test_patcher.py checks this table against
# the donor's own registries.
ENTRIES: dict[str, dict[str, dict[str, object]]] = {
    REGISTRY: {
        "_MULTIMODAL_MODELS": {
            "Qwen3_5ForConditionalGeneration": ("qwen3_5", "Qwen3_5ForConditionalGeneration"),
            "Qwen3_5MoeForConditionalGeneration": ("qwen3_5", "Qwen3_5MoeForConditionalGeneration"),
        },
        "_SPECULATIVE_DECODING_MODELS": {
            "Qwen3_5MTP": ("qwen3_5_mtp", "Qwen3_5MTP"),
            "Qwen3_5MoeMTP": ("qwen3_5_mtp", "Qwen3_5MoeMTP"),
        },
    },
    CONFIGS_INIT: {
        "_CLASS_TO_MODULE": {
            "Qwen3_5Config": "vllm.transformers_utils.configs.qwen3_5",
            "Qwen3_5TextConfig": "vllm.transformers_utils.configs.qwen3_5",
            "Qwen3_5MoeConfig": "vllm.transformers_utils.configs.qwen3_5_moe",
            "Qwen3_5MoeTextConfig": "vllm.transformers_utils.configs.qwen3_5_moe",
        },
        # A list anchor: the keys are its items; the values are unused.
        "__all__": dict.fromkeys(
            ["Qwen3_5Config", "Qwen3_5TextConfig", "Qwen3_5MoeConfig", "Qwen3_5MoeTextConfig"]
        ),
    },
    CONFIG: {
        "_CONFIG_REGISTRY": {"qwen3_5": "Qwen3_5Config", "qwen3_5_moe": "Qwen3_5MoeConfig"},
    },
}


class PatchError(Exception):
    """The tree cannot be patched; the message names the file and what is missing."""


@dataclass(frozen=True)
class Insertion:
    """Text to insert at a character offset of a file."""

    offset: int
    text: str


@dataclass(frozen=True)
class FilePlan:
    """What one file needs: the entries still missing and the new text that adds them."""

    path: Path
    missing: tuple[str, ...]
    new_text: str


@dataclass(frozen=True)
class _Container:
    """A registry literal: its kind ('dict', 'call' for keyword calls, 'list'), keys and geometry."""

    kind: str
    existing: dict[str, object]
    close: tuple[int, int]  # (line, byte col) of the closing bracket
    last_end: tuple[int, int] | None  # end of the last element
    last_start_line: int | None


def _literal(node: ast.AST) -> object:
    try:
        return ast.literal_eval(node)
    except ValueError:
        return ast.dump(node)


def _find_container(tree: ast.Module, anchor: str) -> ast.AST | None:
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign):
            names = [t.id for t in stmt.targets if isinstance(t, ast.Name)]
        elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            names = [stmt.target.id]
        else:
            continue
        if anchor in names:
            return stmt.value
    return None


def _describe(node: ast.AST, anchor: str, rel: str) -> _Container:
    """Read a registry literal: `{...}`, `[...]`, `(...)`, `SomeDict(key="v", ...)` or `SomeDict({...})`."""
    close = (node.end_lineno, node.end_col_offset - 1)
    if isinstance(node, ast.Call) and not node.keywords and len(node.args) == 1:
        return _describe(node.args[0], anchor, rel)
    if isinstance(node, ast.Dict):
        existing = {k.value: _literal(v) for k, v in zip(node.keys, node.values, strict=True) if _is_str(k)}
        last = node.values[-1] if node.values else None
        first_of_last = (node.keys[-1] or node.values[-1]) if node.values else None
        kind = "dict"
    elif isinstance(node, ast.Call) and not node.args and node.keywords:  # e.g. LazyConfigDict(a="A")
        existing = {kw.arg: _literal(kw.value) for kw in node.keywords if kw.arg is not None}
        last = node.keywords[-1].value if node.keywords else None
        first_of_last = node.keywords[-1] if node.keywords else None
        kind = "call"
    elif isinstance(node, (ast.List, ast.Tuple)):
        existing = {e.value: None for e in node.elts if _is_str(e)}
        last = node.elts[-1] if node.elts else None
        first_of_last = last
        kind = "list"
    else:
        what = type(node).__name__
        raise PatchError(f"{rel}: {anchor} is a {what}, not a dict, keyword call or list literal")
    if kind == "list" and isinstance(node, ast.Tuple) and not _source_has_parens(node):
        raise PatchError(f"{rel}: {anchor} is a bare tuple without brackets; cannot insert entries")
    return _Container(
        kind=kind,
        existing=existing,
        close=close,
        last_end=(last.end_lineno, last.end_col_offset) if last is not None else None,
        last_start_line=first_of_last.lineno if first_of_last is not None else None,
    )


def _is_str(node: ast.AST | None) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str)


def _source_has_parens(node: ast.Tuple) -> bool:
    # A parenthesised tuple starts one column before its first element (or is empty).
    return not node.elts or (node.elts[0].col_offset > node.col_offset)


def _item_text(kind: str, key: str, value: object) -> str:
    if kind == "dict":
        return f"{key!r}: {value!r}".replace("'", '"')
    if kind == "call":
        return f"{key}={value!r}".replace("'", '"')
    return f"{key!r}".replace("'", '"')


def _offsets(text: str) -> list[int]:
    """Character offset of the start of each line (1-based line numbers index this list directly)."""
    starts = [0, 0]
    for line in text.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    return starts


def _char_offset(lines: list[str], starts: list[int], pos: tuple[int, int]) -> int:
    """Turn an ast (line, utf-8 byte column) into a character offset into the text."""
    line, col = pos
    return starts[line] + len(lines[line - 1].encode("utf-8")[:col].decode("utf-8"))


def _has_trailing_comma(text: str, start: int, stop: int) -> bool:
    i = start
    while i < stop:
        ch = text[i]
        if ch == ",":
            return True
        if ch == "#":
            i = text.find("\n", i, stop)
            if i < 0:
                return False
        elif not ch.isspace():
            return False
        i += 1
    return False


def _insertions(text: str, box: _Container, items: list[str]) -> list[Insertion]:
    lines = text.splitlines(keepends=True)
    starts = _offsets(text)
    close_at = _char_offset(lines, starts, box.close)
    close_line_start = starts[box.close[0]]
    out: list[Insertion] = []
    comma = True
    if box.last_end is not None:
        last_end = _char_offset(lines, starts, box.last_end)
        comma = _has_trailing_comma(text, last_end, close_at)
    on_own_line = text[close_line_start:close_at].strip() == ""
    if on_own_line and not (box.last_end is not None and box.close[0] == box.last_end[0]):
        if not comma:
            out.append(Insertion(last_end, ","))
        if box.last_start_line is not None:
            ref = lines[box.last_start_line - 1]
            indent = ref[: len(ref) - len(ref.lstrip())]
        else:
            closing = lines[box.close[0] - 1]
            indent = closing[: len(closing) - len(closing.lstrip())] + "    "
        newline = "\r\n" if lines[box.close[0] - 1].endswith("\r\n") else "\n"
        # Right after the last entry's line, so trailing comment blocks stay at the end.
        at = starts[box.last_end[0] + 1] if box.last_end is not None else close_line_start
        out.append(Insertion(at, "".join(f"{indent}{item},{newline}" for item in items)))
    else:
        lead = "" if box.last_end is None else (" " if comma else ", ")
        out.append(Insertion(close_at, lead + ", ".join(items)))
    return out


def plan_file(vllm_dir: Path, rel: str, anchors: dict[str, dict[str, object]]) -> FilePlan:
    """Work out which entries `rel` lacks and the patched text; raise PatchError when it cannot."""
    path = vllm_dir / rel
    if not path.is_file():
        raise PatchError(f"{path}: file not found (is --vllm-dir the `vllm` package directory?)")
    text = path.read_bytes().decode("utf-8")
    try:
        tree = ast.parse(text, filename=str(path))
    except SyntaxError as exc:
        raise PatchError(f"{path}: does not parse: {exc}") from exc
    insertions: list[Insertion] = []
    missing: list[str] = []
    for anchor, wanted in anchors.items():
        node = _find_container(tree, anchor)
        if node is None:
            raise PatchError(f"{path}: anchor `{anchor}` (a module-level assignment) not found")
        box = _describe(node, anchor, str(path))
        items = []
        for key, value in wanted.items():
            if key in box.existing:
                have = box.existing[key]
                if box.kind != "list" and have != value:
                    raise PatchError(
                        f"{path}: {anchor}[{key!r}] is {have!r}, expected {value!r}; refusing to change it"
                    )
                continue
            items.append(_item_text(box.kind, key, value))
            missing.append(f"{anchor}[{key!r}]")
        if items:
            insertions.extend(_insertions(text, box, items))
    for ins in sorted(insertions, key=lambda i: i.offset, reverse=True):
        text = text[: ins.offset] + ins.text + text[ins.offset :]
    return FilePlan(path=path, missing=tuple(missing), new_text=text)


def write_atomically(plan: FilePlan) -> None:
    """Write the new text to a temp file beside the target, prove it parses, then rename over it."""
    try:
        ast.parse(plan.new_text, filename=str(plan.path))
    except SyntaxError as exc:
        raise PatchError(f"{plan.path}: patched text does not parse ({exc}); file left unchanged") from exc
    fd, tmp = tempfile.mkstemp(prefix=f".{plan.path.name}.", suffix=".tmp", dir=plan.path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(plan.new_text.encode("utf-8"))
        os.chmod(tmp, plan.path.stat().st_mode & 0o7777)
        os.replace(tmp, plan.path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def plan_tree(vllm_dir: Path) -> list[FilePlan]:
    """Plan every file first, so a tree that cannot be patched is left entirely untouched."""
    return [plan_file(vllm_dir, rel, anchors) for rel, anchors in ENTRIES.items()]


def run(vllm_dir: Path, check: bool) -> int:
    try:
        plans = plan_tree(vllm_dir)
    except PatchError as exc:
        print(f"patch_vllm_qwen35: cannot patch: {exc}", file=sys.stderr)
        return EXIT_CANNOT_PATCH
    needed = [p for p in plans if p.missing]
    for plan in needed:
        verb = "needs" if check else "adding"
        print(f"patch_vllm_qwen35: {plan.path}: {verb} {', '.join(plan.missing)}")
    if not needed:
        print(f"patch_vllm_qwen35: {vllm_dir}: Qwen3.5 already registered, nothing to do")
        return EXIT_OK
    if check:
        return EXIT_NEEDS_PATCH
    try:
        for plan in needed:
            write_atomically(plan)
    except PatchError as exc:
        print(f"patch_vllm_qwen35: cannot patch: {exc}", file=sys.stderr)
        return EXIT_CANNOT_PATCH
    print(f"patch_vllm_qwen35: {vllm_dir}: Qwen3.5 registered")
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vllm-dir", required=True, type=Path, help="the `vllm` package directory")
    parser.add_argument("--check", action="store_true", help="exit 3 if a patch is needed; change nothing")
    args = parser.parse_args(argv)
    return run(args.vllm_dir, args.check)


if __name__ == "__main__":
    raise SystemExit(main())
