"""Code shipped to nodes and run THERE (a runtime of its own, apart from the Pulumi program and the
provider process), and the one way it gets there.

Every program here is one file, standard library only, that prints one JSON report on stdout
(progress and human lines go to stderr; `tcp_dial`, ssh's dialer, prints none: its stdout is ssh's
socket). Nothing is copied to the node: a program travels with the command that runs it, in one of
two ways, packed the same way (`program_source`: the program, the libraries it imports installed
before it, after an optional prelude of assignments):
- in argv (`program_argv`: `python3 -I -S -c <packed>`), where `-I -S` keeps whatever is installed on
  the node (PYTHON* variables, user or site packages) from changing it;
- on stdin (`program_stdin`, read by `python3 -` or an image's python3), the one way that takes
  environment values for the prelude: what must never appear in a command line (an API key) goes
  there.
The orchestrator imports the same files as modules to read their declared exit codes (`Exit`), so
each is declared once; what both sides must agree on (markers, folders, environment names, ssh's
255, the transfer's conversation, Docker's facts) is the library `wire`.

A program may import a library from this folder (`from components.node_programs import engine_api`,
at the start of a line): the packing ships the library's source with the program and installs it
under that same name before the program runs, so the import reads the same on a node as here.

The files, by kind (`tests/unit/test_node_programs_index.py` holds every file in one list, and the
libraries to those some program imports):

Programs, each run on a node (or in a container there) and printing its report:
    answer_check      the served answers recorded and judged (AnswerCheck), on the head
    docker_facts      what a node's Docker holds (NodeImage)
    fabric_facts      what a node's RoCE fabric looks like (FabricCheck)
    fabric_probe      reachability and link speed between two nodes over the fabric (FabricCheck)
    health_agent      the watchdog's hands on a worker
    hf_checkpoint     a Hugging Face cache repo on a node: inventory, send, receive (Checkpoint)
    hub_fetch         one revision of a Hub repo fetched into the cache, on the head (Checkpoint)
    image_tag         NodeImage's side on the destination: load, verify, promote
    layer_filter      the layer filter of a NodeImage copy, on the source
    model_facts       what the memory-fit preflight reads of a snapshot (ModelSupportCheck)
    node_proof        the GPU step and one group over the fabric, in the image (NodeProof)
    node_software     what a node's host runs (NodeProof's drift)
    node_status       what one node holds and runs (`status`)
    proof_bootstrap   unpacks and runs the model-support proof in its container (ModelSupportCheck)
    readiness         is the cluster really serving (ReadinessGate), on the head
    serve_bench       how fast the server answers (ServeBench), on the head
    stack_claim       a stack's claim on a node's names and ports (StackClaim)
    tcp_dial          ssh's dialer (no report: its stdout is ssh's socket)
    transfer_sink     the destination's end of a transfer
    transfer_source   the source's end of a transfer
    watchdog          the health watchdog, on the head
Libraries, imported by programs and never run on their own:
    cold_start        how long one start of vLLM took, from its log (watchdog)
    engine_api        the Docker Engine API over the daemon's socket
    gpu_memory        vLLM's start-up memory rule (watchdog)
    health_wire       what the watchdog, its agents and the Pulumi program agree on
    layer_export      the store export of a NodeImage copy (layer_filter)
    watchdog_checks   what each tick of the watchdog checks
    watchdog_memory   the memory check before a restart
    watchdog_policy   the watchdog's decisions, pure
    watchdog_recovery the watchdog's acts: a recovery in its steps
    watchdog_report   what the watchdog shows: /state and /metrics
    watchdog_settings the watchdog's settings and their bounds
    watchdog_state    what the watchdog knows between ticks
    watchdog_world    what the watchdog reads and does to the world
    watched_pipeline  the watched pipeline of one transfer (transfer_source)
    wire              what the orchestrator and every program agree on
"""

from __future__ import annotations

import base64
import functools
import re
import zlib
from collections.abc import Mapping, Sequence
from pathlib import Path

FOLDER = Path(__file__).resolve().parent
_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


@functools.cache
def program_text(name: str) -> str:
    """The source of program `name` (a file in this folder)."""
    if not _NAME.match(name) or not (FOLDER / f"{name}.py").is_file():
        raise ValueError(f"no node program {name!r} in {FOLDER}")
    return (FOLDER / f"{name}.py").read_text()


# The two ways a program imports libraries: `from components.node_programs import NAME[, NAME…]` and
# `from components.node_programs.NAME import …`, each on one line, at the start of it.
_LIBRARY_IMPORT = re.compile(
    r"^from components\.node_programs"
    r"(?: import ([a-z][a-z0-9_]*(?:, [a-z][a-z0-9_]*)*)\s*(?:#.*)?|\.([a-z][a-z0-9_]*) import .*)$",
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
            f"node program {name}: import a library as `from components.node_programs import NAME[, NAME]` "
            "or `from components.node_programs.NAME import …`, at the start of a line: other forms "
            "are not shipped to the node"
        )
    found: list[str] = []
    for library in (one for first, second in imports for one in (first or second).split(", ")):
        for needed in (*libraries(library), library):
            if needed not in found:
                found.append(needed)
    return tuple(found)


@functools.cache
def _bundle(name: str) -> str:
    """Program `name` as a python runs it: its own text, or with libraries, the text that installs
    them and then runs it (under its own file name, so tracebacks name it)."""
    if not libraries(name):
        return program_text(name)
    bundled = [(library, program_text(library)) for library in libraries(name)]
    program = program_text(name)
    return f"LIBRARIES = {bundled!r}\nPROGRAM = {program!r}\nPROGRAM_NAME = {name!r}\n{_INSTALL}"


_ASSIGNED = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_LITERALS = (str, int, float, bool, type(None))  # their repr is a literal that reads back the same
_FUTURE = re.compile(r"^from __future__ import", re.M)


def _prelude(name: str, assign: Mapping[str, object], environ: Mapping[str, str]) -> str:
    checked = [(key, value, _LITERALS) for key, value in assign.items()]
    for key, value, kinds in (*checked, *((key, value, str) for key, value in environ.items())):
        if not _ASSIGNED.match(key) or not isinstance(value, kinds):
            raise ValueError(f"node program {name}: cannot set {key!r} to a {type(value).__name__} before it")
    if (assign or environ) and not libraries(name) and _FUTURE.search(program_text(name)):
        # A `from __future__` import must come first in its file; a library bundle compiles the
        # program apart, a bare program follows the prelude.
        raise ValueError(
            f"node program {name}: a prelude goes before it, so it cannot import from __future__"
        )
    lines = ["import os"] if environ else []
    lines += [f"os.environ[{key!r}] = {value!r}" for key, value in environ.items()]
    lines += [f"{key} = {value!r}" for key, value in assign.items()]
    return "".join(f"{line}\n" for line in lines)


def program_source(
    name: str, assign: Mapping[str, object] | None = None, environ: Mapping[str, str] | None = None
) -> str:
    """What a node's python runs for program `name`: the prelude (each of `environ` set in
    `os.environ`, then `NAME = value` for each of `assign`: literals), then the program, with the
    libraries it imports installed first."""
    return _prelude(name, assign or {}, environ or {}) + _bundle(name)


@functools.cache
def _packed(name: str) -> str:
    return _pack(_bundle(name))


def _pack(text: str) -> str:
    packed = base64.b64encode(zlib.compress(text.encode(), 9)).decode()
    return f"import base64,zlib;exec(zlib.decompress(base64.b64decode('{packed}')))"


def program_argv(
    name: str,
    args: Sequence[str],
    python: str = "python3",
    isolated: bool = True,
    assign: Mapping[str, object] | None = None,
) -> list[str]:
    """`python3 -I -S -c <packed program> ARGS…`: run program `name` on a node (argv[1:] = args),
    after `assign` (its prelude; no environment: a command line is no place for a secret).
    `isolated=False` drops `-I -S`, for the one program that needs the node's site packages (the
    Hub client's `hub_fetch`); its libraries are shipped all the same."""
    code = _pack(program_source(name, assign)) if assign else _packed(name)
    return [python, *(("-I", "-S") if isolated else ()), "-c", code, *args]


def program_stdin(
    name: str, assign: Mapping[str, object] | None = None, environ: Mapping[str, str] | None = None
) -> bytes:
    """Program `name` for a python that reads it on stdin (`stdin_argv`, or an image's python3 with
    `-`): `program_source`, where `environ` may carry a secret, since stdin is in no command line."""
    return program_source(name, assign, environ).encode()


def stdin_argv(args: Sequence[str], python: str = "python3") -> list[str]:
    """`python3 - ARGS…`: the command that runs the program arriving on its stdin (`program_stdin`)."""
    return [python, "-", *args]
