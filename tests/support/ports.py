"""A TCP port nothing listens on, for a test's own server or for a dial that must be refused."""

from __future__ import annotations

import socket

LOOPBACK = "127.0.0.1"


def free_port(host: str = LOOPBACK) -> int:
    """A port nothing listens on at `host` now: bound once to pick it, released, then dialled to check
    (the lab's nodes share this machine's network, so a port may be taken by another test)."""
    with socket.socket() as probe:
        probe.bind((host, 0))
        port = probe.getsockname()[1]
    with socket.socket() as check:
        assert check.connect_ex((host, port)) != 0, f"{host}:{port} is taken"
    return port
