"""Code shipped to nodes and run THERE (a runtime of its own, apart from the Pulumi program and the
provider process).

Every program here is one file, standard library only, that prints one JSON report on stdout
(progress and human lines go to stderr; `tcp_dial`, ssh's dialer, prints none: its stdout is ssh's
socket). It travels inside the command itself (`program_argv`): nothing is copied to the node, and
`python3 -I -S` keeps whatever is installed there (PYTHON* variables, user or site packages) from
changing it. The orchestrator imports the same files as
modules to read their declared exit codes, so each is declared once; what both sides must agree on
(markers, ssh's 255, the transfer's conversation, Docker's facts) is the library `wire`.

A program may import a library from this folder (`from components.node_programs import engine_api`,
at the start of a line): `program_argv` ships the library's source with the program and installs it
under that same name before the program runs, so the import reads the same on a node as here.
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


# The two ways a program imports a library: `from components.node_programs import NAME` and
# `from components.node_programs.NAME import …`, each at the start of a line.
_LIBRARY_IMPORT = re.compile(
    r"^from components\.node_programs"
    r"(?: import ([a-z][a-z0-9_]*)\s*(?:#.*)?|\.([a-z][a-z0-9_]*) import .*)$",
    re.M,
)
_ANY_IMPORT = re.compile(r"^\s*(?:from|import)\s+components\.node_programs\b", re.M)
# Run on the node before the program: its libraries as modules under their names here (a package
# that exists only in sys.modules: `-I -S` leaves nothing on sys.path that could shadow it).
_INSTALL = """import sys, types
for _name in ("components", "components.node_programs"):
    sys.modules[_name] = types.ModuleType(_name)
    sys.modules[_name].__path__ = []
sys.modules["components"].node_programs = sys.modules["components.node_programs"]
for _name, _text in LIBRARIES:
    _module = types.ModuleType("components.node_programs." + _name)
    sys.modules[_module.__name__] = _module
    exec(compile(_text, _name + ".py", "exec"), _module.__dict__)
    setattr(sys.modules["components.node_programs"], _name, _module)
del sys, types, _name, _text, _module, LIBRARIES
exec(compile(globals().pop("PROGRAM"), globals().pop("PROGRAM_NAME") + ".py", "exec"))
"""


@functools.cache
def libraries(name: str) -> tuple[str, ...]:
    """The libraries program `name` imports from this folder, each after the ones it imports; a
    ValueError for an import from this folder in any other form (it would work here, not on a node)."""
    text = program_text(name)
    imports = _LIBRARY_IMPORT.findall(text)
    if len(_ANY_IMPORT.findall(text)) != len(imports):
        raise ValueError(
            f"node program {name}: import a library as `from components.node_programs import NAME` "
            "or `from components.node_programs.NAME import …`, at the start of a line: other forms "
            "are not shipped to the node"
        )
    found: list[str] = []
    for library in (first or second for first, second in imports):
        for needed in (*libraries(library), library):
            if needed not in found:
                found.append(needed)
    return tuple(found)


@functools.cache
def _loader(name: str) -> str:
    if libraries(name):
        bundled = [(library, program_text(library)) for library in libraries(name)]
        program = program_text(name)
        text = f"LIBRARIES = {bundled!r}\nPROGRAM = {program!r}\nPROGRAM_NAME = {name!r}\n{_INSTALL}"
    else:
        text = program_text(name)
    packed = base64.b64encode(zlib.compress(text.encode(), 9)).decode()
    return f"import base64,zlib;exec(zlib.decompress(base64.b64decode('{packed}')))"


def program_argv(name: str, args: Sequence[str], python: str = "python3", isolated: bool = True) -> list[str]:
    """`python3 -I -S -c <packed program> ARGS…`: run program `name` on a node (argv[1:] = args).
    `isolated=False` drops `-I -S`, for the one program that needs the node's site packages (the
    Hub client's `hub_fetch`); its libraries are shipped all the same."""
    return [python, *(("-I", "-S") if isolated else ()), "-c", _loader(name), *args]
