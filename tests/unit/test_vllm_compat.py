"""patches/vllm_compat.py: the verdict on the real pair (base 0.14.0, donor 0.17.1), plus small trees."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.patch_modules import PATCHES, load_patch_module
from tests.support.vllm_trees import BASE_VERSION, DONOR_VERSION, vllm_tree

QWEN35_FILES = [
    "model_executor/models/qwen3_5.py",
    "model_executor/models/qwen3_5_mtp.py",
    "transformers_utils/configs/qwen3_5.py",
    "transformers_utils/configs/qwen3_5_moe.py",
]
MAMBA_UTILS = "model_executor/layers/mamba/mamba_utils.py"


compat = load_patch_module("vllm_compat")


@pytest.fixture(scope="session")
def verdict(base_tree: Path, donor_tree: Path):
    return compat.prove(base_tree, donor_tree, compat.default_files(donor_tree))


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, str(PATCHES / "vllm_compat.py"), *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120)


def test_default_files_are_the_donor_qwen35_modules(donor_tree: Path) -> None:
    assert compat.default_files(donor_tree) == QWEN35_FILES


def test_real_pair_verdict(verdict) -> None:
    # 0.14.0 lacks the Mamba state-copy helpers qwen3_5.py imports; the donor's mamba_utils.py has them.
    assert not verdict.ok
    assert [(f.module, f.name) for f in verdict.findings] == [
        ("vllm.model_executor.layers.mamba.mamba_utils", "MambaStateCopyFunc"),
        ("vllm.model_executor.layers.mamba.mamba_utils", "MambaStateCopyFuncCalculator"),
    ]
    for finding in verdict.findings:
        assert finding.needed_by == ("model_executor/models/qwen3_5.py:47",)
        assert finding.provided_by == (MAMBA_UTILS,)
    assert verdict.extra_files == (MAMBA_UTILS,)
    assert verdict.replaces_base == (MAMBA_UTILS,)
    assert verdict.still_unresolved == ()
    assert verdict.breaks_base == ()  # no 0.14.0 module imports a name the donor's mamba_utils dropped


def test_cli_on_real_pair(base_tree: Path, donor_tree: Path, tmp_path: Path) -> None:
    stage = tmp_path / "stage"
    failing = _cli("--base", str(base_tree), "--donor", str(donor_tree), "--stage", str(stage))
    assert failing.returncode == compat.EXIT_UNRESOLVED
    assert "vllm.model_executor.layers.mamba.mamba_utils:MambaStateCopyFuncCalculator" in failing.stdout
    assert f"+ {MAMBA_UTILS}  (replaces the base file)" in failing.stdout
    assert not stage.exists()  # nothing unproven is staged

    as_json = json.loads(_cli("--base", str(base_tree), "--donor", str(donor_tree), "--json").stdout)
    assert as_json["ok"] is False
    assert as_json["closure"]["extra_files"] == [MAMBA_UTILS]
    assert {u["name"] for u in as_json["unresolved"]} == {
        "MambaStateCopyFunc",
        "MambaStateCopyFuncCalculator",
    }

    passing = _cli(
        "--base", str(base_tree), "--donor", str(donor_tree), "--extra", MAMBA_UTILS, "--stage", str(stage)
    )
    assert passing.returncode == compat.EXIT_OK, passing.stdout
    staged = sorted(p.relative_to(stage).as_posix() for p in stage.rglob("*.py"))
    assert staged == sorted([*QWEN35_FILES, MAMBA_UTILS])
    for rel in staged:
        assert (stage / rel).read_bytes() == (donor_tree / rel).read_bytes()


def test_cli_rejects_bad_dirs(tmp_path: Path, donor_tree: Path) -> None:
    result = _cli("--base", str(tmp_path), "--donor", str(donor_tree))
    assert result.returncode == compat.EXIT_USAGE
    assert "not a vllm package dir" in result.stderr


# The resolver is neither blind nor noisy: every import of each real release resolves against that
# same release, except the few that are really broken or platform-specific in the x86_64 CUDA wheel.
KNOWN_UNRESOLVED = {
    BASE_VERSION: {
        ("vllm.transformers_utils.tokenizer", "AnyTokenizer"),  # nemotron_parse.py: broken in 0.14.0
        ("vllm._rocm_C", ""),  # ROCm extension, absent from the CUDA wheel
    },
    DONOR_VERSION: {("vllm._C_AVX2", ""), ("vllm._rocm_C", "")},
}


@pytest.mark.parametrize("version", [BASE_VERSION, DONOR_VERSION])
def test_each_release_is_self_consistent(version: str) -> None:
    tree = compat.Tree(vllm_tree(version))
    resolver = compat.Resolver(compat.Overlay(tree, tree, set()))
    unresolved = set()
    uses = 0
    for path in sorted(tree.root.rglob("*.py")):
        for use in tree.info(path.relative_to(tree.root).as_posix()).uses:
            uses += 1
            if not resolver.resolves(use.module, use.name):
                unresolved.add((use.module, use.name))
    assert uses > 10_000
    assert unresolved == KNOWN_UNRESOLVED[version]


def _tree(root: Path, files: dict[str, str]) -> Path:
    pkg = root / "vllm"
    for rel, text in {"__init__.py": "", **files}.items():
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text(text)
    return pkg


@pytest.mark.parametrize(
    ("base_files", "copied_source", "unresolved"),
    [
        # star re-export without __all__: public names only
        ({"a/__init__.py": "from .b import *\n", "a/b.py": "X = 1\n_p = 2\n"}, "from vllm.a import X\n", []),
        (
            {"a/__init__.py": "from .b import *\n", "a/b.py": "_p = 2\n"},
            "from vllm.a import _p\n",
            ["vllm.a:_p"],
        ),
        # __all__ limits what a star import brings
        (
            {"a/__init__.py": "from .b import *\n", "a/b.py": "__all__ = ['X']\nX = 1\nY = 2\n"},
            "from vllm.a import Y\n",
            ["vllm.a:Y"],
        ),
        # submodule import, relative import, aliased binding
        ({"a/__init__.py": "", "a/b.py": ""}, "from vllm.a import b\nfrom .a.b import *\n", []),
        ({"a/b.py": "from x import Q as R\n"}, "from vllm.a.b import R\n", []),
        # lazy module: served by __getattr__ when listed in __all__ or declared for type checkers
        (
            {"c.py": "__all__ = ['L']\ndef __getattr__(n): ...\nif TYPE_CHECKING:\n    T: int\n"},
            "from vllm.c import L, T, Z\n",
            ["vllm.c:Z"],
        ),
        # names bound only under TYPE_CHECKING do not exist at runtime
        ({"c.py": "if TYPE_CHECKING:\n    from x import T\n"}, "from vllm.c import T\n", ["vllm.c:T"]),
        # imports under TYPE_CHECKING in the copied file are not checked; those in functions are
        (
            {},
            "if TYPE_CHECKING:\n    from vllm.gone import A\ndef f():\n    import vllm.gone2\n",
            ["vllm.gone2"],
        ),
        # a missing module, and a missing name in a module that exists
        ({"d.py": "A = 1\n"}, "import vllm.nope\nfrom vllm.d import A, B\n", ["vllm.nope", "vllm.d:B"]),
    ],
)
def test_resolution_rules(
    tmp_path: Path, base_files: dict, copied_source: str, unresolved: list[str]
) -> None:
    base = _tree(tmp_path / "base", base_files)
    donor = _tree(tmp_path / "donor", {"m.py": copied_source})
    findings = compat.check(compat.Tree(base), compat.Tree(donor), {"m.py"})
    assert sorted(f"{f.module}:{f.name}".rstrip(":") for f in findings) == sorted(unresolved)


def test_closure_follows_reexports_and_flags_what_a_replacement_breaks(tmp_path: Path) -> None:
    base = _tree(
        tmp_path / "base",
        {
            "ops/__init__.py": "from .impl import *\n",
            "ops/impl.py": "OLD = 1\n",
            "user.py": "from vllm.ops.impl import OLD\n",
        },
    )
    donor = _tree(
        tmp_path / "donor",
        {
            "ops/__init__.py": "from .impl import *\n",
            "ops/impl.py": "NEW = 1\n",
            "model.py": "from vllm.ops import NEW\nfrom vllm.gone import G\n",
        },
    )
    verdict = compat.prove(base, donor, ["model.py"])
    assert [(f.label, f.provided_by) for f in verdict.findings] == [
        ("vllm.gone (module missing)", ()),
        # ops/__init__.py alone is not enough: its star import must reach the donor's impl.py.
        ("vllm.ops:NEW", ("ops/__init__.py", "ops/impl.py")),
    ]
    assert verdict.extra_files == ("ops/__init__.py", "ops/impl.py")
    assert [f.label for f in verdict.still_unresolved] == ["vllm.gone (module missing)"]
    assert [(f.label, f.needed_by) for f in verdict.breaks_base] == [("vllm.ops.impl:OLD", ("user.py:1",))]
