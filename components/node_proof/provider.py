"""The NodeProof dynamic provider: create/update prove (`execute.ensure`); read gives back what was
proved, with each node's host software read again (`execute.observe`); check and diff never touch a
node (`plan`)."""

from __future__ import annotations

from components.node_proof.execute import ensure, observe
from components.node_proof.plan import plan_change, validate
from components.provider_kit.provider_base import NodeResourceProvider, Verbs


class NodeProofProvider(NodeResourceProvider):
    """create and update: prove on every node; read: the recorded proof; delete: nothing."""

    # Stacks pickle this class by reference to `components.node_proof.NodeProofProvider`: keep that
    # its path whatever file it lives in.
    __module__ = "components.node_proof"
    verbs = Verbs(
        validate,
        plan_change,
        ensure,
        resource_id=lambda props, _outs: f"{props['container_prefix']}-node-proof",
        observe=observe,
    )
