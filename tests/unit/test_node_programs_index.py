"""The index in components/node_programs/__init__.py's docstring tells a program (run on a node) from
a library (imported by programs): every file of the folder is in exactly one of its two lists, and
the libraries are exactly the files some program imports (derived from the tree)."""

from __future__ import annotations

import re

import components.node_programs as node_programs
from components.node_programs import FOLDER, libraries

PROGRAMS_HEADING = "Programs, each run on a node"
LIBRARIES_HEADING = "Libraries, imported by programs"
ENTRY = re.compile(r"^    ([a-z][a-z0-9_]*)\b", re.M)


def listed(heading: str) -> list[str]:
    """The file names under `heading` in the docstring, up to the next unindented line."""
    doc = node_programs.__doc__ or ""
    start = doc.index(heading)
    section = doc[start:].split("\n", 1)[1]
    block = re.split(r"^\S", section, maxsplit=1, flags=re.M)[0]
    return ENTRY.findall(block)


def files() -> set[str]:
    return {p.stem for p in FOLDER.glob("*.py") if p.stem != "__init__"}


def test_every_file_is_in_exactly_one_list():
    programs, libs = listed(PROGRAMS_HEADING), listed(LIBRARIES_HEADING)
    assert len(programs) == len(set(programs)) and len(libs) == len(set(libs))
    assert not set(programs) & set(libs), set(programs) & set(libs)
    assert set(programs) | set(libs) == files(), (set(programs) | set(libs)) ^ files()


def test_the_libraries_are_what_programs_import():
    imported = {library for name in files() for library in libraries(name)}
    assert set(listed(LIBRARIES_HEADING)) == imported


def test_each_list_is_in_order():
    for heading in (PROGRAMS_HEADING, LIBRARIES_HEADING):
        assert listed(heading) == sorted(listed(heading))
