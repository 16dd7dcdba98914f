"""The fan-out tree for copying one image to N nodes: every node that has it serves the next.

Round 1 the head sends to one worker; round 2 both send to one more each; so N workers take
ceil(log2(N+1)) rounds instead of N. A node that cannot re-export what it holds (a containerd-store
node that received a thin copy may lack layer blobs) receives but never serves.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence

Rounds = list[list[tuple[str, str]]]


def fan_out_tree(
    head: str,
    workers: Sequence[str],
    can_reexport: Callable[[str], bool] | Collection[str] | None = None,
) -> Rounds:
    """Rounds of (source, destination) copies; the head always serves (it built the image).

    `can_reexport`: a predicate or a collection of the workers that may serve as sources;
    None means every worker may.
    """
    if can_reexport is None:
        serves: Callable[[str], bool] = lambda node: True  # noqa: E731
    elif callable(can_reexport):
        serves = can_reexport
    else:
        allowed = set(can_reexport)
        serves = allowed.__contains__
    if len(set(workers)) != len(workers) or head in workers:
        raise ValueError(
            f"fan_out_tree: workers must be distinct and exclude the head {head!r}: {list(workers)}"
        )
    # Nodes that can serve receive first, so the tree widens as early as possible.
    waiting = [w for w in workers if serves(w)] + [w for w in workers if not serves(w)]
    sources = [head]
    rounds: Rounds = []
    while waiting:
        this_round = []
        for source in list(sources):
            if not waiting:
                break
            destination = waiting.pop(0)
            this_round.append((source, destination))
            if serves(destination):
                sources.append(destination)
        rounds.append(this_round)
    return rounds
