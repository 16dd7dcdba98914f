"""tests/tiers.py: the unit and release tiers beside the others, their output after, every failure counted."""

from __future__ import annotations

import os
import stat
import sys

import pytest

from tests import tiers

FAKE_MAKE = """#!{python}
import os, sys, time
targets = [a for a in sys.argv[1:] if not a.startswith("-")]
if targets == ["unit", "releasetest"]:
    time.sleep(0.5)
    print("release ran at nice", os.nice(0))
    sys.exit(int(os.environ.get("RELEASE_RC", "0")))
print("ran", " ".join(targets), flush=True)
sys.exit(int(os.environ.get("OTHERS_RC", "0")))
"""


@pytest.fixture
def make(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "make"
    path.write_text(FAKE_MAKE.format(python=sys.executable))
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


@pytest.mark.parametrize(("others", "release", "expect"), [(0, 0, 0), (0, 3, 3), (2, 0, 2), (2, 3, 2)])
def test_any_tier_failing_fails_and_the_release_output_follows(
    make, monkeypatch, capfd, others, release, expect
):
    monkeypatch.setenv("OTHERS_RC", str(others))
    monkeypatch.setenv("RELEASE_RC", str(release))
    assert tiers.main([make]) == expect
    out = capfd.readouterr().out
    assert out.index("ran labtest enginetest") < out.index("release ran at nice"), out
    assert f"release ran at nice {min(19, os.nice(0) + 19)}" in out, out
    assert f"unit and release tiers exit {release}" in out, out
