"""`python -m status` reads the nodes and the stack outputs; it declares no resource, so it imports no
Pulumi at all (the SDK alone costs seconds and a gRPC runtime). Checked in a fresh interpreter: this
test process has imported pulumi long before."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PULUMI_MODULES = "sorted(m for m in sys.modules if m == 'pulumi' or m.startswith('pulumi.'))"


def modules_after(statement: str) -> str:
    """What a fresh interpreter in the repository root prints after `statement`: the pulumi modules
    it then holds."""
    done = subprocess.run(
        [sys.executable, "-c", f"import sys; {statement}; print({PULUMI_MODULES})"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip()


def test_status_imports_nothing_of_pulumi():
    assert modules_after("import status.__main__") == "[]"


def test_the_check_sees_pulumi_imported():
    # So an empty list above means none was imported, not that the check cannot see one.
    assert "'pulumi.dynamic'" in modules_after("import components.readiness_gate.provider")
