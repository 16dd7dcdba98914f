"""Session fixtures: the lab comes up once, tests get handles to its nodes, and at the end the last
test session still using it stops what test sessions started (a lab a developer started by hand
survives). A lab that cannot start fails the tests with the reason; it is never skipped."""

from __future__ import annotations

import os

import pytest

import lab
from tests.support.lab_nodes import session_nodes


def _wanted() -> list[str]:
    """LAB_NODES=node-a,node-b restricts the session to a subset (fast path); default all four."""
    text = os.environ.get("LAB_NODES", "")
    return [name.strip() for name in text.split(",") if name.strip()] or list(lab.NODE_NAMES)


@pytest.fixture(scope="session")
def lab_nodes() -> dict[str, lab.LabNode]:
    """name -> LabNode for every lab node this session uses, all running."""
    with session_nodes(_wanted()) as nodes:
        yield nodes


def _node(lab_nodes: dict[str, lab.LabNode], name: str) -> lab.LabNode:
    if name not in lab_nodes:
        pytest.fail(f"{name} is not in this session's lab (LAB_NODES={os.environ.get('LAB_NODES')})")
    return lab_nodes[name]


@pytest.fixture(scope="session")
def lab_node(lab_nodes: dict[str, lab.LabNode]):
    """A function name -> LabNode that fails clearly when the node is not in this session's lab."""
    return lambda name: _node(lab_nodes, name)


@pytest.fixture(scope="session")
def node_a(lab_nodes: dict[str, lab.LabNode]) -> lab.LabNode:
    return _node(lab_nodes, "node-a")


@pytest.fixture(scope="session")
def node_b(lab_nodes: dict[str, lab.LabNode]) -> lab.LabNode:
    return _node(lab_nodes, "node-b")


@pytest.fixture(scope="session")
def node_c(lab_nodes: dict[str, lab.LabNode]) -> lab.LabNode:
    return _node(lab_nodes, "node-c")


@pytest.fixture(scope="session")
def node_d(lab_nodes: dict[str, lab.LabNode]) -> lab.LabNode:
    return _node(lab_nodes, "node-d")
