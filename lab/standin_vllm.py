"""A stand-in for `vllm serve`, for the lab only: a TEST DOUBLE of vLLM, and it says so everywhere.

Installed in the lab Ray image as /usr/local/bin/vllm. It takes `vllm serve`'s flags, joins the running
Ray cluster the way vLLM's Ray executor does (driver on the head, `RAY_ADDRESS`), asks for a placement
group of TP×PP GPU bundles and waits for it like vLLM does (it never serves while the cluster lacks the
nodes and GPUs that TP×PP needs), starts one Ray actor per bundle, then serves /health, /v1/models and
/v1/chat/completions. No model runs: a completion is assembled by the actors, so every answer proves
that the Ray workers on every node are alive. When one of them dies the "engine" is dead: the server
answers 500 and exits, as vLLM does.

With `--nnodes N` (vLLM's own multi-node executor, `--distributed-executor-backend mp`) no Ray is
used: rank 0 (the head) listens on `--master-addr:--master-port` and serves nothing before all N−1
`--headless` ranks have joined with a handshake of their rank and world size. A wrong world size, a
rank that joins twice, or one that never joins (JOIN_TIMEOUT_ENV) makes the head exit with the kind of
error vLLM gives; a headless rank that dies later makes the head exit, as a broken NCCL group would,
and a headless rank exits when the head is gone.

Only the standard library and `ray` (imported when serving with Ray, so the pure parts test without Ray).
"""

from __future__ import annotations

import argparse
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

STANDIN_NOTE = "lab stand-in for vLLM (a test double: no model runs; the Ray cluster is real)"
STANDIN_HEADER = "X-Vllm-Standin"
# vLLM's own limit for a placement group to become ready (vllm/executor/ray_utils.py PG_WAIT_TIMEOUT).
PG_WAIT_TIMEOUT_S = 1800
PG_LOG_EVERY_S = 10
# How long /health and a completion wait for the actors before calling the engine dead.
ACTOR_TIMEOUT_S = 10.0
# Multi-node: how long the head waits for every headless rank, and a headless rank for the head
# (torch.distributed's own default store timeout is 600 s).
JOIN_TIMEOUT_ENV = "VLLM_STANDIN_JOIN_TIMEOUT_S"
JOIN_TIMEOUT_S = 600.0
# vLLM's default `ParallelConfig.master_port`.
MASTER_PORT = 29501
# Fault modes for the watchdog's tests and bench, none of them vLLM's. At run time, POST FAULT_PATH
# {"mode": "hang"} (the serving process SIGSTOPs itself: the container stays "Up", nothing answers),
# {"mode": "crash"} (exits 1), {"mode": "slow", "delay_s": D, "health_delay_s": H} (answers late) or
# {"mode": "slow_stop", "stop_s": S} (a SIGTERM then closes the API port and the process exits S seconds
# later, as a vLLM that drains does) or {"mode": "oom", "bytes": N, "child": C} (N bytes taken and
# touched: by the serving process itself, or by a child that stands for vLLM's engine core, whose death
# ends the server as vLLM's API server ends with its engine core; past the container's `--memory` the
# kernel's OOM killer ends either). A fault lives in the process only: a restarted server is well again.
FAULT_PATH = "/standin/fault"
# The leak (eugr #257): every start lowers MemAvailable in this crafted meminfo by LEAK_ENV bytes,
# written in place, never given back.
MEMINFO_ENV = "VLLM_STANDIN_MEMINFO"
LEAK_ENV = "VLLM_STANDIN_LEAK_BYTES"
# A headless rank whose head is gone dials it again instead of exiting (so the head alone can be
# restarted; real vLLM ranks exit with their head).
REJOIN_ENV = "VLLM_STANDIN_REJOIN"


def log(message: str) -> None:
    """vLLM-like log line on stdout (what `docker logs` shows and the readiness gate tails)."""
    stamp = time.strftime("%m-%d %H:%M:%S")
    print(f"INFO {stamp} [standin_vllm] {message}", flush=True)


def build_parser() -> argparse.ArgumentParser:
    """`vllm serve`'s flags that the deployment uses, with vLLM's names and defaults."""
    parser = argparse.ArgumentParser(prog="vllm", description=STANDIN_NOTE)
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="serve the OpenAI-compatible API (stand-in)")
    serve.add_argument("model", help="model id or path (only echoed: nothing is loaded)")
    serve.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    serve.add_argument("--pipeline-parallel-size", "-pp", type=int, default=1)
    serve.add_argument("--distributed-executor-backend", choices=("ray", "mp", "uni"), default=None)
    serve.add_argument("--host", default=None)
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--served-model-name", nargs="+", default=None)
    serve.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    serve.add_argument("--max-model-len", type=int, default=None)
    serve.add_argument("--api-key", default=None)
    serve.add_argument("--revision", default=None)
    serve.add_argument("--nnodes", "-n", type=int, default=1)
    serve.add_argument("--node-rank", "-r", type=int, default=0)
    serve.add_argument("--master-addr", default="127.0.0.1")
    serve.add_argument("--master-port", type=int, default=MASTER_PORT)
    serve.add_argument("--headless", action="store_true")
    return parser


@dataclass(frozen=True)
class ServeArgs:
    """The parsed `vllm serve` command line, plus what the stand-in ignored."""

    model: str
    tensor_parallel_size: int
    pipeline_parallel_size: int
    backend: str | None
    host: str
    port: int
    served_names: tuple[str, ...]
    max_model_len: int
    api_key: str | None
    ignored: tuple[str, ...]
    revision: str | None = None
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = MASTER_PORT
    headless: bool = False

    @property
    def world_size(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size

    @property
    def local_ranks(self) -> range:
        """The global ranks this node holds (vLLM gives every node world_size / nnodes of them)."""
        local = self.world_size // self.nnodes
        return range(self.node_rank * local, (self.node_rank + 1) * local)


def parse_serve_args(argv: Sequence[str], env: dict[str, str] | None = None) -> ServeArgs:
    """Parse `vllm serve …`. Flags vLLM has but the stand-in does not model are kept in `ignored`."""
    env = os.environ if env is None else env
    args, unknown = build_parser().parse_known_args(list(argv))
    if args.tensor_parallel_size < 1 or args.pipeline_parallel_size < 1:
        raise SystemExit("vllm: --tensor-parallel-size and --pipeline-parallel-size must be >= 1")
    check_multi_node(args)
    return ServeArgs(
        model=args.model,
        tensor_parallel_size=args.tensor_parallel_size,
        pipeline_parallel_size=args.pipeline_parallel_size,
        backend=args.distributed_executor_backend,
        host=args.host or "0.0.0.0",
        port=args.port,
        served_names=tuple(args.served_model_name or [args.model]),
        max_model_len=args.max_model_len or 4096,
        # vLLM reads the key from --api-key or VLLM_API_KEY; the deployment uses the variable.
        api_key=args.api_key or env.get("VLLM_API_KEY") or None,
        ignored=tuple(unknown),
        revision=args.revision,
        nnodes=args.nnodes,
        node_rank=args.node_rank,
        master_addr=args.master_addr,
        master_port=args.master_port,
        headless=args.headless,
    )


def check_multi_node(args: argparse.Namespace) -> None:
    """vLLM's checks of the multi-node flags (`EngineArgs.create_engine_config`, `ParallelConfig`),
    with its messages; and the stand-in's own limit: one node spans GPUs only with Ray."""
    world = args.tensor_parallel_size * args.pipeline_parallel_size
    backend = args.distributed_executor_backend
    if args.nnodes < 1:
        raise SystemExit(f"vllm: --nnodes must be >= 1, got {args.nnodes}")
    if args.nnodes == 1:
        if args.headless:
            raise SystemExit("vllm (stand-in): --headless needs --nnodes > 1 (it joins a head's group)")
        if world > 1 and backend not in (None, "ray"):
            raise SystemExit(
                "vllm (stand-in): on one node only --distributed-executor-backend ray spans GPUs"
            )
        return
    if backend != "mp":
        raise SystemExit(
            "ValueError: nnodes > 1 can only be set when distributed executor backend is mp, uni or "
            f"external_launcher (stand-in: mp), got {backend}."
        )
    if world % args.nnodes:
        raise SystemExit(f"AssertionError: world_size={world} must be divisible by nnodes={args.nnodes}.")
    if not 0 <= args.node_rank < args.nnodes:
        raise SystemExit(
            f"AssertionError: node_rank={args.node_rank} must be less than nnodes={args.nnodes}."
        )
    if (args.node_rank > 0) != args.headless:
        # vLLM runs a rank > 0 headless whatever the flag says; the deployment always sets it, so a
        # mismatch here is a wrong command line worth failing on.
        raise SystemExit("vllm (stand-in): --headless goes with --node-rank > 0, and only with it")


def local_config(model: str, revision: str | None, env: dict[str, str] | None = None) -> dict[str, Any]:
    """The checkpoint's config.json from this node's own cache, as vLLM reads it with HF_HUB_OFFLINE=1.

    Raises SystemExit when it is not there: like vLLM offline, the stand-in never starts without it.
    """
    env = os.environ if env is None else env
    if model.startswith("/"):
        path = os.path.join(model, "config.json")
    else:
        if env.get("HF_HUB_OFFLINE") != "1":
            raise SystemExit(
                f"vllm (stand-in): HF_HUB_OFFLINE=1 is not set: {model} would be fetched from the Hub"
            )
        hub = os.path.join(env.get("HF_HOME") or os.path.expanduser("~/.cache/huggingface"), "hub")
        root = os.path.join(hub, "models--" + model.replace("/", "--"))
        commit = revision or "main"
        if not (len(commit) == 40 and all(c in "0123456789abcdef" for c in commit)):
            try:
                with open(os.path.join(root, "refs", commit)) as handle:
                    commit = handle.read().strip()
            except OSError:
                commit = ""
        path = os.path.join(root, "snapshots", commit, "config.json")
    try:
        with open(path) as handle:
            return json.load(handle)
    except (OSError, ValueError) as exc:
        raise SystemExit(
            f"vllm (stand-in): offline and {model}@{revision or 'main'} is not in this node's cache: "
            f"cannot read {path} ({exc.__class__.__name__})"
        ) from None


def leak(env: dict[str, str] | None = None) -> int | None:
    """Lower MemAvailable in the crafted meminfo (MEMINFO_ENV) by LEAK_ENV bytes; the new value."""
    env = os.environ if env is None else env
    path, amount = env.get(MEMINFO_ENV), int(env.get(LEAK_ENV) or 0)
    if not path or amount <= 0:
        return None
    with open(path, "r+") as handle:
        lines = handle.read().splitlines()
        left = None
        for i, line in enumerate(lines):
            key, _, value = line.partition(":")
            if key.strip() == "MemAvailable":
                left = max(int(value.split()[0]) - amount // 1024, 0)
                lines[i] = f"MemAvailable:   {left} kB"
        # In place (a bind-mounted file cannot be replaced by a rename).
        handle.seek(0)
        handle.write("\n".join(lines) + "\n")
        handle.truncate()
    log(f"leak: MemAvailable in {path} lowered by {amount} bytes to {left} kB (never given back)")
    return None if left is None else left * 1024


class Faults:
    """The fault a test asked for (FAULT_PATH): how late answers are, and whether to hang or crash."""

    def __init__(self) -> None:
        self.delay_s = 0.0
        self.health_delay_s = 0.0
        self.stop_s = 0.0  # slow_stop: how long after a SIGTERM the server exits (0: at once)
        self.held = b""  # oom: what the serving process took
        self.requests = 0

    def apply(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        mode = body.get("mode")
        if mode == "slow":
            self.delay_s = float(body.get("delay_s") or 0)
            self.health_delay_s = float(body.get("health_delay_s") or 0)
        elif mode == "hang":
            threading.Timer(0.2, lambda: os.kill(os.getpid(), signal.SIGSTOP)).start()
        elif mode == "crash":
            threading.Timer(0.2, lambda: os._exit(1)).start()
        elif mode == "slow_stop":
            self.stop_s = float(body.get("stop_s") or 45)
        elif mode == "oom":
            size = int(body.get("bytes") or 1 << 30)
            # As hang and crash: the fault's answer first. A daemon: a child's wait never holds up an exit.
            taker = threading.Timer(0.2, engine_core_takes if body.get("child") else self.take, args=(size,))
            taker.daemon = True
            taker.start()
        else:
            message = f"no fault mode {mode!r} (hang, crash, slow, slow_stop, oom)"
            return 400, error_body(message, "BadRequestError", 400)
        log(f"fault: {mode} {json.dumps(body)}")
        return 200, {"fault": mode, "standin": STANDIN_NOTE}

    def take(self, size: int) -> None:
        """The oom fault in the serving process: `size` bytes, every page written (so resident)."""
        self.held = b"\x01" * size


def engine_core_takes(size: int) -> None:
    """The oom fault in a child, as vLLM's engine core under its API server: the child takes `size`
    bytes and waits (at most 10 minutes); when it ends, killed or not, the server exits 1."""
    held = f"import time; held = b'\\x01' * {size}; time.sleep(600)"
    child = subprocess.Popen([sys.executable, "-c", held])
    code = child.wait()
    log(f"engine core (pid {child.pid}) ended with {code}: the API server exits, as vLLM's does")
    os._exit(1)


def metrics_text(faults: Faults, args: ServeArgs) -> str:
    """A few of vLLM's /metrics, in Prometheus text, marked as the stand-in's."""
    name = args.served_names[0]
    return (
        "# HELP vllm:num_requests_running Requests running (stand-in: always 0 between requests).\n"
        "# TYPE vllm:num_requests_running gauge\n"
        f'vllm:num_requests_running{{model_name="{name}"}} 0\n'
        "# HELP vllm_standin_requests_total Requests the stand-in answered.\n"
        "# TYPE vllm_standin_requests_total counter\n"
        f'vllm_standin_requests_total{{model_name="{name}"}} {faults.requests}\n'
    )


def cluster_summary(nodes: list[dict[str, Any]]) -> tuple[int, float, str]:
    """(alive nodes, GPUs on them, "ip: N GPU, …") from `ray.nodes()`."""
    alive = [n for n in nodes if n.get("Alive")]
    gpus = sum(float(n.get("Resources", {}).get("GPU", 0)) for n in alive)
    text = ", ".join(
        f"{n.get('NodeManagerAddress', '?')}: {float(n.get('Resources', {}).get('GPU', 0)):g} GPU"
        for n in alive
    )
    return len(alive), gpus, text or "none"


def bearer_ok(header: str | None, api_key: str | None) -> bool:
    """vLLM's rule: with an API key set, every /v1 route needs `Authorization: Bearer <key>`."""
    return api_key is None or header == f"Bearer {api_key}"


def prompt_text(messages: list[dict[str, Any]]) -> str:
    """The text of the last user message (content may be a string or a list of parts)."""
    for message in reversed(messages):
        if message.get("role") != "user":
            continue
        content = message.get("content", "")
        if isinstance(content, list):
            return " ".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
        return str(content)
    return ""


def models_response(args: ServeArgs, created: int) -> dict[str, Any]:
    """/v1/models, shaped like vLLM's, marked as a stand-in."""
    return {
        "object": "list",
        "data": [
            {
                "id": name,
                "object": "model",
                "created": created,
                "owned_by": "vllm-standin",
                "root": args.model,
                "parent": None,
                "max_model_len": args.max_model_len,
                "standin": STANDIN_NOTE,
            }
            for name in args.served_names
        ],
        "standin": STANDIN_NOTE,
    }


def completion_response(model: str, prompt: str, shards: list[str], max_tokens: int | None) -> dict[str, Any]:
    """A chat.completion built from what every Ray worker returned."""
    content = f"[{STANDIN_NOTE}] {len(shards)} Ray workers answered ({'; '.join(shards)}). You said: {prompt}"
    words = content.split()
    if max_tokens is not None and max_tokens > 0:
        words = words[: max(max_tokens, 1)]
    completion_tokens = len(words)
    prompt_tokens = len(prompt.split())
    return {
        "id": f"chatcmpl-standin-{uuid.uuid4().hex[:16]}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": " ".join(words)},
                "finish_reason": "stop",
                "logprobs": None,
            }
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
        "standin": STANDIN_NOTE,
    }


def error_body(message: str, kind: str, code: int) -> dict[str, Any]:
    return {"object": "error", "message": message, "type": kind, "code": code, "standin": STANDIN_NOTE}


class Engine:
    """The Ray side: placement group, one actor per bundle, and a liveness probe of those actors."""

    def __init__(self, args: ServeArgs):
        self.args = args
        self.actors: list[Any] = []
        self.dead_reason: str | None = None

    def start(self, clock: Callable[[], float] = time.monotonic) -> None:
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        address = os.environ.get("RAY_ADDRESS", "auto")
        log(f"connecting to the Ray cluster at {address}")
        ray.init(address=address, logging_level="WARNING", log_to_driver=False)
        world = self.args.world_size
        count, gpus, text = cluster_summary(ray.nodes())
        log(f"Ray cluster: {count} alive nodes, {gpus:g} GPUs ({text}); TP×PP = {world} needs {world} GPUs")
        if gpus < world:
            log(
                f"WARNING: the number of required GPUs ({world}) exceeds the total number of available "
                f"GPUs in the cluster ({gpus:g}); waiting for the placement group"
            )
        group = placement_group([{"GPU": 1.0} for _ in range(world)], strategy="PACK")
        started = clock()
        while True:
            ready, _ = ray.wait([group.ready()], timeout=PG_LOG_EVERY_S)
            if ready:
                break
            waited = clock() - started
            count, gpus, text = cluster_summary(ray.nodes())
            if waited > PG_WAIT_TIMEOUT_S:
                raise SystemExit(
                    f"vllm (stand-in): cannot provide a placement group of {world} GPU bundles within "
                    f"{PG_WAIT_TIMEOUT_S} s; the cluster has {count} nodes, {gpus:g} GPUs ({text})"
                )
            log(
                f"waiting for a placement group of {world} GPU bundles for {waited:.0f} s: the cluster "
                f"has {count} alive nodes, {gpus:g} GPUs ({text}); check `ray status`"
            )

        @ray.remote(num_cpus=0, num_gpus=1)
        class StandinWorker:
            """One "GPU worker": reports where it runs, which is all a stand-in can compute."""

            def __init__(self, rank: int, model: str, revision: str | None, here: str):
                self.rank = rank
                # Every node loads its shard from its own cache: no checkpoint there, no worker. The
                # stand-in's folder is the same in every node's image; Ray's worker lacks it on its path.
                sys.path.insert(0, here)
                from standin_vllm import local_config as read_local_config

                self.model_type = read_local_config(model, revision).get("model_type")

            def where(self) -> str:
                return f"rank {self.rank} on {ray.util.get_node_ip_address()} pid {os.getpid()}"

            def forward(self, words: int) -> str:
                return f"rank {self.rank}@{ray.util.get_node_ip_address()} read {words} words"

        self.actors = [
            StandinWorker.options(
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    placement_group=group, placement_group_bundle_index=index
                )
            ).remote(index, self.args.model, self.args.revision, os.path.dirname(os.path.abspath(__file__)))
            for index in range(world)
        ]
        for line in ray.get([actor.where.remote() for actor in self.actors], timeout=120):
            log(f"worker {line}")

    def call_all(self, words: int) -> list[str]:
        """Every actor's shard; the first failure marks the engine dead (and the server exits)."""
        import ray

        try:
            return ray.get([a.forward.remote(words) for a in self.actors], timeout=ACTOR_TIMEOUT_S)
        except Exception as exc:  # any Ray failure here means a worker is gone: vLLM's EngineDeadError
            self.dead_reason = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            raise


# ---- multi-node: vLLM's own executor (`--nnodes`, no Ray) -----------------------------------------------


def join_timeout(env: dict[str, str] | None = None) -> float:
    env = os.environ if env is None else env
    return float(env.get(JOIN_TIMEOUT_ENV) or JOIN_TIMEOUT_S)


def hello(args: ServeArgs) -> dict[str, Any]:
    """What a headless rank says when it joins: who it is, and the group it thinks it joins."""
    return {"node_rank": args.node_rank, "nnodes": args.nnodes, "world_size": args.world_size}


def judge_join(args: ServeArgs, message: dict[str, Any], joined: set[int]) -> str | None:
    """Why the head refuses a joining rank (vLLM/torch.distributed would fail the group), or None."""
    rank, world, nnodes = message.get("node_rank"), message.get("world_size"), message.get("nnodes")
    if world != args.world_size or nnodes != args.nnodes:
        return (
            f"RuntimeError: node rank {rank} joined with world_size={world} over nnodes={nnodes}, but "
            f"the head's group is world_size={args.world_size} over nnodes={args.nnodes}: every node "
            "must run the same --tensor-parallel-size, --pipeline-parallel-size and --nnodes"
        )
    if not isinstance(rank, int) or not 0 < rank < args.nnodes:
        return f"RuntimeError: node rank {rank!r} cannot join: headless ranks are 1..{args.nnodes - 1}"
    if rank in joined:
        return f"RuntimeError: node rank {rank} joined twice: two nodes were given the same --node-rank"
    return None


def rank_span(args: ServeArgs) -> str:
    return f"ranks {args.local_ranks.start}-{args.local_ranks.stop - 1}"


def peer_closed(conn: socket.socket) -> bool:
    """A readable connection with nothing to read (or reset): the process at the other end is gone."""
    try:
        return not conn.recv(1, socket.MSG_PEEK)
    except OSError:
        return True


def send_line(conn: socket.socket, message: dict[str, Any]) -> None:
    conn.sendall((json.dumps(message) + "\n").encode())


def read_line(conn: socket.socket, timeout: float | None) -> dict[str, Any] | None:
    """One JSON line from `conn`; None when the peer closed it (the process at the other end is gone)."""
    conn.settimeout(timeout)
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(65536)
        if not chunk:
            return None
        data += chunk
    return json.loads(data)


class RankGroup:
    """The head's side of the group: accept every headless rank, then ask them all for each answer."""

    def __init__(self, args: ServeArgs):
        self.args = args
        self.ranks: dict[int, socket.socket] = {}
        self.dead_reason: str | None = None
        self.lock = threading.Lock()

    def start(self, clock: Callable[[], float] = time.monotonic) -> None:
        """Listen on the master address and wait, within the join timeout, for ranks 1..nnodes-1."""
        args = self.args
        listener = socket.create_server((args.master_addr, args.master_port))
        deadline = clock() + join_timeout()
        log(
            f"head (node rank 0 of {args.nnodes}) waiting for {args.nnodes - 1} headless ranks on "
            f"{args.master_addr}:{args.master_port}; world_size={args.world_size}"
        )
        with listener:
            while len(self.ranks) < args.nnodes - 1:
                left = deadline - clock()
                if left <= 0 or not select.select([listener], [], [], min(left, 1.0))[0]:
                    if left <= 0:
                        self._never_joined()
                    continue
                conn, peer = listener.accept()
                self._admit(conn, peer, left)
        log(f"all {args.nnodes} nodes joined the process group (world_size={args.world_size})")

    def _admit(self, conn: socket.socket, peer: tuple, left: float) -> None:
        message = read_line(conn, left) or {}
        refusal = judge_join(self.args, message, set(self.ranks))
        if refusal:
            send_line(conn, {"ok": False, "error": refusal})
            raise SystemExit(f"vllm (stand-in): {refusal}")
        send_line(conn, {"ok": True})
        self.ranks[message["node_rank"]] = conn
        log(f"node rank {message['node_rank']} joined from {peer[0]}")

    def _never_joined(self) -> None:
        missing = sorted(set(range(1, self.args.nnodes)) - set(self.ranks))
        raise SystemExit(
            f"vllm (stand-in): TimeoutError: node ranks {missing} never joined the process group at "
            f"{self.args.master_addr}:{self.args.master_port} within {join_timeout():g} s; check that "
            "their containers run and reach the head's fabric address"
        )

    def call_all(self, words: int) -> list[str]:
        """The head's own shard and every rank's; a rank that is gone marks the engine dead."""
        shards = [f"node rank 0 ({rank_span(self.args)}) read {words} words"]
        with self.lock:
            for rank, conn in sorted(self.ranks.items()):
                try:
                    send_line(conn, {"op": "forward", "words": words})
                    answer = read_line(conn, ACTOR_TIMEOUT_S)
                except OSError as exc:
                    answer, why = None, f"{type(exc).__name__}: {exc}"
                else:
                    why = "connection closed"
                if answer is None:
                    self.dead_reason = f"node rank {rank} is gone ({why}): the process group is broken"
                    raise RuntimeError(self.dead_reason)
                shards.append(str(answer.get("shard")))
        return shards

    def watch(self, on_dead: Callable[[str], None], interval_s: float = 0.5) -> None:
        """Between requests, notice a rank whose connection closed (a rank sends nothing unasked)."""
        while self.dead_reason is None:
            time.sleep(interval_s)
            with self.lock:
                readable = select.select(list(self.ranks.values()), [], [], 0)[0]
                for rank, conn in self.ranks.items():
                    if conn in readable and peer_closed(conn):
                        self.dead_reason = f"node rank {rank} is gone: the process group is broken"
        on_dead(self.dead_reason)


def join_head(args: ServeArgs, clock: Callable[[], float] = time.monotonic) -> socket.socket:
    """A headless rank's side of the handshake: dial the head until the join timeout, then say hello."""
    deadline = clock() + join_timeout()
    address = (args.master_addr, args.master_port)
    while True:
        try:
            conn = socket.create_connection(address, timeout=5)
            break
        except OSError as exc:
            if clock() > deadline:
                raise SystemExit(
                    f"vllm (stand-in): TimeoutError: node rank {args.node_rank} could not reach the head at "
                    f"{address[0]}:{address[1]} within {join_timeout():g} s ({exc})"
                ) from None
            time.sleep(0.5)
    send_line(conn, hello(args))
    answer = read_line(conn, join_timeout()) or {"ok": False, "error": "the head closed the connection"}
    if not answer.get("ok"):
        raise SystemExit(
            f"vllm (stand-in): the head refused node rank {args.node_rank}: {answer.get('error')}"
        )
    return conn


def run_headless(args: ServeArgs) -> int:
    """A headless rank: no API server; answer the head's forward calls until the head is gone."""
    log(f"{STANDIN_NOTE}; headless node rank {args.node_rank} of {args.nnodes}, world_size={args.world_size}")
    config = local_config(args.model, args.revision)
    log(f"checkpoint config.json read from this node's cache: model_type {config.get('model_type')}")
    leak()
    conn = join_head(args)
    log(f"joined the head at {args.master_addr}:{args.master_port} as node rank {args.node_rank}")
    ranks = rank_span(args)
    while True:
        try:
            request = read_line(conn, None)
        except OSError:
            request = None
        if request is None and os.environ.get(REJOIN_ENV) == "1":
            log("the head closed the process group; dialling it again (stand-in rejoin mode)")
            conn = join_head(args)
            continue
        if request is None:
            log("ERROR: the head closed the process group; exiting")
            return 1
        shard = f"node rank {args.node_rank} ({ranks}) read {request.get('words')} words"
        send_line(conn, {"shard": shard})


def make_handler(
    args: ServeArgs, engine: Engine, on_dead: Callable[[str], None], faults: Faults | None = None
) -> type:
    created = int(time.time())
    faults = faults or Faults()

    class Handler(BaseHTTPRequestHandler):
        server_version = "vllm-standin"
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt: str, *values: Any) -> None:
            status = values[1] if len(values) > 1 else ""
            log(f'{self.client_address[0]} "{self.command} {self.path}" {status}')

        def reply(self, code: int, body: dict[str, Any] | None) -> None:
            data = b"" if body is None else json.dumps(body).encode()
            self.send_response(code)
            self.send_header(STANDIN_HEADER, "1")
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def engine_dead(self) -> None:
            reason = engine.dead_reason or "a Ray worker died"
            self.reply(500, error_body(f"EngineDeadError: {reason}", "EngineDeadError", 500))
            on_dead(reason)

        def authorized(self) -> bool:
            if bearer_ok(self.headers.get("Authorization"), args.api_key):
                return True
            self.reply(401, {"error": "Unauthorized", "standin": STANDIN_NOTE})
            return False

        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            path = self.path.split("?", 1)[0]
            faults.requests += 1
            if path == "/metrics":
                data = metrics_text(faults, args).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            elif path == "/health":
                time.sleep(faults.health_delay_s)
                try:
                    engine.call_all(0)
                except Exception:
                    self.engine_dead()
                    return
                self.reply(200, None)
            elif path == "/v1/models":
                if self.authorized():
                    self.reply(200, models_response(args, created))
            elif path == "/version":
                self.reply(200, {"version": "standin", "standin": STANDIN_NOTE})
            else:
                self.reply(404, error_body(f"no route {path}", "NotFoundError", 404))

        def do_POST(self) -> None:  # noqa: N802
            path = self.path.split("?", 1)[0]
            faults.requests += 1
            if path == FAULT_PATH:
                length = int(self.headers.get("Content-Length") or 0)
                try:
                    self.reply(*faults.apply(json.loads(self.rfile.read(length) or b"{}")))
                except ValueError:
                    self.reply(400, error_body("request body is not JSON", "BadRequestError", 400))
                return
            if path != "/v1/chat/completions":
                self.reply(404, error_body(f"no route {path}", "NotFoundError", 404))
                return
            if not self.authorized():
                return
            try:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            except ValueError:
                self.reply(400, error_body("request body is not JSON", "BadRequestError", 400))
                return
            model = body.get("model")
            if model not in args.served_names:
                message = f"The model `{model}` does not exist."
                self.reply(404, error_body(message, "NotFoundError", 404))
                return
            if body.get("stream"):
                self.reply(400, error_body("the stand-in does not stream", "BadRequestError", 400))
                return
            prompt = prompt_text(body.get("messages") or [])
            time.sleep(faults.delay_s)
            try:
                shards = engine.call_all(len(prompt.split()))
            except Exception:
                self.engine_dead()
                return
            self.reply(200, completion_response(model, prompt, shards, body.get("max_tokens")))

    return Handler


def serve(args: ServeArgs) -> int:
    shape = f"TP={args.tensor_parallel_size} PP={args.pipeline_parallel_size}"
    log(f"{STANDIN_NOTE}; vllm serve {args.model} {shape}")
    if args.ignored:
        log(f"flags the stand-in does not model (ignored): {' '.join(args.ignored)}")
    config = local_config(args.model, args.revision)
    log(f"checkpoint config.json read from this node's cache: model_type {config.get('model_type')}")
    leak()
    engine = RankGroup(args) if args.nnodes > 1 else Engine(args)
    engine.start()
    faults = Faults()
    server = ThreadingHTTPServer((args.host, args.port), make_handler(args, engine, lambda _: None, faults))
    exit_code = {"code": 0}

    def on_dead(reason: str) -> None:
        # Like vLLM: a dead engine shuts the API server down, so the container exits and logs say why.
        log(f"ERROR: engine dead ({reason}); shutting down the API server")
        exit_code["code"] = 1
        threading.Thread(target=server.shutdown, daemon=True).start()

    server.RequestHandlerClass = make_handler(args, engine, on_dead, faults)
    stopping = on_sigterm(server, faults)
    if isinstance(engine, RankGroup):
        # A headless rank that dies breaks the group (NCCL would abort): the head exits, not waits.
        threading.Thread(target=engine.watch, args=(on_dead,), daemon=True).start()
    log(f"Starting vLLM API server (stand-in) on http://{args.host}:{args.port}")
    log("Application startup complete.")
    try:
        server.serve_forever()
    finally:
        server.server_close()
    if stopping.is_set():
        time.sleep(faults.stop_s)  # the port is closed: /health is refused while it "drains"
        log(f"exiting {faults.stop_s:g} s after SIGTERM (fault slow_stop)")
    return exit_code["code"]


def on_sigterm(server: ThreadingHTTPServer, faults: Faults) -> threading.Event:
    """SIGTERM as Python's default (the process ends by the signal), unless the slow_stop fault is
    set: then the API server stops listening at once and `serve` exits `faults.stop_s` later. The
    event says which. Installed from the main thread (Python's rule for signal handlers)."""
    stopping = threading.Event()

    def handle(signum: int, frame: object) -> None:
        if not faults.stop_s:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
            return
        log(f"SIGTERM: closing the API server, exiting in {faults.stop_s:g} s (fault slow_stop)")
        stopping.set()
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, handle)
    return stopping


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_serve_args(argv)
    return run_headless(args) if args.headless else serve(args)


if __name__ == "__main__":
    sys.exit(main())
