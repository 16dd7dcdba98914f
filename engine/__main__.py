"""`python -m engine build|up|down`: the program deployed onto the lab by the real Pulumi engine.

`up` (make up): builds the engine if needed, starts lab nodes node-a and node-b, places the real-vLLM
lab image on both (vLLM's CPU build, lab/vllm_cpu_image.py: built once, then loaded from the cache),
serves the stand-in Hub on 127.0.0.1:18090 (a background process that `down` stops) with the tiny real
Qwen3.5-MoE, and runs `pulumi up` of stack `lab-engine` (Pulumi.lab.yaml with engine/real_vllm.yaml,
engine/lab_stack.py `real_engine_config`) with the engine's own display: the checkpoint fetched and
copied, the model-support check in enforce, vLLM's two ranks under executor mp, the gate's completion.
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

from engine import ROOT, Engine, EngineError, ensure_engine
from engine.lab_stack import real_answers, real_engine_config, stack_file, write_config
from lab.layout import LabError
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


def answers_reference(node, image: str) -> Path:
    """transformers' answers on the checkpoint the stand-in Hub serves (the same bytes: it is made
    deterministically), for the answer check; made in the image on `node` once, then cached."""
    from lab import tiny_qwen35
    from lab.answers_reference import make_reference

    repo = tiny_qwen35.write(state_dir() / "answers-checkpoint")
    try:
        return make_reference(node, image, repo, real_answers())
    except LabError as exc:
        raise EngineError(f"the answer check's reference could not be made: {exc}") from None


def up() -> int:
    import lab
    from lab.vllm_cpu_image import vllm_cpu_image

    engine = ensure_engine()
    print(f"engine: {engine.pulumi} ({engine.origin}); state in {engine.backend}", flush=True)
    nodes = lab.up(["node-a", "node-b"])
    # On both nodes, so NodeImage sends nothing and a destroy keeps the 6.5 GB of layers.
    tags = {vllm_cpu_image(node)[0] for node in nodes.values()}
    endpoint = start_hub()
    image = tags.pop()
    config = real_engine_config(image, endpoint, answers_reference(nodes["node-a"], image))
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
