"""`make test`'s slow tiers: the lab and engine tiers one after the other, and the release tier beside
them at the lowest CPU priority (`nice 19`, and I/O class idle where `ionice` exists).

Why side by side: the lab and engine tiers spend most of their time waiting on daemons, SSH, servers
and deadlines, so on a 2-core machine a core is usually idle; the release tier (real vLLM releases in
their venvs, CPU-bound) takes what they leave and gives it back at once when they need it. Sequential,
the three took 71 minutes on a warm CI machine.

The release tier's output is kept in `.release-test.log` and printed after the others'; the exit
status is non-zero when any tier failed (or was interrupted), and an interrupt stops the release tier
with its process group. Run as `python -m tests.tiers [MAKE]`.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

LOG = Path(".release-test.log")


def lowest_priority() -> None:
    """In the release tier's child before it runs: the lowest CPU priority, and its own group."""
    os.nice(19)


def release_argv(make: str) -> list[str]:
    argv = [make, "--no-print-directory", "releasetest"]
    ionice = shutil.which("ionice")
    return [ionice, "-c", "3", *argv] if ionice and sys.platform.startswith("linux") else argv


def stop(process: subprocess.Popen) -> None:
    """The release tier and everything it started (its own session: one process group)."""
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
        release = subprocess.Popen(
            release_argv(make),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=lowest_priority,
        )
    try:
        others = subprocess.call([make, "--no-print-directory", "labtest", "enginetest"])
        done = time.monotonic() - started
        print(f"tiers: lab and engine done in {done:.0f}s (exit {others}); the release tier's output follows")
        released = release.wait()
    except KeyboardInterrupt:
        stop(release)
        print("tiers: interrupted; the release tier was stopped", file=sys.stderr)
        return 130
    finally:
        stop(release)
    sys.stdout.flush()
    sys.stdout.write(LOG.read_text(errors="replace"))
    print(f"tiers: release tier exit {released}; all three in {time.monotonic() - started:.0f}s", flush=True)
    return others or released


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
