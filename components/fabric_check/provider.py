"""The FabricCheck dynamic provider: create, update and read run the facts program on the node
(`execute.ensure`, `execute.observe`); check and diff never touch it (`plan` decides from inputs
and recorded outputs).

Keep `FabricCheckProvider` importable as `components.fabric_check.FabricCheckProvider`, with no
import-time side effects: stacks pickle it by reference to that path.
"""

from __future__ import annotations

from components.fabric_check.execute import ensure, observe
from components.fabric_check.plan import check_id, plan_change, validate
from components.provider_kit.provider_base import NodeResourceProvider, Verbs


class FabricCheckProvider(NodeResourceProvider):
    """create/update: check the node's fabric; read: the facts again (drift, never refused there: the
    next `up` does); delete: nothing."""

    # Stacks pickle this class as `components.fabric_check.FabricCheckProvider` (by reference): keep
    # that its path whatever file it lives in.
    __module__ = "components.fabric_check"
    verbs = Verbs(
        validate,
        plan_change,
        ensure,
        resource_id=lambda props, _outs: check_id(props),
        observe=observe,
    )
