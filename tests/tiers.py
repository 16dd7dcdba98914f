"""`make test`'s tiers after lint: the lab and engine tiers one after the other, and beside them the
unit and release tiers at the lowest CPU priority (`nice 19`, and I/O class idle where `ionice`
exists).

Why side by side: the lab and engine tiers spend most of their time waiting on daemons, SSH, servers
and deadlines, so on a 2-core machine a core is usually idle; the unit and release tiers (CPU-bound:
the release tier runs real vLLM releases in their venvs) take what they leave and give it back at
once when they need it. One after the other, the tiers took 71 minutes on a warm CI machine.

The background tiers' output is kept in `.background-tests.log` and printed after the others'; the exit
status is non-zero when any tier failed (or was interrupted), and an interrupt stops the background
tiers with their process group. Run as `python -m tests.tiers [MAKE]`.
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


def lowest_priority() -> None:
    """In the background tiers' child before it runs: the lowest CPU priority."""
    os.nice(19)


def background_argv(make: str) -> list[str]:
    argv = [make, "--no-print-directory", *BACKGROUND]
    ionice = shutil.which("ionice")
    return [ionice, "-c", "3", *argv] if ionice and sys.platform.startswith("linux") else argv


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


def main(argv: list[str]) -> int:
    make = argv[0] if argv else os.environ.get("MAKE", "make")
    started = time.monotonic()
    with LOG.open("wb") as out:
        background = subprocess.Popen(
            background_argv(make),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=lowest_priority,
        )
    try:
        others = subprocess.call([make, "--no-print-directory", *FOREGROUND])
        done = time.monotonic() - started
        print(f"tiers: lab and engine done in {done:.0f}s (exit {others}); the unit and release tiers' "
              "output follows")  # fmt: skip
        released = background.wait()
    except KeyboardInterrupt:
        stop(background)
        print("tiers: interrupted; the unit and release tiers were stopped", file=sys.stderr)
        return 130
    finally:
        stop(background)
    sys.stdout.flush()
    sys.stdout.write(LOG.read_text(errors="replace"))
    print(
        f"tiers: unit and release tiers exit {released}; all in {time.monotonic() - started:.0f}s", flush=True
    )
    return others or released


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
