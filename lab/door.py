"""A jump node's second SSH door: accept TCP connections on an address of this machine's network and
serve each one with `sshd -i` run inside another network namespace (what systemd's ssh.socket with
`Accept=yes` does, plus the namespace). Sessions of this door see the fabric namespace; nothing else
on this machine does. Standard library only; run as a script by lab/nodes.py:

    python3 lab/door.py --listen 127.0.0.2:2223 --pidfile P -- nsenter --net=NS sshd -i -f CONFIG
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys


def serve(listen: tuple[str, int], command: list[str], pidfile: str) -> None:
    server = socket.create_server(listen, backlog=64)
    with open(pidfile, "w") as handle:  # only once listening: the lab waits for the pidfile
        handle.write(f"{os.getpid()}\n")
    children: list[subprocess.Popen] = []

    def stop(_signum: int, _frame: object) -> None:
        server.close()
        for child in children:
            if child.poll() is None:
                child.terminate()
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    while True:
        conn, _ = server.accept()
        with conn:
            # The connection is sshd's stdin and stdout; sshd -i speaks the protocol on them.
            children.append(subprocess.Popen(command, stdin=conn, stdout=conn, stderr=subprocess.DEVNULL))
        children = [child for child in children if child.poll() is None]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--listen", required=True, help="host:port on this machine's network")
    parser.add_argument("--pidfile", required=True)
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the per-connection command")
    args = parser.parse_args(argv)
    host, _, port = args.listen.rpartition(":")
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not host or not port.isdigit() or not command:
        parser.error("give --listen host:port and, after --, the command to serve each connection")
    serve((host, int(port)), command, args.pidfile)
    return 0


if __name__ == "__main__":
    sys.exit(main())
