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
BACKGROUND = ("unit", "releasetest")  # CPU-bound, niced; make stops at the first that fails
FOREGROUND = ("labtest", "enginetest")  # the lab's nodes: one tier at a time
FINISH_S = 300  # how long a stopped run waits for the lab and engine tiers' teardowns


def lowest_priority() -> None:
    """In the background tiers' child before it runs: the lowest CPU priority."""
    os.nice(19)


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


def main(argv: list[str]) -> int:
    make = argv[0] if argv else os.environ.get("MAKE", "make")
    started = time.monotonic()
    previous = {sig: signal.signal(sig, _stopped) for sig in (signal.SIGTERM, signal.SIGHUP)}
    background = foreground = None
    try:
        with LOG.open("wb") as out:
            background = subprocess.Popen(
                background_argv(make),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                preexec_fn=lowest_priority,
            )
        foreground = subprocess.Popen([make, "--no-print-directory", *FOREGROUND])
        others = foreground.wait()
        done = time.monotonic() - started
        print(f"tiers: lab and engine done in {done:.0f}s (exit {others}); the unit and release tiers' "
              "output follows")  # fmt: skip
        released = background.wait()
    except (KeyboardInterrupt, Stopped) as exc:
        signum = exc.signum if isinstance(exc, Stopped) else signal.SIGINT
        if foreground is not None:
            finish(foreground, signum)
        print(f"tiers: stopped by signal {signum}; the unit and release tiers are stopped", file=sys.stderr)
        return 128 + signum
    finally:  # on every way out: the background tiers end with this run
        if background is not None:
            stop(background)
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
