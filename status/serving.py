"""The serving rows: the Ray cluster (none under executor mp), the server as a client sees it, the
concurrency expected and logged, and the last cold start."""

from __future__ import annotations

import json
from typing import Any

from components.config import Executor, StackConfig
from components.layout import memory_inputs, node_container_names
from components.model_support import serve_memory
from components.model_support.memory_fit import NodeMemory, memory_fit, model_shape
from components.node_programs.cold_start import summary as cold_start_summary
from components.node_programs.readiness import parse_alive_ips, parse_ray_status
from components.ray_cluster import head_container_name
from status.problem import OK, Problem, first_line, timestamp


def judge_ray(config: StackConfig, cluster: dict, head_report: dict) -> list[Problem]:
    if config.cluster.executor is Executor.MP:
        cluster["ray"] = "none (cluster.executor mp: vLLM's own multi-node executor)"
        return []
    ray = head_report.get("ray")
    if not head_report.get("reachable") or ray is None:
        cluster["ray"] = "not checked (head unreachable or its Docker down)"
        return []
    head_ray = (head_report.get("containers") or {}).get(head_container_name(config)) or {}
    if head_ray.get("state") != "running":
        # Already a problem of the head's: its Ray container is missing or not running.
        cluster["ray"] = "not checked (the Ray head container is not running)"
        return []
    if ray.get("error") or not ray.get("status"):
        cluster["ray"] = f"no answer: {first_line(ray.get('error'))}"
        return [
            Problem(
                config.head.name,
                f"`ray status` in the Ray head container failed: {first_line(ray.get('error'))}",
                "see the head's container above; `docker logs` of the Ray head on the head node",
            )
        ]
    snapshot = parse_ray_status(ray["status"])
    live = _live_ray(ray.get("nodes_json") or "")
    alive = live[0] if live else None
    # `ray status` prints the autoscaler monitor's snapshot, rewritten every 5 s; `ray list nodes` is
    # the GCS node table. Just after a node joins they disagree: the table is the fact.
    nodes = live[1] if live else snapshot.nodes
    gpus = live[2] if live and live[2] is not None else snapshot.gpus
    want_nodes, want_gpus = len(config.nodes), sum(n.gpus for n in config.nodes)
    cluster["ray"] = f"{nodes}/{want_nodes} nodes, {gpus:g}/{want_gpus} GPUs"
    if (snapshot.nodes, snapshot.gpus) != (nodes, gpus):
        cluster["ray"] += (
            f" (ray status settling: its last snapshot shows {snapshot.nodes}/{want_nodes} nodes, "
            f"{snapshot.gpus:g}/{want_gpus} GPUs)"
        )
    if nodes >= want_nodes and gpus >= want_gpus:
        return []
    problems = []
    missing = [n for n in config.nodes if alive is not None and n.fabric_ip not in alive]
    for node in missing:
        problems.append(
            Problem(
                node.name,
                f"has not joined the Ray cluster (no ALIVE Ray node at {node.fabric_ip})",
                f"check `docker logs {node_container_names(config)[node.name][0]}` on it, the fabric "
                "addresses and its socket interface (`nodes[].socket_ifname`, else `fabric.socket_ifname`)",
            )
        )
    if not missing:
        problems.append(
            Problem(
                "cluster",
                f"Ray reports {nodes}/{want_nodes} nodes and {gpus:g}/{want_gpus} GPUs",
                "check each node's `gpus` against `ray status` in the Ray head, and the Ray containers' logs",
            )
        )
    return problems


def _live_ray(nodes_json: str) -> tuple[set[str], int, float | None] | None:
    """From `ray list nodes --format json`: the ALIVE nodes' addresses, how many there are, and their
    GPUs (None when a row carries no resources); None when there is no list."""
    try:
        alive = parse_alive_ips(nodes_json)
        rows = [r for r in json.loads(nodes_json) if isinstance(r, dict) and r.get("state") == "ALIVE"]
    except (ValueError, TypeError):
        return None
    totals = [r.get("resources_total") for r in rows]
    if not rows or not all(isinstance(t, dict) for t in totals):
        return alive, len(rows), None
    return alive, len(rows), float(sum(float(t.get("GPU") or 0) for t in totals))


def judge_server(cluster: dict, server: dict, server_name: str) -> list[Problem]:
    if not server:
        return []
    problems = []
    url = server.get("url", "")
    health, models, completion = (server.get(k) or {} for k in ("health", "models", "completion"))
    cluster["health"] = OK if health.get("ok") else f"failed: {health.get('error')}"
    if not health.get("ok"):
        cluster["models"] = cluster["completion"] = "not checked (/health failed)"
        problems.append(
            Problem(
                "cluster",
                f"{url}/health failed: {str(health.get('error')).removeprefix(f'{url}/health: ')}",
                f"read `docker logs {server_name}` on the head; a crashed engine: `pulumi up --refresh "
                f"--replace <urn of {server_name}>`",
            )
        )
        return problems
    if models.get("rejected"):
        cluster["models"] = "API key required" if not completion.get("tried", True) else "API key rejected"
    else:
        cluster["models"] = OK if models.get("ok") else f"failed: {models.get('error')}"
    if models.get("rejected") and completion.get("tried", True):
        problems.append(
            Problem(
                "cluster",
                f"{url}/v1/models rejected the API key",
                "give the server's key: `pulumi config set --secret qwen35-spark:api_key …` or "
                "$QWEN35_API_KEY",
            )
        )
    elif not models.get("ok") and not models.get("rejected"):
        problems.append(
            Problem("cluster", f"{url}/v1/models: {models.get('error')}", "check serve.served_model_name")
        )
    if not completion.get("tried", True):
        cluster["completion"] = f"not tried: {completion.get('why')}"
    elif completion.get("ok"):
        cluster["completion"] = (
            f"{completion['latency_s']:.2f} s, {completion['tokens']} tokens, "
            f"{completion.get('tokens_per_s')} tokens/s"
        )
    else:
        cluster["completion"] = f"failed: {completion.get('error') or 'rejected'}"
        if not completion.get("rejected"):
            problems.append(
                Problem(
                    "cluster",
                    f"one chat completion failed: {completion.get('error')}",
                    f"read `docker logs {server_name}` on the head",
                )
            )
    return problems


def expected_concurrency(config: StackConfig, sizing: dict[str, Any]) -> tuple[int, float] | None:
    """(max_model_len, requests of that length the KV cache holds), from the head's config.json and
    the stack, as the model-support check computes it (model_support/memory_fit.py); None if unsized."""
    shape = model_shape(sizing["config"]) if isinstance(sizing.get("config"), dict) else None
    if shape is None or not isinstance(sizing.get("weight_bytes"), int):
        return None
    memory = memory_inputs(config)
    nodes = [NodeMemory(n["name"], n["memory_gb"], n["gpus"]) for n in memory["nodes"]]
    fit = memory_fit(
        sizing["weight_bytes"],
        nodes,
        config.serve.tensor_parallel_size,
        config.serve.pipeline_parallel_size,
        config.serve.gpu_memory_utilization,
        shape=shape,
        serve=serve_memory(memory),
    )
    if fit.kv is None or fit.max_concurrency is None:
        return None
    return fit.kv.max_model_len, fit.max_concurrency


def concurrency_line(config: StackConfig, head_report: dict) -> str:
    """Expected maximum concurrency at max_model_len, beside what the server logged at start-up."""
    logged = head_report.get("server_concurrency") or {}
    if config.serve.cpu is not None:
        # vLLM's CPU platform sizes its KV cache from VLLM_CPU_KVCACHE_SPACE, not from a share of the
        # nodes' memory: the memory fit's figure (the lab's 566974.07x) would mean nothing there.
        space = config.serve.cpu.kvcache_space_gb
        parts = [
            f"expected: as the KV cache serve.cpu.kvcache_space_gb gives ({space} GiB per rank; "
            "the memory fit does not apply)"
        ]
    else:
        expected = expected_concurrency(config, head_report.get("sizing") or {})
        parts = [f"expected {expected[1]:.2f}x at {expected[0]} tokens" if expected else "expected: unknown"]
    if logged:
        parts.append(f"vLLM logged {logged['max_concurrency']:.2f}x at {logged['max_model_len']} tokens")
    return "; ".join(parts)


def cold_start_line(recorded: dict[str, Any], watched: Any, now: Any) -> str:
    """The `cold start` row: the server's last start as measured, the newest of the readiness gate's
    (the stack output `cold_start`, with the first completion it waited for) and the watchdog's (a
    restart `up` did not see)."""
    gate = recorded.get("output") if isinstance(recorded.get("output"), dict) else None
    watchdog = watched if isinstance(watched, dict) and watched.get("started_at") else None
    if gate is not None and gate.get("error"):
        gate = None
    if gate is None and watchdog is None:
        why = recorded.get("error") or (recorded.get("output") or {}).get("error") or "not recorded"
        return f"not measured ({first_line(why)})"
    newest, by = (gate, "the readiness gate of `pulumi up`")
    if watchdog is not None and (gate is None or watchdog["started_at"] > (gate.get("started_at") or 0)):
        newest, by = (watchdog, "the watchdog")
    when = timestamp(newest.get("started_at"), now)
    if newest.get("error"):
        return f"not measured ({first_line(newest['error'])}); started {when}, read by {by}"
    return f"{cold_start_summary(newest)}; started {when}, measured by {by}"
