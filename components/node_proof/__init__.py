"""NodeProof: before any serving container, each node's GPU and the NCCL transport proven with the
deployment image's own torch, CUDA and NCCL.

create(), over SSH on every node at once: a short-lived container of the node's image (by ID) with
the serving containers' devices, GPU request, limits and that node's NCCL settings runs
`node_programs/node_proof.py`:
1. (the stack gives its containers the GPU) torch sees the GPU; a BF16 matmul, an FP8 scaled matmul
   and vLLM's rms_norm run on it; CUDA's free and total memory;
2. all nodes join one torch.distributed group (NCCL with the GPU, gloo without: the lab) at the
   head's fabric address on `fabric.probe_port` (FabricCheck's probes are done by then), check one
   all-reduce and time a sized one (bus bandwidth, as nccl-tests computes it).
NCCL's INFO lines name the network it used: sockets where HCAs were given is refused under
`fabric.node_proof: enforce` (`components/nccl.py`'s `nccl_problems`), as is a bus bandwidth below
`fabric.min_busbw_gbps`; `report` records them. With the GPU step, a node whose MemAvailable is
below `min_available_bytes` (the serving containers hold it: an update) gets no container at all:
the verdict is `skipped`, a warning, never a refusal. The verdict is in the stack output `fabric` and
`status`. A proof is not live state: diff asks for a new run when any input changes; read returns
what was recorded; check and diff do no I/O.

Files, by job:
    facts.py     the proof's report and NCCL's lines parsed (pure)
    programs.py  the `docker run` argv per node and the program's stdin
    plan.py      validate, plan_change, the verdict (`judged`) and the refusal (pure)
    execute.py   ensure: every node's proof at once over SSH (the only I/O)
    errors.py    NodeProofError
    provider.py  NodeProofProvider (check/diff/read: no I/O)
    resource.py  the NodeProof resource (type qwen35:NodeProof)
Code run in the containers: components/node_programs/node_proof.py.

Keep `NodeProofProvider` importable here under this name, with no import-time side effects: stacks
pickle it by reference to this module.
"""

from components.node_proof.errors import NodeProofError
from components.node_proof.execute import ensure, node_transports, observe, run_all, run_node
from components.node_proof.facts import STEPS, busbw, failed_steps
from components.node_proof.plan import (
    ENFORCE,
    INPUT_KEYS,
    OUTPUT_KEYS,
    REPORT,
    judged,
    plan_change,
    refusal,
    validate,
)
from components.node_proof.programs import container_name, proof_argv, proof_spec, run_options
from components.provider_kit.lazy import lazy_exports

# Loaded on first use: these modules import Pulumi (components/provider_kit/lazy.py).
__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "NodeProof": ".resource",
        "NodeProofProvider": ".provider",
    },
)

__all__ = [
    "ENFORCE",
    "INPUT_KEYS",
    "OUTPUT_KEYS",
    "REPORT",
    "STEPS",
    "NodeProof",
    "NodeProofError",
    "NodeProofProvider",
    "busbw",
    "container_name",
    "ensure",
    "failed_steps",
    "judged",
    "node_transports",
    "observe",
    "plan_change",
    "proof_argv",
    "proof_spec",
    "refusal",
    "run_all",
    "run_node",
    "run_options",
    "validate",
]
