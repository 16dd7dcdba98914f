"""Prove the image's cluster layer: Ray beside vLLM in one interpreter, a Ray node that starts, and
vLLM's Ray executor backend (stdlib only; it imports the image's own `ray` and `vllm`).

Stages, in order (`--stages`, default all; the build without torch leaves out `executor`):
  ray       `ray` imports in this interpreter next to `vllm`, at the wanted version (`--ray-version`,
            a pip spec) and within vLLM's own Ray requirement when vLLM's metadata states one;
  cluster   a one-node Ray cluster starts, answers `ray status` and stops (`ray start --head`,
            private ports and temp dir, `ray stop`); run it only in a PID namespace of its own
            (a build step, a container): `ray stop` stops every Ray process it can see;
  executor  vLLM's Ray executor backend imports and finds Ray available (this needs torch).
stderr: progress and a VERDICT line; the last stdout line is one JSON object (`verdict`,
`failed_stage`, `error`, `ray`, `wanted`, `vllm`, `vllm_ray_requirement`, `python`, `checks`).
Exit 0 pass, 1 a stage failed, 2 usage error.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time

STAGES = ("ray", "cluster", "executor")
EXIT_PASS, EXIT_FAIL, EXIT_USAGE = 0, 1, 2
RAY_COMMAND_TIMEOUT_S = 180
STATUS_WAIT_S = 90
# vLLM's Ray executor and its Ray helpers, newest layout first (0.17: v1/executor/ray_executor.py).
EXECUTOR_MODULES = (
    ("vllm.v1.executor.ray_executor", "vllm.v1.executor.ray_utils"),
    ("vllm.v1.executor.ray_distributed_executor", "vllm.v1.executor.ray_utils"),
    ("vllm.executor.ray_distributed_executor", "vllm.executor.ray_utils"),
)
VERSION_LINE = re.compile(r"""^__version__\s*=\s*(?:version\s*=\s*)?['"]([^'"]+)['"]""", re.M)


class StageFailed(Exception):
    """A stage said no; the message names what is missing and what to do."""


def log(message: str) -> None:
    print(f"prove_cluster: {message}", file=sys.stderr, flush=True)


# ---- versions -------------------------------------------------------------------------------------


def _specifier(spec: str):
    """A `packaging` SpecifierSet (vLLM's environment has it; pip vendors it), or None."""
    for module in ("packaging.specifiers", "pip._vendor.packaging.specifiers"):
        try:
            return importlib.import_module(module).SpecifierSet(spec)
        except ImportError:
            continue
    return None


def satisfies(version: str, spec: str) -> bool:
    """`version` is within the pip spec (`==X[,==Y]` needs no library; ranges need `packaging`)."""
    parts = [part.strip() for part in spec.split(",") if part.strip()]
    if parts and all(part.startswith("==") and "*" not in part for part in parts):
        return all(version == part[2:].strip() for part in parts)
    specifier = _specifier(spec)
    if specifier is None:
        raise StageFailed(f"cannot compare Ray {version} with {spec!r}: no `packaging` in this interpreter")
    return specifier.contains(version, prereleases=True)


def vllm_version() -> str | None:
    """vLLM's version without importing it (importing vLLM needs torch): metadata, else _version.py."""
    try:
        return importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        pass
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return None
    for name in ("_version.py", "version.py"):
        path = os.path.join(list(spec.submodule_search_locations)[0], name)
        try:
            with open(path, encoding="utf-8") as handle:
                found = VERSION_LINE.search(handle.read())
        except OSError:
            continue
        if found:
            return found.group(1)
    return "unknown"


def vllm_ray_requirement() -> str | None:
    """The Ray requirement in vLLM's own metadata (`ray[cgraph]>=2.48.0`), or None."""
    try:
        requires = importlib.metadata.requires("vllm") or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for line in requires:
        requirement, _, marker = line.partition(";")
        name = re.match(r"^\s*([A-Za-z0-9_.-]+)", requirement)
        if name and name.group(1).lower() == "ray" and "extra" not in marker:
            return requirement.strip()
    return None


# ---- stages ---------------------------------------------------------------------------------------


def stage_ray(report: dict, wanted: str | None) -> str:
    """Ray and vLLM in this interpreter; Ray's version as wanted and as vLLM requires."""
    if importlib.util.find_spec("vllm") is None:
        raise StageFailed(
            f"no `vllm` in this interpreter ({sys.executable}): the image's python3 is not vLLM's"
        )
    report["vllm"] = vllm_version()
    try:
        import ray  # noqa: PLC0415 (the image's own Ray: the thing under proof)
    except ImportError as exc:
        raise StageFailed(
            f"no Ray in the interpreter that runs vLLM {report['vllm']} ({sys.executable}): "
            f"{type(exc).__name__}: {exc}; the Ray containers would crash-loop: use an image with Ray "
            f"{wanted or ''}".rstrip()
            + " (image.strategy: graft adds the base image's Ray)"
        ) from None
    report["ray"] = ray.__version__
    if wanted and not satisfies(ray.__version__, wanted):
        raise StageFailed(
            f"Ray {ray.__version__} in the image, the stack needs Ray {wanted}: Ray must be the same "
            "release on every node and in the build's base"
        )
    requirement = vllm_ray_requirement()
    report["vllm_ray_requirement"] = requirement
    if requirement:
        spec = requirement.split("]", 1)[-1] if "]" in requirement else requirement[3:]
        if spec.strip() and not satisfies(ray.__version__, spec.strip()):
            raise StageFailed(
                f"Ray {ray.__version__} is outside vLLM {report['vllm']}'s own requirement {requirement}"
            )
    return f"ray {ray.__version__} at {os.path.dirname(ray.__file__)} beside vllm {report['vllm']}"


def free_ports(count: int) -> list[int]:
    """Ports free on this machine now (a build may share the host's network)."""
    sockets, ports = [], []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
            ports.append(sock.getsockname()[1])
    finally:
        for sock in sockets:
            sock.close()
    return ports


def ray_command() -> list[str]:
    """The `ray` command on PATH: the program's Ray containers run `ray start` by that name."""
    found = shutil.which("ray")
    if not found:
        raise StageFailed(
            "no `ray` command on PATH, though `import ray` works: the program's Ray containers run "
            "`ray start`; the image must put Ray's console script on PATH"
        )
    return [found]


def run_ray(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=RAY_COMMAND_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise StageFailed(
            f"`{' '.join(argv[:3])} …` did not finish within {RAY_COMMAND_TIMEOUT_S} s"
        ) from None


def _tail(done: subprocess.CompletedProcess, lines: int = 8) -> str:
    return " | ".join((done.stderr or done.stdout).strip().splitlines()[-lines:])


def wait_for_one_node(ray: list[str], port: int, env: dict[str, str]) -> None:
    """`ray status` until it lists the node (the autoscaler's report lags the start by seconds)."""
    deadline = time.monotonic() + STATUS_WAIT_S
    while True:
        status = run_ray([*ray, "status", f"--address=127.0.0.1:{port}"], env)
        if status.returncode == 0 and re.search(r"^\s*1 node_", status.stdout, re.M):
            return
        if time.monotonic() > deadline:
            raise StageFailed(
                f"`ray status` (exit {status.returncode}) did not list the node started "
                f"{STATUS_WAIT_S} s earlier: {_tail(status, 12)}"
            )
        time.sleep(2)


def stage_cluster(report: dict) -> str:
    """`ray start --head` on loopback with private ports, `ray status`, `ray stop`."""
    ray = ray_command()
    temp = tempfile.mkdtemp(prefix="qwen35-ray-")
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    port, node_manager, object_manager, agent, agent_grpc, metrics, runtime_env, client, workers = free_ports(
        9
    )
    start = [
        *ray, "start", "--head", "--disable-usage-stats",
        "--node-ip-address=127.0.0.1", f"--port={port}", f"--temp-dir={temp}",
        "--include-dashboard=false", "--num-cpus=1", "--num-gpus=0",
        f"--node-manager-port={node_manager}", f"--object-manager-port={object_manager}",
        f"--dashboard-agent-listen-port={agent}", f"--dashboard-agent-grpc-port={agent_grpc}",
        f"--metrics-export-port={metrics}", f"--runtime-env-agent-port={runtime_env}",
        f"--ray-client-server-port={client}",
        f"--min-worker-port={workers}", f"--max-worker-port={workers + 20}",
    ]  # fmt: skip
    started = time.monotonic()
    try:
        done = run_ray(start, env)
        if done.returncode != 0:
            raise StageFailed(f"`ray start --head` exited {done.returncode}: {_tail(done)}")
        wait_for_one_node(ray, port, env)
    finally:
        stopped = run_ray([*ray, "stop", "--force"], env)
        shutil.rmtree(temp, ignore_errors=True)
    if stopped.returncode != 0:
        raise StageFailed(f"`ray stop` exited {stopped.returncode}: {_tail(stopped)}")
    seconds = time.monotonic() - started
    return f"one-node Ray cluster started, listed by `ray status` and stopped in {seconds:.0f} s"


def stage_executor(report: dict) -> str:
    """vLLM's Ray executor backend imports, and vLLM's Ray helpers find Ray usable."""
    tried = []
    for executor, utils in EXECUTOR_MODULES:
        try:
            if importlib.util.find_spec(executor) is None:
                tried.append(executor)
                continue
        except ModuleNotFoundError as exc:
            if exc.name and exc.name.startswith("vllm"):
                tried.append(executor)
                continue
            raise StageFailed(f"importing vLLM for its Ray executor: {type(exc).__name__}: {exc}") from None
        try:
            importlib.import_module(executor)
            helpers = importlib.import_module(utils)
        except Exception as exc:  # noqa: BLE001 (any import failure is the verdict)
            raise StageFailed(f"{executor} does not import: {type(exc).__name__}: {exc}") from None
        check = getattr(helpers, "assert_ray_available", None)
        if check is not None:
            try:
                check()
            except Exception as exc:  # noqa: BLE001
                raise StageFailed(f"vLLM says Ray is not usable: {type(exc).__name__}: {exc}") from None
        return f"{executor} imports; {utils} finds Ray available"
    raise StageFailed(f"this vLLM has no Ray executor backend (looked for {', '.join(tried)})")


# ---- main -----------------------------------------------------------------------------------------


def prove(stages: list[str], wanted: str | None) -> dict:
    report = {
        "verdict": "pass", "failed_stage": None, "error": None, "ray": None, "wanted": wanted,
        "vllm": None, "vllm_ray_requirement": None, "python": sys.version.split()[0], "checks": [],
    }  # fmt: skip
    runners = {"ray": lambda: stage_ray(report, wanted), "cluster": lambda: stage_cluster(report),
               "executor": lambda: stage_executor(report)}  # fmt: skip
    for stage in stages:
        log(f"stage {stage} …")
        try:
            detail = runners[stage]()
        except StageFailed as exc:
            report.update(verdict="fail", failed_stage=stage, error=str(exc))
            report["checks"].append({"stage": stage, "ok": False, "detail": str(exc)})
            break
        report["checks"].append({"stage": stage, "ok": True, "detail": detail})
        log(f"stage {stage}: {detail}")
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stages", default=",".join(STAGES), help="comma-separated: " + ",".join(STAGES))
    parser.add_argument(
        "--ray-version", default="", help="the Ray the image must hold, a pip spec (==2.49.1)"
    )
    args = parser.parse_args(argv)
    stages = [s.strip() for s in args.stages.split(",") if s.strip()]
    unknown = [s for s in stages if s not in STAGES]
    if unknown or not stages:
        report = {
            "verdict": "fail",
            "failed_stage": "usage",
            "error": f"--stages: unknown {unknown or 'none given'}",
        }
        print(json.dumps(report))
        return EXIT_USAGE
    if "cluster" in stages and "ray" not in stages:
        stages.insert(0, "ray")  # a cluster of no Ray proves nothing; say which Ray first
    report = prove(sorted(stages, key=STAGES.index), args.ray_version.strip() or None)
    log(
        f"VERDICT {report['verdict']}"
        + (f" at {report['failed_stage']}: {report['error']}" if report["error"] else "")
    )
    print(json.dumps(report))
    return EXIT_PASS if report["verdict"] == "pass" else EXIT_FAIL


if __name__ == "__main__":
    sys.exit(main())
