"""One node's cells and problems: SSH, Docker and its image store, the image against the head's, the
declared containers, the rank (executor mp), the GPUs and the checkpoint."""

from __future__ import annotations

from typing import TYPE_CHECKING

from components.config import Executor, ImageStrategy, NodeConfig, StackConfig
from components.mp_executor import mp_container_name, node_rank
from components.ray_cluster import worker_container_name
from status.problem import OK, Problem, duration, first_line, short_id

if TYPE_CHECKING:
    from status.verdict import Verdict


def judge_node(
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
                f"not reachable over SSH: {first_line(report.get('error'))}",
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
        cells["docker"] = f"down: {first_line(docker.get('error'))}"
        return [
            Problem(
                node.name,
                f"Docker does not answer: {first_line(docker.get('error'))}",
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
        why = f" ({first_line(image['error'])})" if image.get("error") else ""
        step = _missing_image_step(ref, strategy, is_head, bool(head_image.get("present")))
        return [Problem(node, f"the deployment image {ref} is missing{why}", step)]
    cells["image"] = short_id(image.get("id", ""))
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
                    f"container {name} runs image {short_id(fact['image'])}, not the deployment image "
                    f"({short_id(image_id)})",
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
        why = f": {first_line(gpus['error'])}" if gpus.get("error") else ""
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
                f"the checkpoint is not in the Hugging Face cache ({first_line(ckpt.get('error'))})",
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
