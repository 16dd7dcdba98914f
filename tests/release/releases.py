"""Real vLLM releases for the proof tier: virtualenvs with vLLM and its torch from PyPI, cached outside git.

`release_venv("0.17.1")` returns the python of `<cache>/release/vllm-0.17.1`, made once per machine
(`python -m venv` + `pip install -c constraints-X.txt vllm==X`: ~10 GB, minutes) under a file lock
and recognised by a marker written after the install and an import check (with the constraints'
hash). A venv left without its marker (an interrupted run) is completed by running the same
`pip install` again, which keeps what is already there.

Two overlays go first on PYTHONPATH, so one venv serves several setups without being changed:
  - `transformers_overlay("5.2.0", python)`: exactly the packages `pip install transformers==5.2.0`
    would add or upgrade in that venv (as the seed's Dockerfile does), installed with `--target`;
  - `hybrid_overlay(python, donor)`: the seed's hybrid, built the way patches/Dockerfile builds it: a
    copy of the venv's `vllm` package (hard links) with the donor's proven files staged in by
    `vllm_compat.py --stage` and the registries patched by `patch_vllm_qwen35.py` (atomic writes
    replace the linked files, so the venv's own files are never touched).
The cache is `${QWEN35_CACHE:-~/.cache/qwen35-spark}/release`. Run `python -m tests.release.releases`
to make every venv and overlay the tier uses and print what they hold.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PATCHES = REPO / "patches"
PROVE_MODEL = PATCHES / "prove_model.py"
MARKER = ".qwen35-complete"
INSTALL_TIMEOUT_S = 1800  # a fresh machine took 4-7 min per venv; CI has 90 min in all
PROOF_TIMEOUT_S = 900


class ReleaseError(RuntimeError):
    """A release venv or overlay could not be made; the message says what and what to do."""


def release_root() -> Path:
    """Where the venvs and overlays live (outside git, shared by every clone on this machine)."""
    return Path(os.environ.get("QWEN35_CACHE") or "~/.cache/qwen35-spark").expanduser() / "release"


def host_python() -> str:
    """The Python the venvs are made with: this one's base interpreter (3.10+, as the tier runs)."""
    return getattr(sys, "_base_executable", None) or sys.executable


@contextmanager
def _locked(name: str) -> Iterator[None]:
    release_root().mkdir(parents=True, exist_ok=True)
    with open(release_root() / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _run(argv: list[str], what: str, timeout: int, **kwargs) -> subprocess.CompletedProcess:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kwargs)
    except subprocess.TimeoutExpired as exc:
        raise ReleaseError(f"{what} timed out after {timeout} s: {' '.join(argv)}") from exc
    if done.returncode != 0:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-15:])
        raise ReleaseError(
            f"{what} failed (exit {done.returncode}):\n{tail}\ncommand: {' '.join(argv)}\n"
            "The release tier needs PyPI (or an index carrying vLLM, torch and their wheels)."
        )
    return done


def _marker(folder: Path) -> dict | None:
    try:
        return json.loads((folder / MARKER).read_text())
    except (OSError, ValueError):
        return None


VERSIONS_PROBE = (
    "import json, torch, transformers, vllm; "
    "print(json.dumps({'vllm': vllm.__version__, 'torch': torch.__version__, "
    "'transformers': transformers.__version__}))"
)


def constraints(version: str) -> Path:
    """The pinned environment of `vllm==version` (committed): the same torch and transformers everywhere."""
    path = Path(__file__).resolve().parent / f"constraints-{version}.txt"
    if not path.is_file():
        raise ReleaseError(f"no {path.name} beside {__file__}: pin the release's environment first")
    return path


def _constraints_digest(version: str) -> str:
    return hashlib.sha256(constraints(version).read_bytes()).hexdigest()[:16]


def _venv_current(venv: Path, version: str) -> bool:
    """A complete venv made with today's constraints (changed pins bring the venv up to date)."""
    marker = _marker(venv)
    return bool(marker) and marker.get("constraints") == _constraints_digest(version)


def release_venv(version: str) -> Path:
    """The python of a venv with `vllm==version` and its torch from PyPI; made once, under a lock."""
    venv = release_root() / f"vllm-{version}"
    python = venv / "bin" / "python"
    if _venv_current(venv, version):
        return python
    with _locked(venv.name):
        if _venv_current(venv, version):
            return python
        started = time.monotonic()
        if not python.exists():
            shutil.rmtree(venv, ignore_errors=True)
            _run([host_python(), "-m", "venv", str(venv)], f"making the venv {venv}", 300)
        # Into an existing (interrupted) venv too: pip keeps what is installed and adds the rest.
        _run(
            [
                str(python),
                "-m",
                "pip",
                "install",
                "--quiet",
                "-c",
                str(constraints(version)),
                f"vllm=={version}",
            ],
            f"pip install vllm=={version} into {venv}",
            INSTALL_TIMEOUT_S,
        )
        probe = _run([str(python), "-c", VERSIONS_PROBE], f"importing vLLM {version} in {venv}", 300)
        found = json.loads(probe.stdout.strip().splitlines()[-1])
        if found["vllm"] != version:
            raise ReleaseError(f"{venv} imports vLLM {found['vllm']}, not {version}")
        found["constraints"] = _constraints_digest(version)
        found["seconds"] = round(time.monotonic() - started, 1)
        (venv / MARKER).write_text(json.dumps(found, indent=2) + "\n")
        print(f"release: made {venv} in {found['seconds']} s: {found}", file=sys.stderr)
    return python


def _made_once(folder: Path, make: Callable[[Path], dict]) -> Path:
    """`folder`, made by `make` (which returns what the marker records) unless a complete one is there.
    Under the folder's lock; an incomplete leftover is removed first."""
    if _marker(folder):
        return folder
    with _locked(folder.name):
        if not _marker(folder):
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir(parents=True)
            record = make(folder)
            (folder / MARKER).write_text(json.dumps(record, indent=2) + "\n")
    return folder


def transformers_overlay(version: str, python: Path) -> Path:
    """A folder for PYTHONPATH holding what `pip install transformers==version` changes in that venv."""
    venv = python.parent.parent

    def make(overlay: Path) -> dict:
        report = overlay / "pip-report.json"
        # What pip would install or upgrade in this very venv: the Dockerfile's step, as a dry run.
        _run(
            [str(python), "-m", "pip", "install", "--quiet", "--dry-run", "--report", str(report)]
            + [f"transformers=={version}"],
            f"resolving transformers=={version} against {venv}",
            600,
        )
        pins = [
            f"{item['metadata']['name']}=={item['metadata']['version']}"
            for item in json.loads(report.read_text())["install"]
        ]
        _run(
            [str(python), "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(overlay), *pins],
            f"installing {', '.join(pins)} into {overlay}",
            900,
        )
        return {"transformers": version, "packages": pins}

    return _made_once(release_root() / f"{venv.name}+transformers-{version}", make)


def ray_overlay(version: str, python: Path) -> Path:
    """A folder for PYTHONPATH (and its bin/ for PATH) holding Ray `version` itself, installed with
    `--target` for that venv's python: the Ray a graft carries, ahead of whatever the venv has."""
    venv = python.parent.parent

    def make(overlay: Path) -> dict:
        _run(
            [
                str(python),
                "-m",
                "pip",
                "install",
                "--quiet",
                "--no-deps",
                "--target",
                str(overlay),
                f"ray=={version}",
            ],
            f"installing ray=={version} into {overlay}",
            900,
        )
        return {"ray": version}

    return _made_once(release_root() / f"{venv.name}+ray-{version}", make)


def pinned(version: str, package: str) -> str:
    """The version of `package` that the release's committed constraints pin (its environment)."""
    for line in constraints(version).read_text().splitlines():
        name, _, pin = line.partition("==")
        if name.strip().lower() == package.lower() and pin:
            return pin.strip()
    raise ReleaseError(f"{constraints(version).name} pins no {package}")


def _site_packages(python: Path) -> Path:
    found = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    )
    return Path(found.stdout.strip())


def _hybrid_key(python: Path, donor: Path) -> str:
    digest = hashlib.sha256()
    for path in (PATCHES / "vllm_compat.py", PATCHES / "patch_vllm_qwen35.py"):
        digest.update(path.read_bytes())
    digest.update(str(python.resolve()).encode() + str(donor.resolve()).encode())
    return digest.hexdigest()[:12]


def hybrid_overlay(python: Path, donor: Path) -> Path:
    """A folder for PYTHONPATH whose `vllm` is the venv's, with the donor's Qwen3.5 files and
    `mamba_utils.py` added and the registries patched: the seed's hybrid, as patches/Dockerfile makes it."""
    venv = python.parent.parent

    def make(overlay: Path) -> dict:
        base = _site_packages(python) / "vllm"
        staging = overlay / ".staging"
        proof = _run(
            [
                host_python(),
                str(PATCHES / "vllm_compat.py"),
                "--base",
                str(base),
                "--donor",
                str(donor),
                "--extra",
                "model_executor/layers/mamba/mamba_utils.py",
                "--stage",
                str(staging),
            ],
            "the compatibility proof (vllm_compat.py)",
            300,
        )
        # Hard links: seconds and no extra disk; every change below replaces a link, never writes into it.
        _run(["cp", "-al", str(base), str(overlay / "vllm")], f"linking {base} into {overlay}", 300)
        for source in sorted(p for p in staging.rglob("*") if p.is_file()):
            target = overlay / "vllm" / source.relative_to(staging)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.unlink(missing_ok=True)
            shutil.copyfile(source, target)
        shutil.rmtree(staging)
        _run(
            [host_python(), str(PATCHES / "patch_vllm_qwen35.py"), "--vllm-dir", str(overlay / "vllm")],
            "the registry patcher (patch_vllm_qwen35.py)",
            300,
        )
        return {"compat_proof": proof.stdout[-2000:]}

    return _made_once(release_root() / f"{venv.name}+hybrid-{_hybrid_key(python, donor)}", make)


@dataclass(frozen=True)
class Proof:
    """One run of prove_model.py: its exit status, its JSON report, its stderr, how long it took."""

    returncode: int
    report: dict
    stderr: str
    seconds: float

    def why(self) -> str:
        """For assertion messages: the verdict line and the program's own progress."""
        return f"exit {self.returncode}: {json.dumps(self.report)[:1500]}\n--- stderr tail ---\n" + "\n".join(
            self.stderr.strip().splitlines()[-25:]
        )


def run_proof(
    python: Path,
    *args: str,
    overlays: tuple[Path, ...] = (),
    home: Path | None = None,
    tmp: Path | None = None,
) -> Proof:
    """Run patches/prove_model.py with that venv's python (as the build and the head run it), offline,
    with the overlays first on PYTHONPATH; parse the last stdout line as its JSON report. `home` and
    `tmp` replace HOME and TMPDIR (to see what the run leaves behind)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    if home is not None:
        env["HOME"] = str(home)
    if tmp is not None:
        env["TMPDIR"] = str(tmp)
    if overlays:
        env["PYTHONPATH"] = os.pathsep.join(str(p) for p in overlays)
    started = time.monotonic()
    try:
        done = subprocess.run(
            [str(python), str(PROVE_MODEL), *args],
            capture_output=True,
            text=True,
            timeout=PROOF_TIMEOUT_S,
            env=env,
            cwd="/",
        )
    except subprocess.TimeoutExpired as exc:
        raise ReleaseError(f"prove_model.py {' '.join(args)} ran over {PROOF_TIMEOUT_S} s") from exc
    lines = done.stdout.strip().splitlines()
    try:
        report = json.loads(lines[-1])
    except (IndexError, ValueError) as exc:
        raise ReleaseError(
            f"prove_model.py printed no JSON report (exit {done.returncode}):\n{done.stdout[-2000:]}\n"
            f"{done.stderr[-3000:]}"
        ) from exc
    return Proof(done.returncode, report, done.stderr, time.monotonic() - started)


def main() -> int:
    from tests.support.vllm_trees import DONOR_VERSION, vllm_tree

    for version in ("0.17.1", "0.14.0"):
        python = release_venv(version)
        print(f"vllm-{version}\t{python}\t{_marker(python.parent.parent)}")
    base = release_venv("0.14.0")
    print(f"hybrid\t{hybrid_overlay(base, vllm_tree(DONOR_VERSION))}")
    print(f"transformers\t{transformers_overlay('5.2.0', base)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
