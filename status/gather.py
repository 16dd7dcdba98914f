"""Gathering for `status`: the stack's config, each node's report over SSH, the server as a client sees it.

Everything here does I/O and returns plain JSON-able values; judging them is `status.verdict`'s job.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from components.config import (
    NAMESPACE,
    CheckMode,
    ConfigError,
    Executor,
    StackConfig,
    parse_stack_config,
)
from components.fabric_check import facts_report
from components.layout import (
    fabric_check_inputs,
    health_output,
    image_ref,
    node_cache_dir,
    node_container_names,
)
from components.node_programs import program_argv, readiness
from components.node_programs.wire import PROBE_API_KEY_ENV, PROGRESS_DIR
from components.nodes import node_access
from components.provider_kit.reports import read_report
from components.ray_cluster import head_container_name
from components.remote import SSH_TRANSPORT_FAILURE, RemoteError, SshTransport, stderr_tail
from components.vllm_server import vllm_container_name

ROOT = Path(__file__).resolve().parent.parent
# The node program travels in the command (`python3 -I -S -c …`); its request comes on stdin.
NODE_PROGRAM_ARGV = program_argv("node_status", [])
# The API key when the Pulumi CLI cannot give it (`pulumi config get --show-secrets`): the probe's name.
API_KEY_ENV = PROBE_API_KEY_ENV
# Beyond the SSH connect timeout: the node's own docker calls (each bounded on the node).
NODE_COMMAND_S = 90.0
HTTP_TIMEOUT_S = 10.0
COMPLETION_TIMEOUT_S = 120.0
# Where no `pulumi` is on PATH: the project's own CLI that `make engine` builds (engine/build.sh, one
# folder per build with a `.complete` marker) and `make up` runs with the checkout's file backend and
# the lab's passphrase (engine/__init__.py; tests/unit/test_status_cli.py keeps the two in step).
# Without them `status` could not read what `make up` recorded.
ENGINE_STATE = ROOT / ".pulumi-state"
ENGINE_PASSPHRASE = "qwen35-lab"


def engine_cache(env: Mapping[str, str] = os.environ) -> Path:
    """`${QWEN35_CACHE:-~/.cache/qwen35-spark}/engine`: where `make engine` builds the CLI."""
    return Path(env.get("QWEN35_CACHE") or "~/.cache/qwen35-spark").expanduser() / "engine"


@dataclass(frozen=True)
class PulumiCli:
    """The CLI that reads the stack: its path and the environment it runs in (None: ours as is)."""

    path: str
    env: dict[str, str] | None = None


def pulumi_cli(
    which: Callable[[str], str | None] = shutil.which, env: Mapping[str, str] = os.environ
) -> PulumiCli | None:
    """A `pulumi` on PATH, else the newest one `make engine` built (with `make up`'s backend and
    passphrase where the environment names none), else None."""
    found = which("pulumi")
    if found:
        return PulumiCli(found)
    built = sorted(engine_cache(env).glob("*/.complete"), key=lambda m: m.stat().st_mtime, reverse=True)
    cli = next(
        (m.parent / "bin" / "pulumi" for m in built if os.access(m.parent / "bin" / "pulumi", os.X_OK)), None
    )
    if cli is None:
        return None
    run_env = {**env, "PULUMI_HOME": str(engine_cache(env) / "home"), "PULUMI_SKIP_UPDATE_CHECK": "true"}
    if "PULUMI_BACKEND_URL" not in env:
        run_env["PULUMI_BACKEND_URL"] = f"file://{ENGINE_STATE}"
        if not {"PULUMI_CONFIG_PASSPHRASE", "PULUMI_CONFIG_PASSPHRASE_FILE"} & set(env):
            run_env["PULUMI_CONFIG_PASSPHRASE"] = ENGINE_PASSPHRASE
    return PulumiCli(str(cli), run_env)


def no_cli(env: Mapping[str, str] = os.environ) -> str:
    """Why no stack output can be read, and what to do."""
    return f"no Pulumi CLI here (none on PATH, none built by `make engine` under {engine_cache(env)})"


def read_stack_file(path: Path) -> dict[str, Any]:
    """The `qwen35-spark:*` keys of a `Pulumi.<stack>.yaml` (namespace removed), as the program sees them."""
    try:
        document = yaml.safe_load(path.read_text()) or {}
    except OSError as exc:
        raise ConfigError([f"{path}: cannot be read ({exc.strerror}): give --stack or --file"]) from None
    except yaml.YAMLError as exc:
        raise ConfigError([f"{path}: not YAML: {str(exc).splitlines()[0]}"]) from None
    raw = {}
    for full_key, value in (document.get("config") or {}).items():
        namespace, _, key = str(full_key).partition(":")
        if namespace == NAMESPACE:
            raw[key] = value
    return raw


def load_config(path: Path) -> StackConfig:
    """The validated StackConfig of a stack file; a bad one raises ConfigError naming every field."""
    return parse_stack_config(read_stack_file(path))


def api_key(
    stack: str,
    cwd: Path = ROOT,
    env: Mapping[str, str] = os.environ,
    which: Callable[[str], str | None] = shutil.which,
) -> tuple[str | None, str]:
    """(key, where it came from): the Pulumi CLI's secret where the CLI exists, else $QWEN35_API_KEY."""
    cli = pulumi_cli(which, env)
    if cli:
        argv = [cli.path, "config", "get", "--show-secrets", f"{NAMESPACE}:api_key", "--stack", stack]
        try:
            done = subprocess.run(
                argv,
                cwd=cwd,
                env=cli.env,
                capture_output=True,
                stdin=subprocess.DEVNULL,
                timeout=60,
                check=False,
            )
        except subprocess.TimeoutExpired:
            done = None
        if done is not None and done.returncode == 0 and done.stdout.strip():
            return done.stdout.decode().strip(), "pulumi config"
    if env.get(API_KEY_ENV):
        return env[API_KEY_ENV], f"${API_KEY_ENV}"
    return None, ""


def node_requests(config: StackConfig) -> dict[str, dict[str, Any]]:
    """What each node is asked about: the declared image, containers, checkpoint (no secret).

    The checkpoint is looked for where the node's Checkpoint resource keeps it and its containers
    mount it (`node_cache_dir`); a `serve.model` that is a path is checked for its config.json.
    """
    image = deployment_image(config)
    containers = node_container_names(config)
    model = config.hub_repo or (config.serve.model if config.serve.model.startswith("/") else None)
    return {
        node.name: {
            "image": image,
            "containers": containers[node.name],
            "hf_cache": node_cache_dir(config, node.name),
            "model": model,
            "revision": config.model.revision,
            # Under executor mp no Ray runs: nothing to ask `ray status`.
            "ray_container": head_container_name(config)
            if node is config.head and config.cluster.executor is not Executor.MP
            else None,
            "progress_dir": PROGRESS_DIR,
            # The head: what the KV-cache sizing needs, and what the server itself logged about it.
            "sizing": node is config.head,
            "server_container": vllm_container_name(config) if node is config.head else None,
            # The head: the watchdog's /state, read there (it listens on the fabric address).
            "watchdog_url": health_output(config)["state_url"] if node is config.head else None,
        }
        for node in config.nodes
    }


def deployment_image(config: StackConfig) -> str:
    """The image reference every node should hold (the one place `status` learns it)."""
    return image_ref(config.image)


def ask_node(transport: SshTransport, request: dict[str, Any], timeout: float) -> dict[str, Any]:
    """The node's report, or {"reachable": False, "error": why} (never raises for a node's failure)."""
    started = time.monotonic()
    try:
        result = transport.run(NODE_PROGRAM_ARGV, stdin=json.dumps(request).encode(), timeout=timeout)
    except RemoteError as exc:
        return {"reachable": False, "error": exc.hint or str(exc), "seconds": _since(started)}
    if result.returncode == SSH_TRANSPORT_FAILURE:
        # ssh's last line is the reason (connection refused, timed out, host key); warnings come first.
        why = stderr_tail(result.stderr, 1) or "ssh failed (exit 255)"
        return {"reachable": False, "error": why, "seconds": _since(started)}
    if not result.ok:
        why = stderr_tail(result.stderr, 3) or f"exit {result.returncode}"
        return {"reachable": True, "error": f"the status program failed on the node: {why}"}
    report = read_report(result)
    if report is None:
        return {"reachable": True, "error": f"the status program printed no report: {result.text[:120]!r}"}
    return {"reachable": True, **report, "seconds": _since(started)}


def _since(started: float) -> float:
    return round(time.monotonic() - started, 2)


def server_facts(base: str, model: str, key: str | None) -> dict[str, Any]:
    """/health, /v1/models and one timed chat completion, from here (as a client sees the server)."""
    facts: dict[str, Any] = {"url": base}
    try:
        readiness.check_health(base, HTTP_TIMEOUT_S)
        facts["health"] = {"ok": True}
    except readiness.NotReady as exc:
        # Nothing behind it will answer either: one problem, not three.
        facts["health"] = {"ok": False, "error": exc.detail}
        return facts
    try:
        readiness.check_models(base, model, key, HTTP_TIMEOUT_S)
        facts["models"] = {"ok": True}
    except readiness.NotReady as exc:
        facts["models"] = {"ok": False, "error": exc.detail}
    except readiness.ReadinessError:
        facts["models"] = {"ok": False, "rejected": True}
    if facts["models"].get("rejected") and not key:
        facts["completion"] = {"tried": False, "why": "no API key"}
        return facts
    started = time.monotonic()
    try:
        tokens, _reply = readiness.check_completion(base, model, key, COMPLETION_TIMEOUT_S)
    except readiness.NotReady as exc:
        facts["completion"] = {"tried": True, "ok": False, "error": exc.detail}
        return facts
    except readiness.ReadinessError:
        facts["completion"] = {"tried": True, "ok": False, "rejected": True}
        return facts
    latency = time.monotonic() - started
    facts["completion"] = {
        "tried": True,
        "ok": True,
        "latency_s": round(latency, 3),
        "tokens": tokens,
        "tokens_per_s": round(tokens / latency, 1) if latency > 0 else None,
    }
    return facts


def server_base(config: StackConfig) -> str:
    """The server's base URL as a client reaches it (the stack's `endpoint` without `/v1`)."""
    from components.vllm_server import endpoint_url

    return endpoint_url(config).removesuffix("/v1")


def fabric_facts(config: StackConfig, transport: SshTransport, node_name: str) -> dict[str, Any]:
    """The node's fabric report as FabricCheck reads it ({"report": …}), or {"error": why}."""
    node = next(n for n in config.nodes if n.name == node_name)
    try:
        return {"report": facts_report(fabric_check_inputs(config, node, {"name": node_name}), transport)}
    except RemoteError as exc:
        return {"error": exc.hint or str(exc)}


def stack_output(
    name: str,
    stack: str,
    cwd: Path = ROOT,
    which: Callable[[str], str | None] = shutil.which,
    env: Mapping[str, str] = os.environ,
) -> dict[str, Any]:
    """The stack output `name` as the last `pulumi up` recorded it ({"output": …}), or {"error": why}
    (no Pulumi CLI, no such stack, nothing deployed)."""
    cli = pulumi_cli(which, env)
    if not cli:
        return {"error": f"{no_cli(env)} to read the stack output `{name}`"}
    argv = [cli.path, "stack", "output", name, "--json", "--stack", stack]
    try:
        done = subprocess.run(argv, cwd=cwd, env=cli.env, capture_output=True, timeout=60, check=False)
    except subprocess.TimeoutExpired:
        return {"error": f"`pulumi stack output {name}` did not answer in 60 s"}
    if done.returncode != 0:
        why = stderr_tail(done.stderr.decode(errors="replace"), 1) or f"exit {done.returncode}"
        return {"error": f"`pulumi stack output {name} --stack {stack}`: {why}"}
    try:
        output = json.loads(done.stdout)
    except ValueError:
        return {"error": f"`pulumi stack output {name}` printed no JSON"}
    return {"output": output} if isinstance(output, dict) else {"error": f"no stack output `{name}`"}


def stack_fabric(
    stack: str,
    cwd: Path = ROOT,
    which: Callable[[str], str | None] = shutil.which,
    env: Mapping[str, str] = os.environ,
) -> dict[str, Any]:
    """The stack output `fabric` ({"output": …}: per node what FabricCheck recorded, the probe's
    `throughput` among it), or {"error": why}."""
    return stack_output("fabric", stack, cwd, which, env)


def stack_bench(
    stack: str,
    cwd: Path = ROOT,
    which: Callable[[str], str | None] = shutil.which,
    env: Mapping[str, str] = os.environ,
) -> dict[str, Any]:
    """The stack output `serve_bench` ({"output": …}: the figures the last `up` measured), or
    {"error": why}. `status` sends no bench of its own: a minute of the server's time is `up`'s call."""
    return stack_output("serve_bench", stack, cwd, which, env)


def stack_answers(
    stack: str, cwd: Path = ROOT, which: Callable[[str], str | None] = shutil.which
) -> dict[str, Any]:
    """The stack output `answers` ({"output": …}: the receipts and verdict the last `up` recorded), or
    {"error": why}. `status` sends no prompt of its own: the check is `up`'s, when what it judges changed."""
    return stack_output("answers", stack, cwd, which)


def stack_cold_start(
    stack: str,
    cwd: Path = ROOT,
    which: Callable[[str], str | None] = shutil.which,
    env: Mapping[str, str] = os.environ,
) -> dict[str, Any]:
    """The stack output `cold_start` ({"output": …}: the serving start the readiness gate last waited
    for, `node_programs/cold_start.py`), or {"error": why}."""
    return stack_output("cold_start", stack, cwd, which, env)


def gather(
    config: StackConfig, key: str | None, connect_timeout: int = 10, stack: str | None = None
) -> dict[str, Any]:
    """Every node's report and the server's answers, all at once (a dead node costs its connect timeout);
    with `stack` given, the stack outputs `fabric` (FabricCheck on: the last probe's figures) and
    `serve_bench` (the bench on: the last `up`'s figures), `answers` (the answer check on: the last
    `up`'s verdict) and `cold_start` (the gate's last start)."""
    requests = node_requests(config)
    access = node_access(config)
    # Every job at once: the server, each node's ask and fabric read, the stack output.
    with ThreadPoolExecutor(max_workers=2 * len(access) + 3) as pool:
        server = pool.submit(server_facts, server_base(config), config.serve.model_name, key)
        asked = {
            name: pool.submit(
                ask_node,
                SshTransport(replace(acc.target, connect_timeout=connect_timeout)),
                requests[name],
                connect_timeout + NODE_COMMAND_S,
            )
            for name, acc in access.items()
        }
        fabric = {}
        if config.fabric.check is not CheckMode.OFF:
            fabric = {
                name: pool.submit(
                    fabric_facts,
                    config,
                    SshTransport(replace(acc.target, connect_timeout=connect_timeout)),
                    name,
                )
                for name, acc in access.items()
            }
        # The stack output `fabric`: the probes' figures, the node proof's verdict and what the serving
        # ranks logged about their transport (over more than one node).
        proof_on = config.fabric.proof is not CheckMode.OFF
        wanted = fabric or proof_on or len(config.nodes) > 1
        recorded = pool.submit(stack_fabric, stack) if wanted and stack else None
        bench_on = config.bench.mode is not CheckMode.OFF
        bench = pool.submit(stack_bench, stack) if bench_on and stack else None
        answers_on = config.answers.mode is not CheckMode.OFF
        answers = pool.submit(stack_answers, stack) if answers_on and stack else None
        started = pool.submit(stack_cold_start, stack) if stack else None
        nodes = {name: future.result() for name, future in asked.items()}
        for name, future in fabric.items():
            if nodes[name].get("reachable"):
                nodes[name]["fabric"] = future.result()
        gathered = {"nodes": nodes, "server": server.result(), "image": deployment_image(config)}
        if recorded is not None:
            gathered["fabric_output"] = recorded.result()
        if bench is not None:
            gathered["bench_output"] = bench.result()
        if answers is not None:
            gathered["answers_output"] = answers.result()
        if started is not None:
            gathered["cold_start_output"] = started.result()
        return gathered
