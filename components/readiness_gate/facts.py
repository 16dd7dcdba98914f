"""The probe's report as a value, and what the serving ranks' logs say about their transport: pure,
no I/O."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from components.nccl import NcclFacts, parse_nccl_log
from components.provider_kit.reports import require_report
from components.remote import Result

# vLLM's parallel_state.py, once per rank: `world_size=2 rank=1 … distributed_init_method=… backend=gloo`.
_TORCH_BACKEND = re.compile(r"distributed_init_method=\S+ backend=(?P<backend>\w+)")


def probe_report(result: Result, node: str) -> dict[str, Any]:
    """The probe's report on success (provider_kit.reports: Ray's nodes and GPUs, the model, the
    completion's tokens, and with the server's container known its `cold_start`: the start's
    milestones from vLLM's log, `node_programs/cold_start.py`); RemoteError when it printed none."""
    return require_report(
        result, node, default_hint="the probe passed but printed no report: run `pulumi up` again"
    )


@dataclass(frozen=True)
class ServingTransport:
    """What one node's serving ranks logged about their transport: torch.distributed's backend
    (vLLM's line; None: not logged) and NCCL's own INFO lines (NCCL_DEBUG=INFO, INIT,NET)."""

    backend: str | None
    nccl: NcclFacts

    def record(self) -> dict[str, Any]:
        """The values recorded in the `fabric` output, `status` and the bench's causes."""
        if not self.nccl.lines:
            # The CPU build (the lab) has no NCCL: its ranks use gloo, and that is what they said.
            said = f"{self.backend or 'backend not logged'}, no NCCL lines"
        else:
            hcas = ",".join(self.nccl.ib_hcas) or "no HCA"
            gids = ",".join(str(g) for g in sorted(set(self.nccl.gid_index.values()))) or "not logged"
            said = f"NCCL over {self.nccl.network or 'no network named'} ({hcas}; GID index {gids})"
        return {
            "backend": self.backend,
            "network": self.nccl.network,
            "hcas": list(self.nccl.ib_hcas),
            "gid_index": dict(self.nccl.gid_index),
            "said": said,
        }


def serving_transport(log: str) -> ServingTransport:
    """One node's serving container log (`docker logs`) read for its ranks' transport."""
    backends = _TORCH_BACKEND.findall(log)
    return ServingTransport(backends[-1] if backends else None, parse_nccl_log(log))
