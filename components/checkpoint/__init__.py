"""The model checkpoint on every node: fetched once on the head, copied node to node, verified by hash.

The same parts as every node resource:
- `facts.py`: the node programs' reports parsed into values (and what a receive's exit means); pure;
- `programs.py`: the node programs (`components/node_programs/hf_checkpoint.py`, `hub_fetch.py`) as
  argument lists;
- `plan.py`: pure decisions (what a node lacks, free-space preflight, manifest digest,
  `plan_change` -> Change), tested as tables;
- `execute.py`: the only I/O: `ensure` (fetch on the head, copy node to node), `observe` (a node's
  inventory, what the Hub says a branch points at), `release` (remove), and the outputs state keeps;
- `errors.py`: `CheckpointError`;
- `provider.py`: `CheckpointProvider` (stacks pickle it by reference as
  `components.checkpoint.CheckpointProvider`; those made before as
  `components.checkpoint.provider.CheckpointProvider`, which still imports);
- `resource.py`: the `Checkpoint` dynamic resource (type `qwen35:Checkpoint`);
- `fan_out.py`: one Checkpoint per node along `fan_out_tree`'s tree.
"""

from components.checkpoint.errors import CheckpointError
from components.provider_kit.lazy import lazy_exports

# Loaded on first use: these modules import Pulumi (components/provider_kit/lazy.py).
__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "Checkpoint": ".resource",
        "CheckpointProvider": ".provider",
        "checkpoint_tree": ".fan_out",
        "node_cache_dir": "components.layout",
    },
)

__all__ = ["Checkpoint", "CheckpointError", "CheckpointProvider", "checkpoint_tree", "node_cache_dir"]
