"""Reachability and link speed between two nodes over the fabric, for FabricCheck (runs ON A NODE;
standard library only).

    fabric_probe listen SPEC    on the head: bind SPEC.host:SPEC.port, take one connection, count
                                what it sends until EOF; report bytes and seconds
    fabric_probe send SPEC      on a worker: connect to SPEC.host:SPEC.port (retried until the
                                deadline: the listener may start later), send for at most
                                SPEC.max_bytes or SPEC.max_s, half-close; report bytes sent

SPEC (JSON): host, port, deadline_s (the whole program's bound), max_bytes, max_s. Every wait ends
by the deadline. Prints one JSON report on stdout; its exit status says what went wrong.
"""

from __future__ import annotations

import errno
import json
import socket
import sys
import time
from enum import IntEnum

CHUNK = 1 << 20
RETRY_S = 0.1


class Exit(IntEnum):
    OK = 0
    USAGE = 2  # no verb or SPEC, or SPEC is not the JSON object described above
    PORT_BUSY = 3  # listen: the port is taken on that address (something else listens there)
    NOT_LOCAL = 4  # listen: the address is not one of this node's
    NO_PEER = 5  # listen: nothing connected (or finished sending) before the deadline
    UNREACHABLE = 6  # send: no connection before the deadline


def report(value: dict, code: Exit) -> int:
    print(json.dumps({**value, "exit": int(code)}, sort_keys=True), flush=True)
    return code


def bound_listener(host: str, port: int) -> tuple[socket.socket | None, Exit]:
    """A listening socket on host:port; the bind itself is the check that the port is free."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    # Linux still refuses a bind over a live listener with SO_REUSEADDR; it only lets a port left
    # in TIME_WAIT by an earlier probe be taken again.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        return None, Exit.PORT_BUSY if exc.errno == errno.EADDRINUSE else Exit.NOT_LOCAL
    sock.listen(1)
    return sock, Exit.OK


def listen(spec: dict) -> int:
    deadline = time.monotonic() + float(spec["deadline_s"])
    where = {"host": spec["host"], "port": int(spec["port"])}
    sock, code = bound_listener(spec["host"], int(spec["port"]))
    if sock is None:
        return report(where, code)
    print(json.dumps({"listening": where}), file=sys.stderr, flush=True)
    received, first, last = 0, None, None
    try:
        sock.settimeout(max(deadline - time.monotonic(), 0.01))
        conn, peer = sock.accept()
        where["peer"] = peer[0]
        with conn:
            while True:
                conn.settimeout(max(deadline - time.monotonic(), 0.01))
                data = conn.recv(CHUNK)
                now = time.monotonic()
                if not data:
                    break
                first = now if first is None else first
                received, last = received + len(data), now
    except (socket.timeout, OSError) as exc:  # noqa: UP041 (a node's Python may predate 3.10)
        return report({**where, "bytes": received, "error": str(exc) or "timed out"}, Exit.NO_PEER)
    finally:
        sock.close()
    seconds = (last - first) if first is not None and last is not None else 0.0
    return report({**where, "bytes": received, "seconds": seconds}, Exit.OK)


def connect(host: str, port: int, deadline: float) -> socket.socket | None:
    """A connection to host:port, retried until the deadline (the listener may not be up yet)."""
    while time.monotonic() < deadline:
        try:
            return socket.create_connection((host, port), timeout=max(deadline - time.monotonic(), 0.01))
        except OSError:
            time.sleep(RETRY_S)
    return None


def send(spec: dict) -> int:
    deadline = time.monotonic() + float(spec["deadline_s"])
    where = {"host": spec["host"], "port": int(spec["port"])}
    conn = connect(spec["host"], int(spec["port"]), deadline)
    if conn is None:
        return report(where, Exit.UNREACHABLE)
    buffer = b"\0" * CHUNK
    sent, start = 0, time.monotonic()
    stop = min(start + float(spec["max_s"]), deadline)
    with conn:
        try:
            while sent < int(spec["max_bytes"]) and time.monotonic() < stop:
                conn.settimeout(max(deadline - time.monotonic(), 0.01))
                sent += conn.send(buffer[: min(CHUNK, int(spec["max_bytes"]) - sent)])
            conn.shutdown(socket.SHUT_WR)
        except OSError as exc:
            return report({**where, "bytes": sent, "error": str(exc)}, Exit.UNREACHABLE)
    return report({**where, "bytes": sent, "seconds": time.monotonic() - start}, Exit.OK)


def main(argv: list[str]) -> int:
    try:
        verb, spec = argv[0], json.loads(argv[1])
        if verb not in ("listen", "send") or not isinstance(spec, dict):
            raise ValueError(verb)
    except (IndexError, ValueError):
        sys.stderr.write("usage: fabric_probe listen|send SPEC\n")
        return Exit.USAGE
    return listen(spec) if verb == "listen" else send(spec)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
