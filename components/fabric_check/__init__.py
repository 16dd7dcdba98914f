"""FabricCheck: per node, before any Ray or vLLM container, read its RoCE fabric and decide what
NCCL there is given.

create(), over SSH on the node: run `node_programs/fabric_facts.py` (sysfs and `ip -j addr`), then
decide (`plan.py`): the ports NCCL uses (`ib_hca`: the node's ACTIVE ports, unless pinned), the
RoCE v2 IPv4 GID index on each (`gid_index`: set only under `fabric.gid_index: resolve` or an
index), and the MTU of its fabric path (none below `fabric.mtu`; MTUs that differ from the head's
warn: NCCL runs each connection at the smaller end's). A problem stops `up`
(mode enforce) naming node, device, port, what was found and the next step, or is recorded in the
outputs (mode report: the stack output `fabric`). read (pulumi refresh) reads the facts again, so a
port gone DOWN, a changed MTU or a GID index that moved shows as drift; check and diff do no I/O.

Files, by job:
    facts.py     the programs' reports parsed; the facts program's as frozen values (pure)
    programs.py  the facts program's and the probe's argv, what their exit status means
    plan.py      the pure decisions: ports, GID index, MTU, problems, refusal, `plan_change`
(NCCL's own log, parsed and judged, is components/nccl.py: the node proof and the bench read it too.)
    execute.py   the check carried out over SSH (the only I/O): ensure (create, update), observe
                 (refresh)
    errors.py    FabricCheckError
    provider.py  FabricCheckProvider (check/diff: no I/O)
    resource.py  the FabricCheck resource (type qwen35:FabricCheck)
Code run on the node: components/node_programs/fabric_facts.py.

Keep `FabricCheckProvider` importable here under this name, with no import-time side effects: stacks
pickle it by reference to this module.
"""

from components.fabric_check.errors import FabricCheckError
from components.fabric_check.execute import (
    FACTS_TIMEOUT_S,
    ensure,
    facts_report,
    node_transport,
    observe,
    probe_head,
    read_facts,
)
from components.fabric_check.facts import (
    Gid,
    Netdev,
    NodeFacts,
    Port,
    ipv4_of_gid,
    node_facts,
)
from components.fabric_check.plan import (
    ENFORCE,
    INPUT_KEYS,
    OUTPUT_KEYS,
    REPORT,
    RESOLVE,
    UNSET,
    Decision,
    Settings,
    check_id,
    decide,
    plan_change,
    probe_after,
    refusal,
    settings,
    validate,
)
from components.fabric_check.programs import ADDRESSES_FILE, facts_argv, facts_spec
from components.provider_kit.lazy import lazy_exports

# Loaded on first use: these modules import Pulumi (components/provider_kit/lazy.py).
__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "FabricCheck": ".resource",
        "FabricCheckProvider": ".provider",
    },
)

__all__ = [
    "ADDRESSES_FILE",
    "ENFORCE",
    "FACTS_TIMEOUT_S",
    "INPUT_KEYS",
    "OUTPUT_KEYS",
    "REPORT",
    "RESOLVE",
    "UNSET",
    "Decision",
    "FabricCheck",
    "FabricCheckError",
    "FabricCheckProvider",
    "Gid",
    "Netdev",
    "NodeFacts",
    "Port",
    "Settings",
    "check_id",
    "decide",
    "ensure",
    "facts_argv",
    "facts_report",
    "facts_spec",
    "ipv4_of_gid",
    "node_facts",
    "node_transport",
    "observe",
    "plan_change",
    "probe_after",
    "probe_head",
    "read_facts",
    "refusal",
    "settings",
    "validate",
]
