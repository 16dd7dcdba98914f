"""The Checkpoint dynamic provider: create/read/update/delete carry out `execute`; diff and check
never touch a node (`plan.plan_change` compares inputs with recorded state).

Keep `CheckpointProvider` importable as `components.checkpoint.CheckpointProvider` (where stacks now
pickle it by reference, as every provider is pickled: to its package) and as
`components.checkpoint.provider.CheckpointProvider` (where stacks made before pickled it), with no
import-time side effects. The second is a leftover (it pins this file's name): free it, with its entry
in `EARLIER_PICKLE_PATHS` (tests/unit/test_house.py), once every stack made before 2026-12-06
(7f524e3, the rule of pickling by package) has been destroyed or updated by `pulumi up` since.
"""

from __future__ import annotations

from components.checkpoint.execute import ensure, observe, release
from components.checkpoint.plan import plan_change, validate
from components.provider_kit.provider_base import NodeResourceProvider, Verbs


class CheckpointProvider(NodeResourceProvider):
    """CRUD for Checkpoint; every method but diff/check talks to nodes over SSH."""

    # Stacks pickle this class by reference as `components.checkpoint.CheckpointProvider`: keep that
    # its path whatever file it lives in (and this file's name, which older stacks' pickles hold).
    __module__ = "components.checkpoint"
    verbs = Verbs(
        validate,
        plan_change,
        ensure,
        resource_id=lambda _props, outs: f"{outs['node'].get('name')}:{outs['repo']}@{outs['revision']}",
        observe=observe,
        release=release,
    )
