"""The proofs before any serving container: the model-support check on the head (the image loads the
checkpoint, and the model fits) and the node proof on every node (the image's GPU step, one group
over the fabric).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pulumi

from components.config import CheckMode
from components.containers import configured_fabric
from components.deployment.served import rank_argvs, server_argv
from components.layout import model_support_inputs, node_proof_inputs
from components.model_support import ModelSupportCheck
from components.node_proof import NodeProof

if TYPE_CHECKING:
    from components.deployment.component import Qwen35Deployment


def model_support_check(name: str, deployment: Qwen35Deployment) -> ModelSupportCheck:
    """Before any Ray container: the head's image loads the checkpoint, and the model fits."""
    cfg, head = deployment.config, deployment.config.head.name
    head_checkpoint = deployment.checkpoints.get(head)
    return ModelSupportCheck(
        f"{name}-model-support",
        node=deployment.access[head].node_dict(),
        **model_support_inputs(cfg, deployment.image_ref),
        image_id=deployment.node_images[head].image_id,
        # The head's checkpoint (none when serve.model is a path and model.repo is unset: then the
        # proof runs on its fixture configs and the memory fit is not checked).
        checkpoint_digest=head_checkpoint.digest if head_checkpoint else None,
        snapshot_path=head_checkpoint.snapshot_path if head_checkpoint else None,
        # The server's exact command line (with the pinned revision): the image's vLLM parses it.
        serve_argv=server_argv(cfg, deployment.served_revision()),
        rank_argvs=rank_argvs(cfg, deployment.served_revision()),
        opts=pulumi.ResourceOptions(
            parent=deployment,
            depends_on=[deployment.node_images[head], *([head_checkpoint] if head_checkpoint else [])],
        ),
    )


def node_proof(name: str, deployment: Qwen35Deployment) -> NodeProof | None:
    """Before any serving container, on every node at once: the image's GPU step and one group
    over the fabric whose transport NCCL names (none under `fabric.node_proof: off`)."""
    cfg = deployment.config
    if cfg.fabric.proof is CheckMode.OFF:
        return None
    nodes = []
    for rank, node in enumerate([cfg.head, *cfg.workers]):
        fabric = deployment.node_fabric(node)
        nodes.append(
            {
                "name": node.name,
                "node": deployment.access[node.name].node_dict(),
                "rank": rank,
                "image_id": deployment.image_id(node.name),
                # What that node's serving containers get: its own interface, HCAs and GID index.
                "env": deployment.fabric_env(node),
                "ib_hca": fabric.apply(lambda f: list(f.ib_hca))
                if fabric
                else list(configured_fabric(cfg, node).ib_hca),
                # Lab only, and only when set (an unset key would change every stack's input).
                **({"host_root": node.host_root} if node.host_root else {}),
            }
        )
    return NodeProof(
        f"{name}-node-proof",
        nodes=nodes,
        **node_proof_inputs(cfg),
        opts=pulumi.ResourceOptions(
            parent=deployment,
            # After every node's image and fabric check (whose probes free the head's port).
            depends_on=[
                *deployment.claims.values(),
                *deployment.node_images.values(),
                *deployment.fabric_checks.values(),
            ],
        ),
    )
