"""`make bench`: NodeImage against the plain `docker save | ssh | docker load`, measured in the same run."""

from collections.abc import Callable, Sequence


def median_run(runs: Sequence[tuple], ratio: Callable[[tuple], float]) -> tuple:
    """The run whose `ratio` is the median of `runs` (sub-second timings vary: a few runs, the middle one)."""
    return sorted(runs, key=ratio)[len(runs) // 2]


def spread(runs: Sequence[tuple], ratio: Callable[[tuple], float], digits: int, unit: str = "") -> str:
    """`median of 3: 4.9-5.2x`: how far the runs' ratios lay apart."""
    ratios = sorted(ratio(run) for run in runs)
    return f"median of {len(runs)}: {ratios[0]:.{digits}f}-{ratios[-1]:.{digits}f}{unit}"
