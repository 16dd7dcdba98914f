"""Counting the SSH sessions that reach lab nodes: each node's ~/.bashrc (read by the login shell sshd
starts for every session, as on a real node) appends a line to a file; optionally it costs time too,
as `conda init` or `pyenv init` do. Used by the lab tests (sessions per operation) and `make bench`
(the slow-login-shell case)."""

from __future__ import annotations

import contextlib
import shlex
from collections.abc import Callable, Iterator

from lab.layout import LabNode, node_paths

COUNTER = ".lab-sessions"


@contextlib.contextmanager
def counted_logins(*nodes: LabNode, costs_s: float = 0.0) -> Iterator[Callable[[], dict[str, int]]]:
    """While inside, each node's login shell counts itself (and sleeps `costs_s`); yields a function
    returning the count per node name so far. The nodes' ~/.bashrc is removed afterwards."""
    homes = {node.name: node_paths(node.name).home for node in nodes}
    rc = f'echo x >> "$HOME/{COUNTER}"\n' + (f"sleep {shlex.quote(f'{costs_s:g}')}\n" if costs_s else "")
    for home in homes.values():
        (home / ".bashrc").write_text(rc)
        (home / COUNTER).write_text("")
    try:
        yield lambda: {name: len((home / COUNTER).read_text().splitlines()) for name, home in homes.items()}
    finally:
        for home in homes.values():
            for name in (".bashrc", COUNTER):
                (home / name).unlink(missing_ok=True)
