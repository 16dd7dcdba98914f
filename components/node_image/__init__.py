"""NodeImage: "image X is on node Y" as a declared, verified state (a Pulumi dynamic resource).

create() gathers both nodes' facts, `plan`s (skip, retag or copy), and a copy streams
`docker save | filter | ssh dest image_tag load` from the source node straight to the destination
through the transfer layer (`components.transfer`), leaving out the layers the destination already
has. The load lands on a temporary tag; only after the image ID (or, across image stores, the layer
list) matches the source's is the real tag set. read() re-inspects for `pulumi refresh`; diff()
compares inputs with state and touches no node; delete() gives up this resource's hold on the tag
(the node keeps a record of which NodeImages hold it, so a replacement keeps the image).

Files, by job:
    nodes.py      the inputs: image reference, node dicts, tuning
    facts.py      what a node's Docker holds, as values, and their parsers
    docker_on.py  Docker commands on one node over SSH (facts in one round trip, tag records)
    plan.py       the pure decision: plan(source_facts, destination_facts, tuning) -> Skip | Retag | Copy
    execute.py    create/read/delete carried out (the copy runs through components.transfer)
    provider.py   the dynamic provider (diff: no I/O)
    resource.py   the NodeImage resource (type qwen35:NodeImage)
    fan_out.py    copy_tree: one NodeImage per node along copy_plan's tree
Code run on the nodes: components/node_programs/ (layer_filter.py, image_tag.py, transfer_source.py).

Keep `NodeImageProvider` importable here under this name, with no import-time side effects: stacks
pickle it by reference to this module.
"""

from components.node_image.docker_on import DockerOn
from components.node_image.errors import ExportFailed, Mismatch, NodeImageError
from components.node_image.execute import (
    TMP_TAG_PREFIX,
    ensure_image,
    load_argv,
    observe,
    release_tag,
)
from components.node_image.facts import (
    INSPECT_FORMAT,
    Daemon,
    Facts,
    ImageInfo,
    parse_daemon,
    parse_df_available,
    parse_images,
    parse_layer_sizes,
    same_image,
)
from components.node_image.fan_out import copy_tree
from components.node_image.inputs import NODE_KEYS, STORES, Node, clean_node, inputs, parse
from components.node_image.plan import Copy, Retag, Skip, disk_needed, plan
from components.node_image.provider import NodeImageProvider, replace_reasons
from components.node_image.resource import OUTPUT_KEYS, NodeImage
from components.transfer import TIMING_ENV, PhaseTimes, Tuning, peer_target

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
    "ensure_image",
    "inputs",
    "load_argv",
    "observe",
    "parse",
    "parse_daemon",
    "parse_df_available",
    "parse_images",
    "parse_layer_sizes",
    "peer_target",
    "plan",
    "release_tag",
    "replace_reasons",
    "same_image",
]
