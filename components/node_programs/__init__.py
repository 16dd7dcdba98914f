"""Code shipped to nodes and run THERE (a runtime of its own, apart from the Pulumi program and the
provider process).

Every program here is one standalone file, standard library only, that prints one JSON report on
stdout (progress and human lines go to stderr). It travels inside the command itself
(`program_argv`): nothing is copied to the node, and `python3 -I -S` keeps whatever is installed
there (PYTHON* variables, user or site packages) from changing it. The orchestrator imports the same
files as modules to read their declared exit codes and markers, so each is declared once.
"""

from __future__ import annotations

import base64
import functools
import re
import zlib
from collections.abc import Sequence
from pathlib import Path

FOLDER = Path(__file__).resolve().parent
_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


@functools.cache
def program_text(name: str) -> str:
    """The source of program `name` (a file in this folder)."""
    if not _NAME.match(name) or not (FOLDER / f"{name}.py").is_file():
        raise ValueError(f"no node program {name!r} in {FOLDER}")
    return (FOLDER / f"{name}.py").read_text()


@functools.cache
def _loader(name: str) -> str:
    packed = base64.b64encode(zlib.compress(program_text(name).encode(), 9)).decode()
    return f"import base64,zlib;exec(zlib.decompress(base64.b64decode('{packed}')))"


def program_argv(name: str, args: Sequence[str], python: str = "python3") -> list[str]:
    """`python3 -I -S -c <packed program> ARGS…`: run program `name` on a node (argv[1:] = args)."""
    return [python, "-I", "-S", "-c", _loader(name), *args]
