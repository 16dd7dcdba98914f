"""The model checkpoint on every node: fetched once on the head, copied node to node, verified by hash.

The same parts as NodeImage (`components/node_image/`):
- `facts.py`: reads (a node's inventory, what the Hub says a branch points at), no changes;
- `plan.py`: pure decisions (what a node lacks, free-space preflight, manifest digest, replace or
  update), tested as tables;
- `execute.py`: fetch on the head, copy node to node, remove, and the outputs state keeps;
- `programs.py`: the node programs (`components/node_programs/hf_checkpoint.py`, `hub_fetch.py`) as
  argument lists, and their reports;
- `provider.py`: `CheckpointProvider` (stacks pickle it by reference to that module);
- `resource.py`: the `Checkpoint` dynamic resource (type `qwen35:Checkpoint`);
- `fan_out.py`: one Checkpoint per node along `copy_plan`'s tree.
"""

from components.checkpoint.fan_out import checkpoint_tree, node_cache_dir
from components.checkpoint.plan import CheckpointError
from components.checkpoint.provider import CheckpointProvider
from components.checkpoint.resource import Checkpoint

__all__ = ["Checkpoint", "CheckpointError", "CheckpointProvider", "checkpoint_tree", "node_cache_dir"]
