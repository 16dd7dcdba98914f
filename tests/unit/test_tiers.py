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
if targets == ["engine", "lab-fetch"]:
    time.sleep(float(os.environ.get("PREPARE_S", "0.2")))
    open("prepared", "w").write(str(os.nice(0)))
    sys.exit(int(os.environ.get("PREPARE_RC", "0")))
if targets == ["enginetest"]:
    print("engine tier saw the preparation", os.path.exists("prepared"), flush=True)
print("ran", " ".join(targets), flush=True)
time.sleep(hang)
sys.exit(int(os.environ.get(targets[0].upper() + "_RC", "0")))
"""


@pytest.fixture
def make(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "make"
    path.write_text(FAKE_MAKE.format(python=sys.executable))
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


@pytest.mark.parametrize(
    ("lab", "engine", "release", "expect"),
    [(0, 0, 0, 0), (0, 0, 3, 3), (2, 0, 0, 2), (0, 4, 0, 4), (2, 0, 3, 2)],
)
def test_any_tier_failing_fails_and_the_release_output_follows(
    make, monkeypatch, capfd, lab, engine, release, expect
):
    monkeypatch.setenv("LABTEST_RC", str(lab))
    monkeypatch.setenv("ENGINETEST_RC", str(engine))
    monkeypatch.setenv("RELEASE_RC", str(release))
    assert tiers.main([make]) == expect
    out = capfd.readouterr().out
    assert out.index("ran labtest") < out.index("release ran at nice"), out
    # A failed lab tier ends the foreground there, as `make labtest enginetest` did.
    assert ("ran enginetest" in out) is (lab == 0), out
    niceness = int(out.split("release ran at nice ", 1)[1].split()[0])
    assert niceness >= min(19, os.nice(0) + 19), out  # 19 is Linux's lowest priority, 20 macOS's
    assert f"unit and release tiers exit {release}" in out, out


def test_the_engine_tier_starts_once_the_preparation_beside_the_lab_tier_is_done(make, monkeypatch, capfd):
    # The preparation (engine build, lab downloads) outlasts the lab tier: the engine tier waits for it.
    monkeypatch.setenv("PREPARE_S", "2")
    assert tiers.main([make]) == 0
    out = capfd.readouterr().out
    assert "engine tier saw the preparation True" in out, out
    assert "tiers: preparation (engine lab-fetch) exit 0" in out, out
    # Below the lab tier's priority, above the background tiers'.
    assert int(Path("prepared").read_text()) >= min(tiers.PREPARE_NICE, os.nice(0) + tiers.PREPARE_NICE)


def test_a_preparation_past_its_bound_is_stopped_and_the_engine_tier_still_runs(make, monkeypatch, capfd):
    monkeypatch.setenv("PREPARE_S", "60")
    monkeypatch.setattr(tiers, "PREPARE_WAIT_S", 1)
    assert tiers.main([make]) == 0
    out = capfd.readouterr().out
    assert "preparation (engine lab-fetch) ran past its bound and was stopped" in out, out
    assert "engine tier saw the preparation False" in out, out


def test_a_first_run_is_told_what_it_will_make_and_a_warm_one_is_not(tmp_path):
    said = tiers.first_run_notice(tmp_path)
    assert "first run on this machine" in said and "two vLLM release venvs" in said, said
    assert f"about {tiers.FIRST_RUN_MINUTES} minutes" in said and f"{tiers.FIRST_RUN_DISK_GB} GB" in said
    assert f"later runs about {tiers.WARM_RUN_MINUTES}" in said
    for _what, folder, marker in tiers.FIRST_RUN:
        made = tmp_path / folder / marker.replace("*", "x")
        made.parent.mkdir(parents=True, exist_ok=True)
        made.write_text("")
    assert "no first-run builds" in tiers.first_run_notice(tmp_path)


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
