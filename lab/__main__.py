"""`python -m lab up|down|status|images|clear|fetch`: the lab from the command line (make lab-up, …)."""

from __future__ import annotations

import argparse
import sys
import time

from lab.images import busybox_image, clear_left_images, debian_image
from lab.layout import NODE_NAMES, LabError, LabNode
from lab.nodes import down, purge, running_nodes, status, up


def parse_nodes(text: str | None) -> list[str] | None:
    return [name.strip() for name in text.split(",") if name.strip()] if text else None


def node_table(nodes: dict[str, LabNode]) -> str:
    rows = [("node", "ssh", "engine", "store", "DOCKER_HOST")]
    rows += [
        (n.name, f"{n.target}:{n.port}" + (f" via {n.proxy_jump}" if n.proxy_jump else ""), n.engine, n.store,
         n.docker_host)
        for n in nodes.values()
    ]  # fmt: skip
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) for row in rows)
    return "\n".join(line.rstrip() for line in lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    for name, text in (("up", "start nodes (idempotent)"), ("down", "stop nodes and verify nothing is left")):
        sub = commands.add_parser(name, help=text)
        sub.add_argument("--nodes", help=f"comma-separated subset of {','.join(NODE_NAMES)} (default: all)")
        if name == "down":
            sub.add_argument("--purge", action="store_true", help="also delete data roots and runtime state")
    commands.add_parser("status", help="what runs now")
    images = commands.add_parser("images", help="make sure the stand-in images are on the running nodes")
    images.add_argument("--debian", action="store_true", help="also import the Debian image (slow once)")
    commands.add_parser("clear", help="remove the images tests left on the running nodes (sessions do it)")
    commands.add_parser("fetch", help="download what the lab builds from (wheels, root filesystems), once")
    args = parser.parse_args(argv)
    if args.command == "fetch":
        from lab.fetch import main as fetch

        return fetch()
    started = time.monotonic()
    try:
        if args.command == "up":
            nodes = up(parse_nodes(args.nodes))
            print(node_table(nodes))
            print(f"lab: up in {time.monotonic() - started:.1f}s")
        elif args.command == "down":
            for note in down(parse_nodes(args.nodes)):
                print(f"lab: {note}")
            if args.purge:
                if args.nodes:
                    raise LabError("lab: --purge removes the whole lab; use it without --nodes")
                purge()
                print("lab: purged data roots and runtime state")
            print(f"lab: down in {time.monotonic() - started:.1f}s; nothing left running")
        elif args.command == "status":
            for state in status().values():
                word = "running" if state.running else "stopped"
                detail = f" engine {state.engine} store {state.store}" if state.running else ""
                partial = "" if state.running or not (state.dockerd_pid or state.sshd_pid) else " (partly up)"
                print(f"{state.name}: {word}{partial}{detail}")
        elif args.command == "images":
            for node in running_nodes().values():
                print(f"{node.name}: busybox {busybox_image(node)}")
                if args.debian:
                    print(f"{node.name}: debian {debian_image(node)}")
        elif args.command == "clear":
            for node in running_nodes().values():
                print(f"{node.name}: removed {len(clear_left_images(node))} images tests left")
    except LabError as exc:
        print(exc, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
