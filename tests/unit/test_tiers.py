"""tests/tiers.py: the unit and release tiers beside the others, their output after, every failure counted."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import tiers
from tests.support.health_lab import wait_for

FAKE_MAKE = """#!{python}
import os, sys, time
targets = [a for a in sys.argv[1:] if not a.startswith("-")]
hang = float(os.environ.get("HANG_S", "0"))
if targets == ["unit", "releasetest"]:
    open("background.pid", "w").write(str(os.getpid()))
    time.sleep(hang or 0.5)
    print("release ran at nice", os.nice(0))
    sys.exit(int(os.environ.get("RELEASE_RC", "0")))
print("ran", " ".join(targets), flush=True)
time.sleep(hang)
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
    niceness = int(out.split("release ran at nice ", 1)[1].split()[0])
    assert niceness >= min(19, os.nice(0) + 19), out  # 19 is Linux's lowest priority, 20 macOS's
    assert f"unit and release tiers exit {release}" in out, out


def alive(pid: int) -> bool:
    """Portable, as the unit tier runs on laptops too (lab.nodes.pid_alive reads Linux's /proc)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_sigterm_stops_the_background_tiers_with_their_group(make, tmp_path, monkeypatch):
    monkeypatch.setenv("HANG_S", "120")
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root)}
    run = subprocess.Popen([sys.executable, "-m", "tests.tiers", make], cwd=tmp_path, env=env)
    pidfile = tmp_path / "background.pid"
    wait_for(lambda: pidfile.exists() and pidfile.read_text(), 30, "the background tiers never started")
    background = int(pidfile.read_text())
    time.sleep(0.5)
    run.send_signal(signal.SIGTERM)
    assert run.wait(timeout=60) == 128 + signal.SIGTERM
    wait_for(lambda: not alive(background), 10, "the background tiers outlived make test")
