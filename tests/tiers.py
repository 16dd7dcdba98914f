"""`make test`'s tiers after lint: the lab and engine tiers one after the other, and beside them the
unit and release tiers at the lowest CPU priority (`nice 19`, and I/O class idle where `ionice`
exists).

Why side by side: the lab and engine tiers spend most of their time waiting on daemons, SSH, servers
and deadlines, so on a 2-core machine a core is usually idle; the unit and release tiers (CPU-bound:
the release tier runs real vLLM releases in their venvs) take what they leave and give it back at
once when they need it. One after the other, the tiers took 71 minutes on a warm CI machine.

The background tiers' output is kept in `.background-tests.log` and printed after the others'; the exit
status is non-zero when any tier failed (or was stopped). Stopped (Ctrl-C, SIGTERM, SIGHUP), it
waits a bounded time for the lab and engine tiers' teardowns and stops the background tiers with
their process group. Run as `python -m tests.tiers [MAKE]`.

What only the engine tier needs is made while the lab tier runs: `make engine` (the Pulumi CLI and
plugins from their Go modules, about 13 CPU-minutes on a fresh machine) and `make lab-fetch` (the
lab's downloads: the real-vLLM image's wheels, Ray's, the Debian root filesystems) start beside it at
a middle priority (`nice 10`: below the lab tier, above the unit and release tiers), and the engine
tier starts once they are done. On a fresh machine that takes the engine's build off the critical
path; on a warm one both find their caches and end in seconds. Their output is kept in
`.prepare-tests.log` and printed with the others'.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

LOG = Path(".background-tests.log")
PREPARE_LOG = Path(".prepare-tests.log")
BACKGROUND = ("unit", "releasetest")  # CPU-bound, niced; make stops at the first that fails
PREPARE = ("engine", "lab-fetch")  # what only later tiers need, made beside the lab tier
FOREGROUND = ("labtest", "enginetest")  # the lab's nodes: one tier at a time
FINISH_S = 300  # how long a stopped run waits for the lab and engine tiers' teardowns
# How long the engine tier waits for the preparation once the lab tier is done: a cold Go build on a
# loaded 2-core machine has taken 13 min, and it started with the lab tier; past this the engine tier
# starts anyway and `make engine` (its prerequisite) finishes or names the failure.
PREPARE_WAIT_S = 3600
PREPARE_NICE = 10


# What a first `make test` on a machine makes, and where: (what, folder under the cache, marker glob).
FIRST_RUN = (
    ("two vLLM release venvs (the release tier)", "release", "vllm-*/.qwen35-complete"),
    ("the engine (Pulumi CLI and plugins from Go modules)", "engine", "*/.complete"),
    ("the real-vLLM lab image, saved (lab/vllm_cpu_image.py)", "lab/images", "lab-vllm-cpu-*.tar"),
)
# Measured on a fresh 2-core machine (docs/testing.md, "A first run"); README's Quickstart says the same.
FIRST_RUN_MINUTES = 70
FIRST_RUN_DISK_GB = 60
# A warm run on the same machine (CI's own record, 2026-12-07: 57.5 min; this main about 54).
WARM_RUN_MINUTES = 55


def cache_root() -> Path:
    return Path(os.environ.get("QWEN35_CACHE") or "~/.cache/qwen35-spark").expanduser()


def first_run_notice(root: Path | None = None) -> str:
    """What this run will make before it can test, said before it starts (nothing when all is cached)."""
    root = root or cache_root()
    missing = [what for what, folder, marker in FIRST_RUN if not any((root / folder).glob(marker))]
    if not missing:
        return "tiers: the venvs, the engine and the lab's images are cached: no first-run builds"
    return (
        f"tiers: first run on this machine: {'; '.join(missing)} not yet in {root}. Making them takes"
        f" `make test` to about {FIRST_RUN_MINUTES} minutes on 2 cores (later runs about"
        f" {WARM_RUN_MINUTES}) and about {FIRST_RUN_DISK_GB} GB of disk (docs/testing.md#a-first-run)"
    )


def lowest_priority() -> None:
    """In the background tiers' child before it runs: the lowest CPU priority."""
    os.nice(19)


def middle_priority() -> None:
    """In the preparation's child: below the lab tier, above the background tiers."""
    os.nice(PREPARE_NICE)


def background_argv(make: str) -> list[str]:
    argv = [make, "--no-print-directory", *BACKGROUND]
    ionice = shutil.which("ionice")
    # -t: a system that refuses the idle class runs the tiers all the same.
    return [ionice, "-c", "3", "-t", *argv] if ionice and sys.platform.startswith("linux") else argv


class Stopped(Exception):
    """`make test` was told to stop (SIGTERM, SIGHUP): a CI cancel, `timeout`, a closed terminal."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _stopped(signum: int, _frame: object) -> None:
    raise Stopped(signum)


def stop(process: subprocess.Popen) -> None:
    """The background tiers and everything they started (their own session: one process group)."""
    if process.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def finish(foreground: subprocess.Popen, signum: int) -> None:
    """Let the lab and engine tiers end, within a bound. Ctrl-C reached them from the terminal and
    their teardowns remove what they started; a SIGTERM or SIGHUP came to this process alone, so it
    is passed on (make passes SIGTERM to its children)."""
    if foreground.poll() is not None:
        return
    if signum != signal.SIGINT:
        foreground.send_signal(signal.SIGTERM)
    try:
        foreground.wait(timeout=FINISH_S)
    except subprocess.TimeoutExpired:
        foreground.kill()
        foreground.wait()


def _side(argv: list[str], log: Path, priority) -> subprocess.Popen:
    """A run beside the foreground, in its own session (one process group to stop), output to `log`."""
    with log.open("wb") as out:
        return subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=priority,
        )


def wait_prepared(prepare: subprocess.Popen, bound_s: float | None = None) -> int | None:
    """The preparation's exit status once it ends; None when it ran past `bound_s` (PREPARE_WAIT_S
    unless given), and it is then stopped."""
    try:
        return prepare.wait(timeout=PREPARE_WAIT_S if bound_s is None else bound_s)
    except subprocess.TimeoutExpired:
        stop(prepare)
        return None


class Foreground:
    """The lab tier, then (once it passed and the preparation ended) the engine tier, one process at a
    time; `current` is the one running, for a stop to pass its signal to."""

    def __init__(self, make: str):
        self.make = make
        self.current: subprocess.Popen | None = None

    def _tier(self, target: str) -> int:
        self.current = subprocess.Popen([self.make, "--no-print-directory", target])
        return self.current.wait()

    def run(self, prepare: subprocess.Popen, started: float) -> int:
        """The first failure's exit status, as `make labtest enginetest` would give."""
        lab_tier, engine_tier = FOREGROUND
        code = self._tier(lab_tier)
        if code != 0:
            return code
        waited = time.monotonic()
        prepared = wait_prepared(prepare)
        said = "ran past its bound and was stopped" if prepared is None else f"exit {prepared}"
        print(f"tiers: preparation ({' '.join(PREPARE)}) {said}; waited {time.monotonic() - waited:.0f}s"
              f" for it at {waited - started:.0f}s; its output is in {PREPARE_LOG}", flush=True)  # fmt: skip
        return self._tier(engine_tier)


def main(argv: list[str]) -> int:
    make = argv[0] if argv else os.environ.get("MAKE", "make")
    started = time.monotonic()
    previous = {sig: signal.signal(sig, _stopped) for sig in (signal.SIGTERM, signal.SIGHUP)}
    background = prepare = None
    foreground = Foreground(make)
    try:
        print(first_run_notice(), flush=True)
        background = _side(background_argv(make), LOG, lowest_priority)
        prepare = _side([make, "--no-print-directory", "-j2", *PREPARE], PREPARE_LOG, middle_priority)
        others = foreground.run(prepare, started)
        done = time.monotonic() - started
        print(f"tiers: lab and engine done in {done:.0f}s (exit {others}); the unit and release tiers' "
              "output follows")  # fmt: skip
        released = background.wait()
    except (KeyboardInterrupt, Stopped) as exc:
        signum = exc.signum if isinstance(exc, Stopped) else signal.SIGINT
        if foreground.current is not None:
            finish(foreground.current, signum)
        print(f"tiers: stopped by signal {signum}; the unit and release tiers are stopped", file=sys.stderr)
        return 128 + signum
    finally:  # on every way out: the background tiers and the preparation end with this run
        for process in (background, prepare):
            if process is not None:
                stop(process)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    sys.stdout.flush()
    sys.stdout.write(LOG.read_text(errors="replace"))
    print(
        f"tiers: unit and release tiers exit {released}; all in {time.monotonic() - started:.0f}s", flush=True
    )
    return others or released


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
