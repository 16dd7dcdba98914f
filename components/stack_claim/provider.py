"""The StackClaim dynamic provider: create, update, read and delete run the claim program on the node
(`execute`); diff never touches it (`plan` compares inputs with recorded state)."""

from __future__ import annotations

from components.provider_kit.provider_base import NodeResourceProvider, Verbs
from components.stack_claim.execute import ensure, observe, release
from components.stack_claim.plan import plan_change, validate


class StackClaimProvider(NodeResourceProvider):
    """create/update: take the claim (refused on a collision); read: still held?; delete: drop it."""

    # Stacks pickle this class as `components.stack_claim.StackClaimProvider` (by reference): keep that
    # its path whatever file it lives in.
    __module__ = "components.stack_claim"
    verbs = Verbs(
        validate,
        plan_change,
        ensure,
        resource_id=lambda props, _outs: f"{props['node']['name']}/{props['owner']}",
        observe=observe,
        release=release,
    )
