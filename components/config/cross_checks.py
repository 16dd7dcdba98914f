"""The checks across sections of a StackConfig (one head, distinct names and addresses, ports that
do not collide, GPUs that match the parallelism, keys the chosen modes ignore): each a function of
the whole config returning `(path, problem)` pairs, all reported at once by its validator.
"""

from __future__ import annotations

import difflib
from typing import TYPE_CHECKING

from components.config.cluster import FLOOR_UNITS, Executor, RestartPolicy
from components.config.fields import CheckMode
from components.config.nodes import RAY_CLIENT_SERVER_PORT, RAY_DASHBOARD_AGENT_LISTEN_PORT, Role
from components.node_programs.wire import bench_prompt_slack

if TYPE_CHECKING:
    from components.config.stack import StackConfig


def cross_problems(config: StackConfig) -> list[tuple[str, str]]:
    """Every problem across sections, in the order they are reported."""
    problems = node_problems(config)
    problems += model_problems(config)
    problems += fabric_problems(config)
    problems += parallelism_problems(config)
    problems += mp_problems(config)
    problems += cpu_problems(config)
    problems += health_problems(config)
    problems += bench_problems(config)
    problems += answers_problems(config)
    return problems


def node_problems(config: StackConfig) -> list[tuple[str, str]]:
    """One head; no name, host or fabric address used twice; jump hosts that are nodes or user@host."""
    problems: list[tuple[str, str]] = []
    heads = [i for i, n in enumerate(config.nodes) if n.role == Role.HEAD]
    if len(heads) > 1:
        problems.append(("nodes", f"exactly one head allowed, found {len(heads)} (nodes {heads})"))
    if not heads and config.nodes[0].role == Role.WORKER:
        problems.append(
            ("nodes", "no node has role 'head' (and the first node is a worker): mark one `role: head`")
        )
    for attr in ("name", "host", "fabric_ip"):
        seen: dict[str, int] = {}
        for i, node in enumerate(config.nodes):
            value = getattr(node, attr)
            if value in seen:
                problems.append((f"nodes.{i}.{attr}", f"{value!r} is also used by nodes.{seen[value]}"))
            seen.setdefault(value, i)
    names = {n.name for n in config.nodes}
    for i, node in enumerate(config.nodes):
        if node.proxy_jump and node.proxy_jump == node.name:
            problems.append((f"nodes.{i}.proxy_jump", "a node cannot jump through itself"))
        elif node.proxy_jump and "@" not in node.proxy_jump and node.proxy_jump not in names:
            problems.append(
                (
                    f"nodes.{i}.proxy_jump",
                    f"{node.proxy_jump!r} is not a node name nor user@host[:port]",
                )
            )
    return problems


def model_problems(config: StackConfig) -> list[tuple[str, str]]:
    """`model.cache_dirs` names nodes of this stack; `source: cache` knows the repo it holds."""
    problems: list[tuple[str, str]] = []
    names = {n.name for n in config.nodes}
    for node in config.model.cache_dirs:
        if node not in names:
            hint = difflib.get_close_matches(node, sorted(names), n=1)
            problems.append(
                (
                    f"model.cache_dirs.{node}",
                    "not a node of this stack" + (f" (did you mean {hint[0]!r}?)" if hint else ""),
                )
            )
    if config.model.repo is None and config.model.source == "cache" and config.serve.model.startswith("/"):
        problems.append(
            ("model.repo", "source: cache needs the Hub repo id the cache holds (serve.model is a path)")
        )
    return problems


def parallelism_problems(config: StackConfig) -> list[tuple[str, str]]:
    """tensor_parallel_size × pipeline_parallel_size is every GPU of the nodes."""
    total_gpus = sum(n.gpus for n in config.nodes)
    need = config.serve.tensor_parallel_size * config.serve.pipeline_parallel_size
    if need == total_gpus:
        return []
    return [
        (
            "serve.tensor_parallel_size",
            f"tensor_parallel_size × pipeline_parallel_size = {need}, but the nodes have "
            f"{total_gpus} GPUs in all: make them equal",
        )
    ]


def fabric_problems(config: StackConfig) -> list[tuple[str, str]]:
    """The probe's port; a bus bandwidth floor only where a group forms; one HCA pin per node; the
    lab's fabric keys only where the check or the proof that reads them runs."""
    problems = probe_port_problems(config)
    if config.fabric.min_busbw_gbps is not None and len(config.nodes) < 2:
        problems.append(
            (
                "fabric.min_busbw_gbps",
                f"one node forms no group, so the node proof measures no bus bandwidth (the floor, in "
                f"{FLOOR_UNITS['min_busbw_gbps']}, is never compared): remove it",
            )
        )
    for i, node in enumerate(config.nodes):
        if node.ib_hca is not None and config.fabric.ib_hca is not None:
            problems.append(
                (
                    f"nodes.{i}.ib_hca",
                    "fabric.ib_hca (the old pin of every node) is set too: move it to each "
                    "node's nodes[].ib_hca and remove fabric.ib_hca",
                )
            )
        if node.host_root is not None and config.fabric.proof is CheckMode.OFF:
            problems.append(
                (
                    f"nodes.{i}.host_root",
                    "is read by the node proof only, and fabric.node_proof is off: remove it",
                )
            )
        if node.sysfs_root is not None and config.fabric.check is CheckMode.OFF:
            problems.append(
                (
                    f"nodes.{i}.sysfs_root",
                    "is read by FabricCheck only, and fabric.check is off: remove it",
                )
            )
    return problems


def probe_port_problems(config: StackConfig) -> list[tuple[str, str]]:
    """fabric.probe_port is none of the head's other ports: a container holding it would make the
    next probe (a drift repaired by `up`) fail as an unreachable head."""
    fabric = config.fabric
    if (fabric.check is CheckMode.OFF and fabric.proof is CheckMode.OFF) or len(config.nodes) < 2:
        return []
    port = config.fabric.probe_port
    rp = config.head.ray_ports
    taken = [key for key, value in head_ports(config).items() if value == port]
    ray = config.cluster.executor is Executor.RAY
    if ray and rp.min_worker_port and rp.max_worker_port and rp.min_worker_port <= port <= rp.max_worker_port:
        i = config.nodes.index(config.head)
        taken.append(
            f"inside nodes.{i}.ray_ports.min_worker_port–max_worker_port "
            f"({rp.min_worker_port}–{rp.max_worker_port})"
        )
    return [
        (
            "fabric.probe_port",
            f"{port} is {key} too: each worker's fabric probe and the node proof's group listen "
            "there on the head; choose another fabric.probe_port",
        )
        for key in taken
    ]


def head_ports(config: StackConfig) -> dict[str, int]:
    """The head's listening ports other than the probe's, by the key that sets each."""
    if config.cluster.executor is Executor.MP:
        return {"serve.port": config.serve.port, "cluster.master_port": config.cluster.master_port}
    ports = {
        "serve.port": config.serve.port,
        "ray.port": config.ray.port,
        "ray.dashboard_port": config.ray.dashboard_port,
    }
    for key, port in config.head.ray_ports.model_dump().items():
        if port is not None and key not in ("min_worker_port", "max_worker_port"):
            ports[f"nodes.{config.nodes.index(config.head)}.ray_ports.{key}"] = port
    # What Ray binds when config leaves it to Ray (the StackClaim claims these too).
    ports["Ray's client server port (fixed by Ray)"] = RAY_CLIENT_SERVER_PORT
    if config.head.ray_ports.dashboard_agent_listen_port is None:
        ports["Ray's default dashboard agent port (nodes[].ray_ports.dashboard_agent_listen_port)"] = (
            RAY_DASHBOARD_AGENT_LISTEN_PORT
        )
    return ports


def mp_problems(config: StackConfig) -> list[tuple[str, str]]:
    """Under executor mp: no Ray key is set (nothing would read it), and the world splits evenly
    over the nodes (vLLM gives every node the same number of local ranks)."""
    if config.cluster.executor is not Executor.MP:
        return []
    unused = "not used by cluster.executor 'mp' (no Ray runs): remove it, or set cluster.executor to 'ray'"
    problems = [("ray", unused)] if "ray" in config.model_fields_set else []
    if config.cluster.master_port == config.serve.port:
        problems.append(
            (
                "cluster.master_port",
                f"{config.cluster.master_port} is serve.port too: rank 0 listens on both on the head; "
                "choose another port",
            )
        )
    problems += [
        (f"nodes.{i}.ray_ports", unused)
        for i, n in enumerate(config.nodes)
        if "ray_ports" in n.model_fields_set
    ]
    if "ray_version" in config.image.model_fields_set:
        problems.append(("image.ray_version", unused))
    per_node = config.head.gpus
    problems += [
        (
            f"nodes.{i}.gpus",
            f"{n.name} has {n.gpus} GPUs but the head {config.head.name} has {per_node}: executor mp "
            "splits the world evenly over the nodes: give every node the same gpus",
        )
        for i, n in enumerate(config.nodes)
        if n.gpus != per_node
    ]
    return problems


def cpu_problems(config: StackConfig) -> list[tuple[str, str]]:
    """`serve.cpu` only where vLLM's CPU build serves: no GPU runtime, executor mp, known nodes."""
    cpu = config.serve.cpu
    if cpu is None:
        return []
    problems = []
    if config.containers.gpu_runtime:
        problems.append(
            ("serve.cpu", "is for vLLM's CPU build (the lab) and this stack runs GPUs "
             "(containers.gpu_runtime): remove serve.cpu")
        )  # fmt: skip
    if config.cluster.executor is not Executor.MP:
        problems.append(
            ("serve.cpu", "vLLM's CPU platform refuses the Ray executor: set cluster.executor to 'mp'")
        )
    names = sorted(n.name for n in config.nodes)
    for node in cpu.threads_bind:
        if node not in names:
            hint = difflib.get_close_matches(node, names, n=1)
            problems.append(
                (f"serve.cpu.threads_bind.{node}",
                 "not a node of this stack" + (f" (did you mean {hint[0]!r}?)" if hint else ""))
            )  # fmt: skip
    return problems


def health_problems(config: StackConfig) -> list[tuple[str, str]]:
    """The health ports against every other port the stack listens on; lab-only keys under off."""
    health = config.health
    problems = []
    if health.mode is CheckMode.OFF:
        problems += [
            (f"nodes.{i}.{key}", "is read by the health programs only, and health.mode is off: remove it")
            for i, n in enumerate(config.nodes)
            for key in ("docker_socket", "meminfo_path")
            if key in n.model_fields_set
        ]
        return problems
    if config.containers.restart is RestartPolicy.ALWAYS:
        # Docker starts an `always` container at every daemon start, even one stopped by hand: a
        # reboot would bring back a cluster the watchdog stopped for a spent budget.
        problems.append(
            (
                "containers.restart",
                "'always' restarts, at every reboot, the containers the watchdog stopped when its "
                "restart budget was spent: use unless-stopped (the default), or set health.mode to off",
            )
        )
    taken = {"serve.port": config.serve.port, "fabric.probe_port": config.fabric.probe_port}
    if config.cluster.executor is Executor.MP:
        taken["cluster.master_port"] = config.cluster.master_port
    else:
        taken["ray.port"] = config.ray.port
        taken["ray.dashboard_port"] = config.ray.dashboard_port
        for i, node in enumerate(config.nodes):
            for key, value in node.ray_ports.model_dump().items():
                if value is not None:
                    taken[f"nodes.{i}.ray_ports.{key}"] = value
    for key in ("port", "agent_port"):
        value = getattr(health, key)
        for other, used in taken.items():
            low_high = other.endswith(("min_worker_port", "max_worker_port"))
            if used == value and not low_high:
                problems.append((f"health.{key}", f"{value} is {other} too: choose another port"))
        for i, node in enumerate(config.nodes):
            low, high = node.ray_ports.min_worker_port, node.ray_ports.max_worker_port
            if config.cluster.executor is Executor.RAY and low and high and low <= value <= high:
                problems.append(
                    (f"health.{key}", f"{value} is in nodes.{i}.ray_ports' worker range {low}-{high}: "
                     "choose another port")
                )  # fmt: skip
    return problems


def bench_problems(config: StackConfig) -> list[tuple[str, str]]:
    """The bench's longest request (its prompt, or a short prompt and its output) fits
    `serve.max_model_len`, when that is set."""
    bench, limit = config.bench, config.serve.max_model_len
    if bench.mode is CheckMode.OFF or limit is None:
        return []
    # The prompt may come out up to its slack over prompt_tokens (the program sizes it to within
    # that), and 8 more for the nonce and the special tokens.
    requests = {
        "bench.prompt_tokens": bench.prompt_tokens + bench_prompt_slack(bench.prompt_tokens) + 8,
        "bench.output_tokens": bench.output_tokens + 32,
    }
    return [
        (
            key,
            f"a bench request of about {tokens} tokens exceeds serve.max_model_len {limit}: lower it",
        )
        for key, tokens in requests.items()
        if tokens > limit
    ]


def answers_problems(config: StackConfig) -> list[tuple[str, str]]:
    """The answer check's longest request (the long prompt, its generation and the chat
    template's few tokens) fits `serve.max_model_len`, when that is set."""
    answers, limit = config.answers, config.serve.max_model_len
    if answers.mode is CheckMode.OFF or limit is None:
        return []
    tokens = answers.long_prompt_tokens + answers.max_tokens + 64
    if tokens <= limit:
        return []
    return [
        (
            "answers.long_prompt_tokens",
            f"the long prompt and its generation, about {tokens} tokens, exceed serve.max_model_len "
            f"{limit}: lower it",
        )
    ]
