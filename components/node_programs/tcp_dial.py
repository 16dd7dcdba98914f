"""ssh's dialer: connect to a node with TCP_NODELAY set and hand the socket to ssh (standard library
only; runs where ssh runs: on the operator's machine, and on a source node for its connection to the
destination). Unlike the other programs it prints no report: its stdout is ssh's end of a socket
pair (`ProxyCommand` with `ProxyUseFdpass=yes`), which takes the connected socket and nothing else.

    tcp_dial HOST PORT TIMEOUT_S

Why: OpenSSH sets TCP_NODELAY only once a session is set up. Before that, during every key exchange
and login, Nagle's algorithm holds ssh's second small packet of a pair (its NEWKEYS is
followed at once by its service request) until the server acknowledges the first, and the server,
having nothing to send, delays that acknowledgement ~40 ms. Every connection waited ~40 ms with
nothing to do: `ssh node true` on loopback took 0.200 s, and 0.176 s through this dialer, its own
start included. ssh passes ConnectTimeout as TIMEOUT_S; a failure prints ssh's own message (`ssh:
connect to host H port P: REASON`) and exits 255, as ssh's own connect would.
"""

from __future__ import annotations

import array
import socket
import sys

from components.node_programs.wire import SSH_TRANSPORT_FAILURE as FAILED  # as ssh's own connect


def dial(host: str, port: int, timeout: float) -> socket.socket:
    """A connected socket to host:port (each of its addresses in turn), with TCP_NODELAY, blocking."""
    conn = socket.create_connection((host, port), timeout=timeout)
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)  # as ssh's own connect (TCPKeepAlive)
    conn.settimeout(None)  # ssh expects the blocking socket its own connect() would give it
    return conn


def hand_over(conn: socket.socket, to_fd: int = 1) -> None:
    """Pass `conn` to the process at the other end of unix socket `to_fd` (one byte carries it)."""
    out = socket.socket(fileno=to_fd)
    try:
        fds = array.array("i", [conn.fileno()])
        out.sendmsg([b"\0"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
    finally:
        out.detach()


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        sys.stderr.write("usage: tcp_dial HOST PORT TIMEOUT_S\n")
        return FAILED
    host, port = argv[0], int(argv[1])
    try:
        conn = dial(host, port, float(argv[2]))
    except socket.gaierror as exc:
        sys.stderr.write(f"ssh: Could not resolve hostname {host}: {exc.strerror}\n")
        return FAILED
    except socket.timeout:  # noqa: UP041 (not yet TimeoutError on a node's Python before 3.10)
        sys.stderr.write(f"ssh: connect to host {host} port {port}: Connection timed out\n")
        return FAILED
    except OSError as exc:
        sys.stderr.write(f"ssh: connect to host {host} port {port}: {exc.strerror or exc}\n")
        return FAILED
    hand_over(conn)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
