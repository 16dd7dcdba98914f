"""The StackClaim resource as the Pulumi program declares it (type `qwen35:StackClaim`)."""

from __future__ import annotations

from typing import Any

import pulumi
import pulumi.dynamic as dynamic

from components.stack_claim.provider import StackClaimProvider


class StackClaim(dynamic.Resource, module="qwen35", name="StackClaim"):
    """This stack's container name prefix and host ports on one node, refused if another stack's."""

    def __init__(
        self,
        name: str,
        *,
        node: dict[str, Any],
        owner: str,
        prefix: str,
        ports: list[list[int]],
        opts: pulumi.ResourceOptions | None = None,
    ):
        props = {"node": node, "owner": owner, "prefix": prefix, "ports": ports}
        super().__init__(StackClaimProvider(), name, props, opts)
