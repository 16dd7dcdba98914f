"""The ModelSupportCheck dynamic provider: create runs the check (`execute.ensure`), and update the
argument proof again when a command line changed (the same `ensure`, from the recorded outputs);
check, diff, read and delete never touch the head (`plan.py` decides from inputs and recorded outputs).

Keep `ModelSupportCheckProvider` importable as `components.model_support.ModelSupportCheckProvider`,
with no import-time side effects: stacks pickle it by reference to that path.
"""

from __future__ import annotations

from components.model_support.execute import ensure
from components.model_support.plan import check_id, plan_change, validate
from components.provider_kit.provider_base import NodeResourceProvider, Verbs


class ModelSupportCheckProvider(NodeResourceProvider):
    """create: run the check; diff: compare inputs only; read: the recorded proof; delete: nothing."""

    # Existing stacks pickled this class as `components.model_support.ModelSupportCheckProvider` (by
    # reference): keep that its path whatever file it lives in.
    __module__ = "components.model_support"
    verbs = Verbs(
        validate,
        plan_change,
        ensure,
        resource_id=lambda props, _outs: check_id(props),
    )
