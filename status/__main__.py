"""`python -m status [--stack dev] [--json]`: is everything up, on every node, as the stack declares?

Exit status: 0 when everything is as declared, 1 when anything differs (each problem printed with
the node and the next step), 2 when the stack file itself is invalid.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from components.config import ConfigError
from status import gather, render
from status.verdict import judge


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="status", description=__doc__.splitlines()[0])
    parser.add_argument("--stack", default="dev", help="reads Pulumi.<stack>.yaml (default: dev)")
    parser.add_argument("--file", type=Path, help="a stack file elsewhere (default: Pulumi.<stack>.yaml)")
    parser.add_argument("--json", action="store_true", help="one JSON document instead of tables")
    parser.add_argument(
        "--connect-timeout", type=int, default=10, help="seconds an unanswering node may cost (default 10)"
    )
    args = parser.parse_args(argv)
    path = args.file or gather.ROOT / f"Pulumi.{args.stack}.yaml"
    stack = args.stack
    if args.file and args.file.name.startswith("Pulumi.") and args.file.suffix == ".yaml":
        stack = args.file.name.removeprefix("Pulumi.").removesuffix(".yaml")
    try:
        config = gather.load_config(path)
    except ConfigError as exc:
        print(f"status: {path}: {exc}", file=sys.stderr)  # names every bad field; nothing was asked
        return 2
    key, _source = gather.api_key(stack)
    gathered = gather.gather(config, key, connect_timeout=args.connect_timeout, stack=stack)
    verdict = judge(config, gathered)
    if args.json:
        print(render.as_json(verdict, stack, gathered))
    else:
        print(render.text(verdict, stack), end="")
    return 0 if verdict.ok else 1


if __name__ == "__main__":
    sys.exit(main())
