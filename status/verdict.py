"""Judging `status` facts against the stack's declaration. Pure: facts in, cells and problems out.

Each problem names the node (or `cluster`), what is wrong, and the next step, in the words of the
troubleshooting and drift rows in docs/troubleshooting.md.
"""

from __future__ import annotations

import datetime
import json
from dataclasses import asdict, dataclass, field
from typing import Any

from components.answer_check import summary_line as answers_summary
from components.config import (
    AnswersMode,
    BenchMode,
    Executor,
    FabricCheckMode,
    HealthMode,
    ImageStrategy,
    NodeConfig,
    StackConfig,
)
from components.fabric_check import FabricCheckError, decide, node_facts, settings
from components.fabric_check.plan import Decision, floor_warning
from components.health.containers import watchdog_container_name
from components.layout import fabric_check_inputs, memory_inputs, node_container_names
from components.model_support import serve_memory
from components.model_support.memory_fit import NodeMemory, memory_fit, model_shape
from components.mp_executor import mp_container_name, node_rank
from components.node_programs.cold_start import summary as cold_start_summary
from components.node_programs.gpu_memory import COUNTED, DROP_CACHES
from components.node_programs.health_wire import gb
from components.node_programs.readiness import parse_alive_ips, parse_ray_status
from components.ray_cluster import head_container_name, worker_container_name
from components.serve_bench import figures_line, shortfalls
from components.vllm_server import vllm_container_name

OK = "ok"


@dataclass(frozen=True)
class Problem:
    """One way the cluster differs from its declaration, and what to do about it."""

    node: str
    what: str
    next: str

    def line(self) -> str:
        return f"{self.node}: {self.what}\n  next: {self.next}"


@dataclass
class Verdict:
    """Per-node cells (column -> text), cluster cells, operations in flight, and every problem."""

    nodes: dict[str, dict[str, str]] = field(default_factory=dict)
    cluster: dict[str, str] = field(default_factory=dict)
    operations: list[dict[str, Any]] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    # image.keep_previous, and the replaced images each node keeps for a rollback.
    retention: dict[str, Any] = field(default_factory=dict)
    # FabricCheck on: one line per node (ports, GID, MTU, the last measured speed).
    fabric: dict[str, str] = field(default_factory=dict)
    # What is worth a look but is not a difference from the declaration (a slow link): exit 0.
    warnings: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "nodes": self.nodes,
            "cluster": self.cluster,
            "operations": self.operations,
            "problems": [asdict(p) for p in self.problems],
            "retention": self.retention,
            "fabric": self.fabric,
            "warnings": [asdict(w) for w in self.warnings],
        }


def judge(config: StackConfig, facts: dict[str, Any]) -> Verdict:
    """The verdict on gathered facts (`status.gather.gather`) for this stack."""
    verdict = Verdict()
    head_report = facts["nodes"].get(config.head.name, {})
    containers = node_container_names(config)
    verdict.retention = {
        "keep_previous": config.image.keep_previous,
        "previous": {
            n.name: list(((facts["nodes"].get(n.name) or {}).get("image") or {}).get("previous") or [])
            for n in config.nodes
        },
    }
    for node in config.nodes:
        _judge_node(config, node, facts["nodes"].get(node.name), head_report, containers[node.name], verdict)
    found: dict[str, str] = {}
    warned: list[Problem] = []
    verdict.problems += _fabric(config, verdict.nodes, facts["nodes"], found, warned)
    if config.fabric.check is not FabricCheckMode.OFF:
        verdict.fabric, slow = fabric_lines(config, facts, found)
        verdict.warnings = warned + slow
    if config.fabric.proof is not FabricCheckMode.OFF:
        verdict.cluster["node proof"], recorded = proof_line(facts.get("fabric_output") or {})
        verdict.warnings += recorded
    if len(config.nodes) > 1 and "fabric_output" in facts:
        verdict.cluster["serving transport"], refused = serving_line(facts["fabric_output"])
        verdict.warnings += refused
    verdict.problems += _ray(config, verdict.cluster, head_report)
    verdict.problems += _server(verdict.cluster, facts.get("server") or {}, vllm_container_name(config))
    verdict.cluster["concurrency"] = _concurrency(config, head_report)
    verdict.problems += _watchdog(config, verdict.cluster, head_report)
    if config.answers.mode is not AnswersMode.OFF:
        verdict.cluster["answers"], refused = answers_line(config, facts.get("answers_output") or {})
        verdict.warnings += refused
    if config.bench.mode is not BenchMode.OFF:
        verdict.cluster["bench"], slow = bench_line(config, facts.get("bench_output") or {})
        verdict.warnings += slow
    if "cold_start_output" in facts:
        watched = ((head_report.get("watchdog") or {}).get("state") or {}).get("cold_start")
        verdict.cluster["cold start"] = cold_start_line(
            facts["cold_start_output"], watched, head_report.get("now")
        )
    return verdict


def _judge_node(
    config: StackConfig,
    node: NodeConfig,
    report: dict | None,
    head_report: dict,
    containers: list[str],
    verdict: Verdict,
) -> None:
    """One node's cells, its problems and its operations in flight, added to `verdict`."""
    head = config.head.name
    report = report or {"reachable": False, "error": "not asked"}
    cells: dict[str, str] = {"role": "head" if node.name == head else "worker"}
    verdict.nodes[node.name] = cells
    problems = verdict.problems
    if not report.get("reachable"):
        cells["ssh"] = "unreachable"
        problems.append(
            Problem(
                node.name,
                f"not reachable over SSH: {_first_line(report.get('error'))}",
                "the node or its jump host is down, or the key is refused: `ssh` to it by hand "
                "with the stack's user, key and known_hosts",
            )
        )
        return
    if report.get("error"):
        cells["ssh"] = OK
        cells["docker"] = f"unknown: {report['error']}"
        problems.append(Problem(node.name, report["error"], "run `python3 -V` on the node (3.8+ needed)"))
        return
    cells["ssh"] = OK
    problems += _docker(config, node, cells, report, head_report.get("image") or {}, containers)
    gpus = report.get("gpus") or {}
    problems += _gpus(node.name, node.gpus, config.containers.gpu_runtime, cells, gpus)
    checkpoint = report.get("checkpoint") or {}
    head_checkpoint = head_report.get("checkpoint") or {}
    problems += _checkpoint(node.name, cells, checkpoint, head_checkpoint, node.name == head)
    for operation in report.get("progress") or []:
        verdict.operations.append({"on": node.name, **operation})


def _docker(
    config: StackConfig, node: NodeConfig, cells: dict, report: dict, head_image: dict, containers: list[str]
) -> list[Problem]:
    """A reachable node's Docker: its daemon and image store, then its image and containers."""
    docker = report.get("docker") or {}
    if not docker.get("ok"):
        cells["docker"] = f"down: {_first_line(docker.get('error'))}"
        return [
            Problem(
                node.name,
                f"Docker does not answer: {_first_line(docker.get('error'))}",
                "start the daemon (`systemctl status docker` on the node) and check the SSH user may use it",
            )
        ]
    problems: list[Problem] = []
    cells["docker"] = f"{docker.get('version')} {docker.get('store')}"
    if docker.get("store") != node.image_store:
        problems.append(
            Problem(
                node.name,
                f"its Docker uses the {docker.get('store')} image store, but the stack declares "
                f"{node.image_store}",
                "set nodes[].image_store to what the node runs (`docker info`)",
            )
        )
    problems += _image(
        node.name,
        cells,
        report.get("image") or {},
        head_image,
        node.name == config.head.name,
        config.image.strategy,
    )
    problems += _containers(node.name, cells, report, containers, worker_ray=worker_container_name(config))
    if config.cluster.executor is Executor.MP:
        problems += _rank(config, node, cells, report)
    return problems


def _when(at: Any, now: Any) -> str:
    """`2026-12-02 01:23 UTC (12m05s ago)`: a watchdog's timestamp for a person."""
    if not isinstance(at, int | float):
        return "at an unknown time"
    text = datetime.datetime.fromtimestamp(at, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return f"{text} ({duration(now - at)} ago)" if isinstance(now, int | float) and now >= at else text


def _watchdog(config: StackConfig, cluster: dict, head_report: dict) -> list[Problem]:
    """The `watchdog` line from the head's watchdog /state, with the next step for each verdict."""
    if config.health.mode is HealthMode.OFF:
        cluster["watchdog"] = "off (health.mode off: nothing watches the server after `up`)"
        return []
    head, name = config.head.name, watchdog_container_name(config)
    fact = head_report.get("watchdog")
    if not head_report.get("reachable") or fact is None:
        cluster["watchdog"] = "not checked (head unreachable or its Docker down)"
        return []
    container = (head_report.get("containers") or {}).get(name) or {"present": False}
    if not container.get("present"):
        # The head's containers already say it is missing, and that `pulumi up --refresh` creates it.
        cluster["watchdog"] = "not deployed; next: `pulumi up` declares it after the readiness gate"
        return []
    if container.get("state") != "running":
        cluster["watchdog"] = f"not running (container {container.get('state')}); next: see {name} above"
        return []
    if fact.get("error"):
        cluster["watchdog"] = f"no answer: {_first_line(fact['error'])}"
        return [
            Problem(
                head,
                f"the watchdog runs but does not answer /state: {_first_line(fact['error'])}",
                f"read `docker logs {name}` on {head}; health.port and health.metrics_host must be this "
                "node's own",
            )
        ]
    state = fact.get("state") or {}
    # An agent whose clock is beyond the signature window refuses every request: the watchdog names it.
    skewed = [
        Problem("cluster", str(said), "synchronise the nodes' clocks (chrony or systemd-timesyncd)")
        for said in state.get("clock_skew") or []
    ]
    now = head_report.get("now")
    problems = _watchdog_state(config, cluster, state, now) + skewed + _guard_trips(config, state, now)
    fault = (state.get("last_diagnosis") or {}).get("fault") or {}
    if fault.get("says") and state.get("state") in ("recovering", "budget_spent", "memory_held", "failing"):
        # A memory or GPU fault, not a plain crash: the diagnosis read Docker's OOMKilled and the kernel.
        cluster["watchdog"] += f"; {fault.get('kind')} fault"
        problems.append(
            Problem(
                "cluster",
                f"the watchdog's last diagnosis names a {fault.get('kind')} fault: {fault['says']}",
                _FAULT_NEXT.get(str(fault.get("kind")), "read the watchdog's /state `last_diagnosis`"),
            )
        )
    return problems


_FAULT_NEXT = {
    "memory": "unified memory ran out: lower serve.gpu_memory_utilization or serve.max_num_seqs, or find "
    "what else holds memory on that node (`free -g`, `ps aux --sort=-rss | head`)",
    "gpu": "a GPU fault (NVRM Xid): read `dmesg | grep -i xid` on that node; Xid 79 (fallen off the bus) and "
    "ECC errors need a reboot, and a repeat needs NVIDIA support",
}


def _guard_trips(config: StackConfig, state: dict, now: Any) -> list[Problem]:
    """Each node's memory guard trip within the budget's window (all of them when the time is unknown)."""
    problems = []
    for node, trip in sorted((state.get("memory_guard") or {}).items()):
        at = trip.get("at") if isinstance(trip, dict) else None
        if isinstance(at, int | float) and isinstance(now, int | float) and now - at > config.health.window_s:
            continue
        done = "stopped" if trip.get("acted") else "would have stopped (report mode)"
        problems.append(
            Problem(
                node,
                f"the memory guard {done} the serving containers {_when(at, now)}: {trip.get('message')}",
                f"find what held {node}'s memory (the watchdog's /state `last_diagnosis`: kernel OOM "
                "kills, OOMKilled); the watchdog restarts the cluster within its budget; "
                "health.memory_floor_gb sets the floor",
            )
        )
    return problems


def _watchdog_state(config: StackConfig, cluster: dict, state: dict, now: Any) -> list[Problem]:
    """The `watchdog` line for the state a running watchdog answered, and its problem if any."""
    verdict = state.get("state")
    mode = state.get("mode") or config.health.mode.value
    budget = state.get("budget_left")
    left = f"budget {budget}/{config.health.max_restarts} left" if isinstance(budget, int | float) else ""
    said = str(state.get("next_step") or "").strip()
    if verdict == "healthy":
        parts = [p for p in (f"mode {mode}", left) if p]
        would = state.get("would")
        if would:
            parts.append(
                f"report mode would have {str(would.get('step', '')).replace('_', ' ')} "
                f"({would.get('reason')}) {_when(would.get('at'), now)}"
            )
        cluster["watchdog"] = f"healthy ({', '.join(parts)})"
        return []
    if verdict == "starting":
        cluster["watchdog"] = f"starting ({said or 'no verdict before the server is first ready'})"
        return []
    if verdict == "failing":
        failures, what = state.get("consecutive_failures"), "probes"
        if state.get("consecutive_completion_failures"):  # /health passes; the completions do not
            failures, what = state["consecutive_completion_failures"], "completions"
        cluster["watchdog"] = f"failing ({failures} of {config.health.failures} {what} in a row; {said})"
        return []
    if verdict == "recovering":
        step = str(state.get("step") or "?")
        cluster["watchdog"] = f"recovering ({step.replace('_', ' ')}, {left})"
        return [
            Problem(
                "cluster",
                f"the watchdog is recovering the server: step {step} since {_when(state.get('since'), now)}",
                said or f"wait: each restart gets health.ready_s ({config.health.ready_s:g} s) to be ready",
            )
        ]
    if verdict == "budget_spent":
        spent = state.get("spent") or {}
        when = _when(spent.get("at"), now)
        cluster["watchdog"] = f"budget spent {when}: {spent.get('why') or 'no reason recorded'}"
        return [
            Problem(
                "cluster",
                f"the watchdog spent its restart budget {when} and stopped the server and the cluster: "
                f"{spent.get('why') or 'no reason recorded'}",
                said
                or "find the cause (its /state `last_diagnosis`), then `pulumi up --refresh` starts the "
                "containers again; the watchdog sees them running and resets its budget",
            )
        ]
    if verdict == "memory_held":
        return _memory_held(cluster, state.get("held") or {})
    cluster["watchdog"] = f"{verdict or 'unknown'} ({said or 'no next step given'})"
    return []


def _memory_held(cluster: dict, held: dict) -> list[Problem]:
    """A watchdog that held off a restart: a node's MemAvailable below what the memory fit needs."""
    node = held.get("node") or "a node"
    message = held.get("message") or f"{node}: MemAvailable below what the memory fit needs"
    cluster["watchdog"] = f"memory held on {node}: {_figures(held)}"
    rule = held.get("rule")
    if isinstance(rule, dict):  # vLLM's start-up rule refused the node (the image's own figures)
        if rule.get("page_cache"):
            step = f"free {node}'s page cache: `{DROP_CACHES}` there, then `pulumi up --refresh`"
        else:
            step = (
                f"find what holds {node}'s memory (`nvidia-smi`, `docker ps`) or reboot it, or lower "
                "serve.gpu_memory_utilization; then `pulumi up --refresh`"
            )
    elif held.get("available_bytes") is None:  # not read at all: the node or its agent is the matter
        step = (
            f"check {node} and its health agent (`docker logs <prefix>-health-agent` there): its "
            "MemAvailable could not be read; once it answers, `pulumi up --refresh`"
        )
    else:
        step = f"reboot {node} (unified memory is only given back by a reboot), then `pulumi up --refresh`"
    return [Problem(node, f"the watchdog did not restart the server: {message}", step)]


def _figures(held: dict) -> str:
    """`MemAvailable 61.0 GB, 70.0 GB needed` from a watchdog's `held`."""
    rule = held.get("rule")
    if isinstance(rule, dict) and isinstance(rule.get("free_bytes"), int):
        counted = COUNTED.get(str(rule.get("free_from")), "")
        return (
            f"{gb(rule['free_bytes'])} free {counted}, {gb(rule['requested_bytes'])} vLLM requests "
            f"(gpu_memory_utilization {rule.get('utilization')})"
        )
    available, need = held.get("available_bytes"), held.get("need_bytes")
    if not isinstance(available, int | float) or not isinstance(need, int | float):
        return str(held.get("message") or "figures unknown")
    return f"MemAvailable {gb(available)}, {gb(need)} needed"


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


def _concurrency(config: StackConfig, head_report: dict) -> str:
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


def _first_line(text: Any) -> str:
    lines = str(text or "").strip().splitlines()
    return lines[0] if lines else "no reason given"


def _short(image_id: str) -> str:
    return image_id.removeprefix("sha256:")[:12]


def _missing_image_step(ref: str, strategy: ImageStrategy, is_head: bool, head_has_it: bool) -> str:
    """Where a missing image comes from: the head's is the operator's (prebuilt) or the build's
    (hybrid); a worker's is copied from the head, once the head has it."""
    if is_head and strategy == ImageStrategy.PREBUILT:
        return (
            f"strategy prebuilt uses the head's image as is: put it there (`docker pull {ref}` on the "
            "head, `docker load`, or the community build script), then `pulumi up` copies it to the workers"
        )
    if is_head:
        return (
            "`pulumi up` builds it on the head (strategy hybrid) and copies it to the workers; a stack "
            "that built it before does not see it gone: `pulumi up --replace` the URN of its `-build` "
            "resource (`pulumi stack --show-urns`)"
        )
    copy = "`pulumi up --refresh` copies it back (only missing layers) and replaces the node's containers"
    return copy if head_has_it else f"once the head has it (its step above), {copy}"


def _image(
    node: str, cells: dict, image: dict, head_image: dict, is_head: bool, strategy: ImageStrategy
) -> list[Problem]:
    ref = image.get("ref", "?")
    if not image.get("present"):
        cells["image"] = "missing"
        why = f" ({_first_line(image['error'])})" if image.get("error") else ""
        step = _missing_image_step(ref, strategy, is_head, bool(head_image.get("present")))
        return [Problem(node, f"the deployment image {ref} is missing{why}", step)]
    cells["image"] = _short(image.get("id", ""))
    if is_head or not head_image.get("present"):
        return []
    # Across image stores the IDs differ for the same image: the layer lists (diff IDs) are the truth.
    mine, theirs = list(image.get("layers") or []), list(head_image.get("layers") or [])
    if mine == theirs:
        cells["image"] += " = head"
        return []
    differ = sum(1 for i in range(max(len(mine), len(theirs))) if mine[i : i + 1] != theirs[i : i + 1])
    cells["image"] += " != head"
    return [
        Problem(
            node,
            f"the deployment image {ref} differs from the head's ({differ} of {len(theirs)} layers differ)",
            "`pulumi up --refresh`: refresh records the node's image, and up copies the head's (only the "
            "layers that differ) and replaces the node's containers",
        )
    ]


def duration(seconds: Any) -> str:
    """`45s`, `12m05s`, `3h07m`, `2d04h`: an uptime at a glance."""
    if not isinstance(seconds, int | float):
        return "?"
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def _containers(node: str, cells: dict, report: dict, names: list[str], worker_ray: str) -> list[Problem]:
    problems = []
    shown = []
    image_id = (report.get("image") or {}).get("id")
    for name in names:
        fact = (report.get("containers") or {}).get(name) or {"present": False}
        if not fact.get("present"):
            shown.append(f"{name} missing")
            again = "`pulumi up --refresh` creates it again"
            if name == worker_ray:
                # The drift table's row: the engine must re-form its TP group with the new worker.
                again += "; also `--replace` the server's URN so the engine re-forms its TP group"
            problems.append(Problem(node, f"container {name} does not exist", again))
            continue
        state, restarts = fact.get("state"), fact.get("restarts", 0)
        text = f"{name} {state}"
        if state == "running":
            text += f" {duration(fact.get('uptime_s'))}"
        else:
            text += f" (exit {fact.get('exit_code')})"
        if restarts:
            text += f" restarts={restarts}"
        shown.append(text)
        if state != "running":
            problems.append(
                Problem(
                    node,
                    f"container {name} is {state} (exit code {fact.get('exit_code')}, {restarts} restarts)",
                    f"read `docker logs {name}` on {node}, fix the cause, then `pulumi up --refresh` "
                    "starts it again",
                )
            )
        elif image_id and fact.get("image") and fact["image"] != image_id:
            problems.append(
                Problem(
                    node,
                    f"container {name} runs image {_short(fact['image'])}, not the deployment image "
                    f"({_short(image_id)})",
                    "`pulumi up --refresh` replaces it with one on the deployment image",
                )
            )
    cells["containers"] = "; ".join(shown) or "-"
    return problems


def _rank(config: StackConfig, node: NodeConfig, cells: dict, report: dict) -> list[Problem]:
    """Executor mp: the node's rank in the world, as its vLLM container runs it (its own `--node-rank`)
    against the one the stack gives it. A missing container is already a problem of `_containers`."""
    declared = str(node_rank(config, node))
    name = mp_container_name(config, node)
    actual = ((report.get("containers") or {}).get(name) or {}).get("node_rank")
    role = "serves the API" if node is config.head else "headless"
    if actual is None or str(actual) == declared:
        cells["rank"] = f"{declared} ({role})"
        return []
    cells["rank"] = f"{actual} (declared {declared})"
    return [
        Problem(
            node.name,
            f"container {name} runs --node-rank {actual}, but the stack gives {node.name} rank {declared}: "
            "the world cannot form",
            "`pulumi up --refresh` replaces it with the declared rank",
        )
    ]


def _gpus(node: str, declared: int, runtime: bool, cells: dict, gpus: dict) -> list[Problem]:
    if not gpus.get("tool"):
        cells["gpus"] = "no nvidia-smi"
        if runtime and declared:
            return [
                Problem(
                    node,
                    f"no `nvidia-smi` on the node; the stack declares {declared} GPU(s)",
                    "install the NVIDIA driver and container toolkit (DGX OS has them) or fix PATH",
                )
            ]
        return []
    cells["gpus"] = f"{gpus.get('count', 0)}/{declared}"
    if gpus.get("count", 0) < declared:
        why = f": {_first_line(gpus['error'])}" if gpus.get("error") else ""
        return [
            Problem(
                node,
                f"nvidia-smi shows {gpus.get('count', 0)} GPU(s), the stack declares {declared}{why}",
                "check the driver (`nvidia-smi` on the node) or the node's `gpus` in the stack",
            )
        ]
    return []


def _checkpoint(node: str, cells: dict, ckpt: dict, head_ckpt: dict, is_head: bool) -> list[Problem]:
    if not ckpt:
        cells["checkpoint"] = "-"
        return []
    if ckpt.get("local_dir"):
        cells["checkpoint"] = "present (local dir)" if ckpt.get("present") else "missing"
        if ckpt.get("present"):
            return []
        return [Problem(node, f"no config.json in {ckpt.get('path')}", "put the model there on every node")]
    if "revision" not in ckpt:
        cells["checkpoint"] = "missing"
        return [
            Problem(
                node,
                f"the checkpoint is not in the Hugging Face cache ({_first_line(ckpt.get('error'))})",
                "let `pulumi up` fetch it (or download it there by hand) before the containers start",
            )
        ]
    if ckpt.get("missing_count"):
        cells["checkpoint"] = f"{ckpt['missing_count']} of {ckpt.get('files')} files missing"
        shown = ", ".join(ckpt.get("missing") or [])
        return [
            Problem(
                node,
                f"{ckpt['missing_count']} checkpoint file(s) missing in {ckpt.get('path')}: {shown}",
                "`pulumi up --refresh` sends the missing files again",
            )
        ]
    cells["checkpoint"] = f"{ckpt.get('digest', '')[:12]} ({ckpt.get('files')} files)"
    if is_head or not head_ckpt.get("digest"):
        return []
    if ckpt.get("digest") == head_ckpt.get("digest"):
        cells["checkpoint"] += " = head"
        return []
    cells["checkpoint"] += " != head"
    return [
        Problem(
            node,
            f"the checkpoint differs from the head's (digest {ckpt.get('digest', '')[:12]} vs "
            f"{head_ckpt['digest'][:12]}, revision {ckpt.get('revision', '')[:12]} vs "
            f"{head_ckpt.get('revision', '')[:12]})",
            "`pulumi up --refresh` copies the head's checkpoint again (only the files that differ)",
        )
    ]


def _fabric_problem(node: str, text: str) -> Problem:
    """One of FabricCheck's problem lines (`node: what; next: step`) as a Problem."""
    what, _, step = text.removeprefix(f"{node}: ").partition("; next: ")
    return Problem(node, what, step or "see docs/troubleshooting.md, `fabric check on … is not fit for NCCL`")


def _fabric(
    config: StackConfig,
    cells: dict[str, dict[str, str]],
    reports: dict[str, Any],
    found: dict[str, str] | None = None,
    warned: list[Problem] | None = None,
) -> list[Problem]:
    """Each node's fabric as its FabricCheck would judge it now (the head first: its MTU is the
    workers' reference), into `found` what it found (`ports …, GID …, MTU …`) and into `warned` its
    warnings (MTUs that differ); nothing when `fabric.check` is off (no report was asked)."""
    found = {} if found is None else found
    warned = [] if warned is None else warned
    problems: list[Problem] = []
    reference = None
    for node in [config.head, *config.workers]:
        fabric = (reports.get(node.name) or {}).get("fabric")
        if fabric is None:
            continue
        if fabric.get("error"):
            cells[node.name]["fabric"] = "unknown"
            # The error's hint is the next step (python3, iproute2, ssh).
            problems.append(
                Problem(node.name, "its fabric facts could not be read", _first_line(fabric["error"]))
            )
            continue
        props = {**fabric_check_inputs(config, node, {"name": node.name}), "reference": reference}
        try:
            decision = decide(settings(props), node_facts(node.name, fabric["report"]))
        except FabricCheckError as exc:
            cells[node.name]["fabric"] = "unknown"
            what, _, step = str(exc).removeprefix(f"{node.name}: ").partition("\n  next: ")
            problems.append(Problem(node.name, what, step))
            continue
        if node is config.head:
            reference = {"node": node.name, "mtu": decision.mtu, "paths": dict(decision.paths)}
        found[node.name] = (
            f"ports {', '.join(decision.ib_hca) or 'none'}, {_gid_text(decision)}, MTU {decision.mtu or '?'}"
        )
        gid = "" if decision.gid_index is None else f" gid {decision.gid_index}"
        shown = f"{','.join(decision.ib_hca) or 'no HCA'} mtu {decision.mtu}{gid}"
        cells[node.name]["fabric"] = (
            OK + f" ({shown})" if not decision.problems else f"{len(decision.problems)} problem(s)"
        )
        problems += [_fabric_problem(node.name, text) for text in decision.problems]
        warned += [_fabric_problem(node.name, text) for text in decision.warnings]
    return problems


def _gid_text(decision: Decision) -> str:
    """`GID 3` where the used ports share one RoCE v2 IPv4 index (the one given, under resolve or a
    pin), else each port's; `GID none` where none was found."""
    if decision.gid_index is not None:
        return f"GID {decision.gid_index}"
    found = set(decision.gids.values())
    if not found or found == {None}:
        return "GID none"
    if len(found) == 1:
        return f"GID {found.pop()}"
    return "GIDs " + ", ".join(f"{hca} {index}" for hca, index in decision.gids.items())


def _recorded_speed(config: StackConfig, recorded: dict[str, Any], name: str) -> tuple[str, Problem | None]:
    """The last probe's figure as the stack output `fabric` recorded it (`pulumi up` measured it;
    `status` sends nothing), and a warning when it is below `fabric.min_gbps` (Gb/s)."""
    if name == config.head.name:
        return ("the workers' probes end here" if config.workers else "no probe (one node)"), None
    if recorded.get("error") or not isinstance(recorded.get("output"), dict):
        return f"last speed unknown ({_first_line(recorded.get('error') or 'not asked')})", None
    node = ((recorded["output"].get("nodes") or {}).get(name)) or {}
    throughput = node.get("throughput")
    if not isinstance(throughput, dict) or not throughput.get("line"):
        return "no probe recorded (`pulumi up` records one once the node's check passes)", None
    line, rate = str(throughput["line"]), throughput.get("gbytes_s")
    if not isinstance(rate, int | float):
        return line, None
    declared = next((n for n in config.nodes if n.name == name), None)
    ifname = config.socket_ifname(declared) if declared else config.fabric.socket_ifname
    slow = floor_warning(name, line, float(rate), config.fabric.min_gbps, ifname)
    return line, _fabric_problem(name, slow) if slow else None


def fabric_lines(
    config: StackConfig, facts: dict[str, Any], found: dict[str, str]
) -> tuple[dict[str, str], list[Problem]]:
    """One line per node, e.g. `node-b: ports rocep1s0f1:1, GID 3, MTU 9000; node-b → node-a
    11.8 GB/s over enp1s0f1np1`: the ports, GID and MTU read now, the TCP probe's figure the last
    `up` measured (the stack output `fabric`); and a warning per figure below `fabric.min_gbps`. `found`: each
    node's `ports …, GID …, MTU …` as `_fabric` judged them."""
    lines: dict[str, str] = {}
    warnings: list[Problem] = []
    recorded = facts.get("fabric_output") or {}
    for node in [config.head, *config.workers]:
        speed, slow = _recorded_speed(config, recorded, node.name)
        lines[node.name] = f"{node.name}: {found.get(node.name, 'fabric facts not read')}; {speed}"
        warnings += [slow] if slow else []
    return lines, warnings


PROOF_NEXT = (
    "see docs/fabric.md (the node proof); `pulumi up` proves again once an image or a node's NCCL "
    "settings change"
)


def proof_line(recorded: dict[str, Any]) -> tuple[str, list[Problem]]:
    """The `node proof` row: the verdict the last `pulumi up` recorded (the stack output
    `fabric.proof`: each node's transport as NCCL named it, the group's bus bandwidth), and a warning
    per problem it recorded (under `fabric.node_proof: report`)."""
    output = recorded.get("output")
    proof = output.get("proof") if isinstance(output, dict) else None
    if recorded.get("error") or not isinstance(proof, dict):
        return f"not recorded ({_first_line(recorded.get('error') or 'no proof in the stack output')})", []
    if not proof.get("verdict"):
        return "not run yet (the next `pulumi up` runs it before any serving container)", []
    if proof["verdict"] == "skipped":  # the serving containers held the memory at the last `up`
        said = "; ".join(str(w).split(" (the serving containers")[0] for w in proof.get("warnings") or [])
        return f"skipped by the last `pulumi up` ({said}): nothing proved then", []
    results = proof.get("results") or {}
    nets = ", ".join(
        f"{name} {r.get('network') or '?'}" + (f" ({', '.join(r['hcas'])})" if r.get("hcas") else "")
        for name, r in results.items()
    )
    figure = proof.get("busbw_gbs")
    speed = f"{figure:.2f} GB/s bus bandwidth" if isinstance(figure, int | float) else "no bandwidth measured"
    line = (
        f"{proof['verdict']} over {proof.get('backend')}: {nets}; {speed}{kernels_said(results)} "
        "(proved by `pulumi up`, not now)"
    )
    problems = [Problem("cluster", f"node proof: {p}", PROOF_NEXT) for p in proof.get("problems") or []]
    return line, problems


def serving_line(recorded: dict[str, Any]) -> tuple[str, list[Problem]]:
    """The `serving transport` row: what each node's serving ranks logged about their transport at
    the last `pulumi up` (the stack output `fabric.serving`, read by the readiness gate), and a warning
    per node whose ranks used sockets while HCAs were given."""
    output = recorded.get("output")
    serving = output.get("serving") if isinstance(output, dict) else None
    if recorded.get("error") or not isinstance(serving, dict) or not serving:
        why = recorded.get("error") or "no `serving` in the stack output `fabric`"
        return f"not recorded ({_first_line(why)}): the next `pulumi up` reads the ranks' logs", []
    said = "; ".join(
        f"{name} {(r or {}).get('said') or '?'}" + (" (FAIL)" if (r or {}).get("verdict") == "fail" else "")
        for name, r in sorted(serving.items())
    )
    problems = [
        Problem("cluster", f"serving ranks on {name}: {p}", PROOF_NEXT)
        for name, r in sorted(serving.items())
        if (r or {}).get("verdict") == "fail"
        for p in (r or {}).get("problems") or []
    ]
    return f"{said} (their logs, read by `pulumi up`'s readiness gate)", problems


def kernels_said(results: dict[str, Any]) -> str:
    """The kernels each node's proof ran, as `; kernels: NODE op KERNEL (state), …` (none: empty)."""
    said = [
        f"{name} {op} {(found or {}).get('kernel') or '-'} ({(found or {}).get('state')})"
        for name, result in results.items()
        for op, found in ((result or {}).get("kernels") or {}).items()
        if (found or {}).get("state") != "not callable alone"
    ]
    return f"; kernels: {', '.join(said)}" if said else ""


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
        return f"not measured ({_first_line(why)})"
    newest, by = (gate, "the readiness gate of `pulumi up`")
    if watchdog is not None and (gate is None or watchdog["started_at"] > (gate.get("started_at") or 0)):
        newest, by = (watchdog, "the watchdog")
    when = _when(newest.get("started_at"), now)
    if newest.get("error"):
        return f"not measured ({_first_line(newest['error'])}); started {when}, read by {by}"
    return f"{cold_start_summary(newest)}; started {when}, measured by {by}"


BENCH_NEXT = (
    "see docs/bench.md (the likely causes are in the stack output `serve_bench`); `pulumi up` measures "
    "again once the image, the serving flags or a bench key change"
)


def bench_line(config: StackConfig, recorded: dict[str, Any]) -> tuple[str, list[Problem]]:
    """The `bench` row: the figures the last `pulumi up` measured (the stack output `serve_bench`;
    `status` sends no bench of its own), and a warning per figure below a floor set now."""
    output = recorded.get("output")
    if recorded.get("error") or not isinstance(output, dict):
        return f"last figures unknown ({_first_line(recorded.get('error') or 'not asked')})", []
    if output.get("mode") == "off" or "figures" not in output:
        return "no figures recorded (the last `pulumi up` ran with bench.mode off)", []
    figures = output.get("figures")
    when = _when(output.get("measured_at"), None)
    if not isinstance(figures, dict):
        why = _first_line(output.get("error")) if output.get("error") else "nothing measured yet"
        return f"not measured by the last `pulumi up`: {why}", []
    line = f"{figures_line(figures)} (measured by `pulumi up` {when}, not now)"
    if output.get("settings") not in (None, config.bench.settings()):
        line += "; bench settings changed since: the next `up` measures again"
    missed = shortfalls(figures, config.bench.floors())
    return line, [Problem("cluster", f"serve bench: {m}", BENCH_NEXT) for m in missed]


ANSWERS_NEXT = (
    "see docs/answers.md (every finding is in the stack output `answers`); `pulumi up` checks again "
    "once the image, the serving flags, the nodes, the fabric or an answers key change"
)


def answers_line(config: StackConfig, recorded: dict[str, Any]) -> tuple[str, list[Problem]]:
    """The `answers` row: the verdict the last `pulumi up` recorded (the stack output `answers`;
    `status` sends no prompt of its own), and a warning per problem it recorded."""
    output = recorded.get("output")
    if recorded.get("error") or not isinstance(output, dict):
        return f"last verdict unknown ({_first_line(recorded.get('error') or 'not asked')})", []
    if output.get("mode") == "off" or "verdict" not in output:
        return "no answers recorded (the last `pulumi up` ran with answers.mode off)", []
    line = (
        f"{answers_summary(output)} (checked by `pulumi up` {_when(output.get('checked_at'), None)}, not now)"
    )
    if output.get("settings") not in (None, config.answers.settings()):
        line += "; answers settings changed since: the next `up` checks again"
    problems = [p for p in output.get("problems") or [] if output.get("verdict") == "fail"]
    return line, [Problem("cluster", f"answer check: {p}", ANSWERS_NEXT) for p in problems]


def _ray(config: StackConfig, cluster: dict, head_report: dict) -> list[Problem]:
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
        cluster["ray"] = f"no answer: {_first_line(ray.get('error'))}"
        return [
            Problem(
                config.head.name,
                f"`ray status` in the Ray head container failed: {_first_line(ray.get('error'))}",
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


def _server(cluster: dict, server: dict, server_name: str) -> list[Problem]:
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
