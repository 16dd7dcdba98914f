"""NodeImage: "image X is on node Y" as a declared, verified state (a Pulumi dynamic resource).

create() gathers both nodes' facts, `plan`s (skip, retag or copy), and a copy streams
`docker save | filter | ssh dest image_tag load` from the source node straight to the destination
through the transfer layer (`components.transfer`), leaving out the layers the destination already
has. The load lands on a temporary tag; only after the image ID (or, across image stores, the layer
list) matches the source's is the real tag set. read() re-inspects for `pulumi refresh`; diff()
compares inputs with state and touches no node; delete() gives up this resource's hold on the tag
(the node keeps a record of which NodeImages hold it, so a replacement keeps the image).

Files, by job (the shape every node resource has):
    facts.py      what a node's Docker holds, as values, and the parsers of the node programs' reports
    programs.py   the argv run on a node: docker_facts, image_tag, layer_filter, docker save/inspect/rm
    plan.py       the pure decisions: plan_change(olds, news) -> Change (diff), and
                  plan(source_facts, destination_facts, tuning) -> Skip | Retag | Copy
    execute.py    the I/O: ensure (create), observe (read), release (delete); the copy runs through
                  components.transfer
    docker_on.py  execute's connector: programs.py's argv run on one node over SSH, errors naming it
    provider.py   the dynamic provider (diff: plan_change, no I/O)
    resource.py   the NodeImage resource (type qwen35:NodeImage)
    errors.py     the package's errors
    inputs.py     the resource inputs parsed: image reference, node dicts, tuning
    fan_out.py    copy_tree: one NodeImage per node along fan_out_tree's tree
Code run on the nodes: components/node_programs/ (docker_facts.py, image_tag.py, layer_filter.py,
transfer_source.py).

Keep `NodeImageProvider` importable here under this name, with no import-time side effects: stacks
pickle it by reference to this module.
"""

from components.node_image.docker_on import DockerOn
from components.node_image.errors import ExportFailed, Mismatch, NodeImageError
from components.node_image.execute import ensure, observe, release
from components.node_image.facts import (
    INSPECT_FORMAT,
    Daemon,
    Facts,
    ImageInfo,
    parse_daemon,
    parse_df_available,
    parse_facts,
    parse_images,
    parse_layer_sizes,
    same_image,
)
from components.node_image.inputs import NODE_KEYS, STORES, Node, clean_node, inputs, parse
from components.node_image.plan import Copy, Retag, Skip, disk_needed, plan, plan_change, replace_reasons
from components.node_image.programs import TMP_TAG_PREFIX, facts_argv, filter_argv, filter_spec, load_argv
from components.provider_kit.lazy import lazy_exports
from components.transfer import TIMING_ENV, PhaseTimes, Tuning, peer_target

# Loaded on first use: these modules import Pulumi (components/provider_kit/lazy.py).
__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "NodeImage": ".resource",
        "NodeImageProvider": ".provider",
        "OUTPUT_KEYS": ".resource",
        "copy_tree": ".fan_out",
    },
)

__all__ = [
    "INSPECT_FORMAT",
    "NODE_KEYS",
    "OUTPUT_KEYS",
    "STORES",
    "TIMING_ENV",
    "TMP_TAG_PREFIX",
    "Copy",
    "Daemon",
    "DockerOn",
    "ExportFailed",
    "Facts",
    "ImageInfo",
    "Mismatch",
    "Node",
    "NodeImage",
    "NodeImageError",
    "NodeImageProvider",
    "PhaseTimes",
    "Retag",
    "Skip",
    "Tuning",
    "clean_node",
    "copy_tree",
    "disk_needed",
    "ensure",
    "facts_argv",
    "filter_argv",
    "filter_spec",
    "inputs",
    "load_argv",
    "observe",
    "parse",
    "parse_daemon",
    "parse_facts",
    "parse_df_available",
    "parse_images",
    "parse_layer_sizes",
    "peer_target",
    "plan",
    "plan_change",
    "release",
    "replace_reasons",
    "same_image",
]
