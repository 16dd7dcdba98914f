"""The stack outputs (`__main__` exports them), assembled from the deployment's resources and its
config. No resource is declared here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from components.config import CheckMode, Executor
from components.containers import configured_fabric
from components.layout import (
    ANSWER_CHECK_OUTPUTS,
    FABRIC_OUTPUTS,
    MODEL_SUPPORT_OUTPUTS,
    NODE_PROOF_OUTPUTS,
    SERVE_BENCH_OUTPUTS,
    health_output,
    node_container_names,
    scrape_targets,
)
from components.ray_cluster import dashboard_host
from components.vllm_server import endpoint_url

if TYPE_CHECKING:
    from components.deployment.component import Qwen35Deployment


def stack_outputs(deployment: Qwen35Deployment) -> dict[str, Any]:
    """The stack's outputs (`__main__` exports them)."""
    cfg = deployment.config
    return {
        # Only known once the gate passed: an endpoint output means "has answered a request".
        "endpoint": deployment.ready.id.apply(lambda _: endpoint_url(cfg)),
        "served_model": cfg.serve.model_name,
        # No Ray, no Ray dashboard under executor mp.
        "dashboard": None
        if cfg.cluster.executor is Executor.MP
        else f"http://{dashboard_host(cfg)}:{cfg.ray.dashboard_port}",
        "images": {
            node: {"image_id": img.image_id, "layers": img.layers}
            for node, img in deployment.node_images.items()
        },
        "checkpoints": {
            node: {
                "revision": c.revision,
                "digest": c.digest,
                "files": c.files,
                "bytes": c.bytes,
                "snapshot_path": c.snapshot_path,
            }
            for node, c in deployment.checkpoints.items()
        },
        "containers": node_container_names(cfg),
        "health": health_output(cfg),
        # Prometheus file_sd: `pulumi stack output scrape_targets --json > targets.json`.
        "scrape_targets": scrape_targets(cfg),
        "model_support": {key: getattr(deployment.model_support, key) for key in MODEL_SUPPORT_OUTPUTS},
        "fabric": fabric_outputs(deployment),
        # The serving start the gate waited for: seconds from the container's start to the weights
        # loaded, the engine and the API ready, and its first completion (docs/bench.md).
        "cold_start": deployment.ready.report.apply(lambda report: (report or {}).get("cold_start")),
        # The served speed as the last `up` measured it (ServeBench; `status` shows it).
        "serve_bench": bench_output(deployment),
        # The served answers as the last `up` recorded and judged them (AnswerCheck; `status` shows it).
        "answers": answers_output(deployment),
        # How many replaced images each node keeps for a rollback (image.keep_previous).
        "keep_previous": cfg.image.keep_previous,
        "head": cfg.head.name,
        "nodes": [n.name for n in cfg.nodes],
    }


def fabric_outputs(deployment: Qwen35Deployment) -> dict[str, Any]:
    """The stack output `fabric`: the check's mode and, per node, what NCCL is given and why."""
    cfg = deployment.config
    if not deployment.fabric_checks:  # off: what config alone gives NCCL
        nodes = {
            n.name: {
                "ib_hca": list(configured_fabric(cfg, n).ib_hca),
                "gid_index": configured_fabric(cfg, n).gid_index,
            }
            for n in cfg.nodes
        }
        return {
            "check": cfg.fabric.check.value,
            "nodes": nodes,
            **proof_output(deployment),
            "serving": deployment.ready.serving_transport,
        }
    return {
        "check": cfg.fabric.check.value,
        "nodes": {
            node: {key: getattr(check, key) for key in FABRIC_OUTPUTS}
            for node, check in deployment.fabric_checks.items()
        },
        **proof_output(deployment),
        # What the serving ranks logged about their transport, read by the gate (node -> record).
        "serving": deployment.ready.serving_transport,
    }


def proof_output(deployment: Qwen35Deployment) -> dict[str, Any]:
    """`fabric.proof`: the node proof's mode and verdict (none under `fabric.node_proof: off`)."""
    if deployment.node_proof is None:
        return {}
    proof = {key: getattr(deployment.node_proof, key) for key in NODE_PROOF_OUTPUTS}
    return {"proof": {"mode": deployment.config.fabric.proof.value, **proof}}


def answers_output(deployment: Qwen35Deployment) -> dict[str, Any]:
    """The stack output `answers`: the mode, the settings, the prompt set and the reference's
    path, and what the last run recorded (receipts, verdict, problems, what it judged against)."""
    answers = deployment.config.answers
    return check_output(
        answers.mode, deployment.answers, ANSWER_CHECK_OUTPUTS,
        settings=answers.settings(), reference=answers.reference,
    )  # fmt: skip


def bench_output(deployment: Qwen35Deployment) -> dict[str, Any]:
    """The stack output `serve_bench`: the mode, the settings and floors, and what the last run
    measured (figures, verdict, the floors missed and their likely causes)."""
    bench = deployment.config.bench
    return check_output(
        bench.mode, deployment.bench, SERVE_BENCH_OUTPUTS, settings=bench.settings(), floors=bench.floors()
    )


def check_output(mode: CheckMode, check: Any, keys: tuple[str, ...], **described: Any) -> dict[str, Any]:
    """A check's stack output: its mode alone when it is off (no resource), else the mode, what the
    stack asked of it (`described`) and what its last run recorded (`keys` of its outputs)."""
    if check is None:
        return {"mode": mode.value}
    return {"mode": mode.value, **described, **{key: getattr(check, key) for key in keys}}
