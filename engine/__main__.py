"""`python -m engine build|up|down`: the program deployed onto the lab by the real Pulumi engine.

`up` (make up): builds the engine if needed, starts lab nodes node-a and node-b, places the hybrid's
stand-in base and donor on node-a and transformers' wheels in patches/wheels/, serves the stand-in Hub
on 127.0.0.1:18090 (a background process that `down` stops), and runs `pulumi up` of stack
`lab-engine` (Pulumi.lab.yaml as committed, engine/lab_stack.py) with the engine's own display: the
hybrid built on node-a and proven, copied to node-b, served.
Prints the `endpoint` output and a request that answers. `down` destroys the stack, removes it from
the local backend and stops the Hub. The state lives in `.pulumi-state/` of this checkout.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from components.image_build.component import PATCH_DIR
from engine import ROOT, Engine, EngineError, ensure_engine
from engine.lab_stack import engine_lab_config, lab_image_config, stack_file, write_config
from lab.nodes import bind_error

STACK = "lab-engine"
HUB_HOST, HUB_PORT = "127.0.0.1", 18090


def state_dir() -> Path:
    return ROOT / ".pulumi-state"


def config_file() -> Path:
    return stack_file(STACK)


def start_hub() -> str:
    """The stand-in Hub for `make up`, started once and left running until `make down`."""
    pidfile = state_dir() / "hub.pid"
    endpoint = f"http://{HUB_HOST}:{HUB_PORT}"
    if pidfile.exists():
        pid = int(pidfile.read_text())
        try:
            os.kill(pid, 0)
            return endpoint
        except ProcessLookupError:
            pidfile.unlink()
    if bind_error(HUB_HOST, HUB_PORT) is not None:
        raise EngineError(f"{HUB_HOST}:{HUB_PORT} is taken by another process: the stand-in Hub needs it")
    log = open(state_dir() / "hub.log", "w")  # noqa: SIM115 (the Hub keeps it after we return)
    hub = subprocess.Popen(
        [sys.executable, "-m", "lab.standin_hub", str(HUB_PORT)],
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    deadline = time.monotonic() + 30
    while bind_error(HUB_HOST, HUB_PORT) is None:
        if hub.poll() is not None or time.monotonic() > deadline:
            raise EngineError(f"the stand-in Hub did not start: see {state_dir() / 'hub.log'}")
        time.sleep(0.2)
    pidfile.write_text(str(hub.pid))
    return endpoint


def stop_hub() -> None:
    pidfile = state_dir() / "hub.pid"
    if pidfile.exists():
        with contextlib.suppress(ProcessLookupError):
            os.killpg(int(pidfile.read_text()), signal.SIGTERM)
        pidfile.unlink()


def up() -> int:
    import lab
    from lab.vllm_images import lab_build_inputs

    engine = ensure_engine()
    print(f"engine: {engine.pulumi} ({engine.origin}); state in {engine.backend}", flush=True)
    nodes = lab.up(["node-a", "node-b"])
    endpoint = start_hub()
    config = engine_lab_config(None, endpoint)
    # The committed stack builds the hybrid on node-a: its stand-in base and donor, and the wheels.
    lab_build_inputs(nodes["node-a"], lab_image_config(config), PATCH_DIR)
    stacks = engine.run("stack", "ls", "--json").json()
    if not any(s["name"] == STACK for s in stacks):
        config_file().unlink(missing_ok=True)
        engine.run("stack", "init", STACK)  # writes the passphrase's salt into Pulumi.<stack>.yaml
    write_config(config_file(), config)
    # The engine's own display, live: this is what an operator watches.
    argv = [str(engine.pulumi), "up", "--yes", "--skip-preview", "--stack", STACK, "--non-interactive"]
    code = subprocess.run(argv, cwd=ROOT, env=engine.env(), check=False).returncode
    if code != 0:
        print(f"make up: pulumi up failed (exit {code}); the display above says why", file=sys.stderr)
        return code
    out = engine.run("stack", "output", "--json", stack=STACK).json()
    print(f"\nendpoint: {out['endpoint']}  (model {out['served_model']})")
    print(
        f"  curl -s {out['endpoint']}/chat/completions -H 'Content-Type: application/json' "
        f"""-d '{{"model": "{out["served_model"]}", "messages": [{{"role": "user", "content": "hi"}}]}}'"""
    )
    return 0


def destroy_stack(engine: Engine, stack: str, config: Path) -> int:
    """`pulumi destroy` of `stack`, then its removal from the backend and its config file; the exit
    status (0 when the stack was never made). Works after a failed `up` and after containers were
    removed by hand: the Docker provider deletes a container that is already gone as done."""
    stacks = engine.run("stack", "ls", "--json").json()
    if not any(s["name"] == stack for s in stacks):
        return 0
    argv = [str(engine.pulumi), "destroy", "--yes", "--stack", stack, "--non-interactive"]
    code = subprocess.run(argv, cwd=ROOT, env=engine.env(), check=False).returncode
    if code == 0:
        engine.run("stack", "rm", stack, "--yes")
        config.unlink(missing_ok=True)
    return code


def down() -> int:
    code = destroy_stack(ensure_engine(), STACK, config_file())
    stop_hub()
    return code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine", description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["build", "up", "down"])
    args = parser.parse_args(argv)
    try:
        if args.command == "build":
            engine = ensure_engine()
            print(f"engine: {engine.pulumi} ({engine.origin})")
            return 0
        return up() if args.command == "up" else down()
    except EngineError as exc:
        print(f"make {args.command}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
