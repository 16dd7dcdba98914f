"""The model checkpoint on every node: fetched once on the head, copied node to node, verified by hash.

- `plan.py`: pure decisions (what a node lacks, free-space preflight, manifest digest);
- `programs.py`: the node programs (`components/node_programs/hf_checkpoint.py`, `hub_fetch.py`) as
  argument lists, and their reports;
- `stream.py`: source → destination stream of files;
- `provider.py`: the `Checkpoint` dynamic resource (type `qwen35:Checkpoint`) and its provider;
- `fan_out.py`: one Checkpoint per node along `copy_plan`'s tree.
"""

from components.checkpoint.fan_out import checkpoint_tree, node_cache_dir
from components.checkpoint.plan import CheckpointError
from components.checkpoint.provider import Checkpoint, CheckpointProvider

__all__ = ["Checkpoint", "CheckpointError", "CheckpointProvider", "checkpoint_tree", "node_cache_dir"]
