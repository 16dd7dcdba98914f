"""The checks after the readiness gate, on the head: the served answers recorded and judged
(AnswerCheck), then the served speed measured (ServeBench).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pulumi

from components.answer_check import AnswerCheck
from components.config import CheckMode
from components.deployment.outputs import fabric_outputs
from components.deployment.served import server_argv
from components.layout import answer_check_inputs, serve_bench_inputs
from components.serve_bench import ServeBench

if TYPE_CHECKING:
    from components.deployment.component import Qwen35Deployment


def served_on_head(deployment: Qwen35Deployment) -> dict:
    """What both checks judge and where they run: the head's access, every node's image ID and the
    server's argv (a change of either runs them again)."""
    cfg = deployment.config
    return {
        "node": deployment.access[cfg.head.name].node_dict(),
        "image_ids": {n.name: deployment.image_id(n.name) for n in cfg.nodes},
        "server_argv": server_argv(cfg, deployment.served_revision()),
    }


def answer_check(
    name: str, deployment: Qwen35Deployment, api_key: pulumi.Output[str] | None
) -> AnswerCheck | None:
    """After the gate, on the head: the served answers recorded and judged (none under
    `answers.mode: off`). It checks again when every node's image ID, the server's argv, the node
    set, the fabric NCCL is given, the prompt set, the reference or the settings change."""
    cfg = deployment.config
    if cfg.answers.mode is CheckMode.OFF:
        return None
    return AnswerCheck(
        f"{name}-answers",
        **served_on_head(deployment),
        **answer_check_inputs(cfg),
        fabric=deployment.nccl_fabric(),
        api_key=api_key,
        opts=pulumi.ResourceOptions(parent=deployment, depends_on=[deployment.ready]),
    )


def serve_bench(
    name: str, deployment: Qwen35Deployment, api_key: pulumi.Output[str] | None
) -> ServeBench | None:
    """After the gate, on the head: the served speed measured (none under `bench.mode: off`). It
    measures again when a node's image ID or NCCL settings, the server's argv, the node set or the
    bench settings change; FabricCheck's outputs only explain a figure below its floor."""
    cfg = deployment.config
    if cfg.bench.mode is CheckMode.OFF:
        return None
    return ServeBench(
        f"{name}-bench",
        **served_on_head(deployment),
        **serve_bench_inputs(cfg),
        api_key=api_key,
        fabric=fabric_outputs(deployment),
        nccl_env={n.name: deployment.nccl_env(n) for n in cfg.nodes},
        # After the answer check: the bench's streams would share the server's batches with the
        # check's requests, and a batch changes logprobs by a little.
        opts=pulumi.ResourceOptions(
            parent=deployment,
            depends_on=[deployment.ready, *([deployment.answers] if deployment.answers else [])],
        ),
    )
