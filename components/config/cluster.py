"""The `fabric`, `ray`, `cluster` and `containers` sections: the link between the nodes, how they form
one vLLM engine (Ray or vLLM's `mp`), and how its containers run.
"""

from __future__ import annotations

import re
from enum import Enum
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from components.config.fields import (
    NODE_NAME,
    CheckMode,
    Port,
    _check_hcas,
    _check_host,
    _check_ifname,
    _check_path,
    _CrossFieldErrors,
    _Model,
)


class RestartPolicy(str, Enum):
    # `unless-stopped` brings the cluster back after a reboot; `on-failure` bounds crash loops.
    UNLESS_STOPPED = "unless-stopped"
    ALWAYS = "always"
    ON_FAILURE = "on-failure"
    NO = "no"


# Before FabricCheck this list was every stack's NCCL_IB_HCA: what a stack with `fabric.check: off`
# and no pin still gets, so turning the check off never changes what an existing stack deploys.
# A leftover: remove it (and require a pin under `fabric.check: off`) once no stack runs with the
# check off and no pin; such a stack's serving containers are replaced when it goes.
LEGACY_IB_HCA = ("rocep1s0f0", "roceP2p1s0f0")
GidIndex = Literal["unset", "resolve"] | Annotated[int, Field(ge=0, le=255)]


# Above any bus bandwidth two ConnectX-7 ports (2 x 200 Gb/s, 50 GB/s) can carry: a floor set higher
# was written in Gb/s.
MAX_BUSBW_GBPS = 100.0
# The fabric floors' units, said in every message that names one: the probe's is a link's rate in
# bits, the node proof's a bus bandwidth in bytes (as nccl-tests prints busbw), 8x apart.
FLOOR_UNITS = {
    "min_gbps": "Gb/s (gigabits per second, a link's rate: a Spark port is 200)",
    "min_busbw_gbps": "GB/s (gigabytes per second, as nccl-tests prints busbw: two Sparks show about 21.9)",
}


class FabricConfig(_Model):
    """The RoCE/InfiniBand link: interface for sockets, the per-node check, GID index and MTU."""

    # Every node's socket interface unless its `nodes[].socket_ifname` says otherwise.
    socket_ifname: str = "enp1s0f0np0"
    # What FabricCheck (components/fabric_check) does on each node before any container: enforce:
    # refuse `pulumi up` on a fabric NCCL would fail on (no ACTIVE port, no RoCE v2 IPv4 GID, MTUs
    # that disagree), before any container on any node; report: record the verdict in the stack
    # output `fabric` and go on; off: no check, NCCL gets the pinned HCAs (or the old default pair)
    # and the pinned GID index, as before.
    check: CheckMode = CheckMode.ENFORCE
    # unset: NCCL_IB_GID_INDEX is never set (NCCL picks a RoCE v2 IPv4 GID per device); resolve: each
    # node's FabricCheck finds that index and its containers get it; an index: that value everywhere.
    gid_index: GidIndex = "unset"
    # The MTU every node's fabric path must have; unset: they must agree with the head's.
    mtu: int | None = Field(default=None, ge=576, le=65535)
    # Before FabricCheck (kept working): the HCAs of every node, now the pin of every node
    # (`nodes[].ib_hca` is the per-node pin), and `ib_gid_index: N`, now `gid_index: N`. Leftovers
    # of the keys before 2026-12-01 (ba6b9b2): remove both once no stack file sets them
    # (Pulumi.dev.yaml and Pulumi.lab.yaml still set `ib_hca`); a stack that does must then move to
    # `nodes[].ib_hca` and `gid_index`, which gives its containers the same environment.
    ib_hca: list[str] | None = None
    ib_gid_index: int | None = Field(default=None, ge=0, le=255)
    # Before Ray: each worker's FabricCheck connects to the head's fabric_ip on this port (a listener
    # there for at most seconds) and measures one bounded copy (1 GiB or 3 s) over the fabric.
    probe_port: int = Field(default=29590, ge=1024, le=65535)
    # The probe's floor in Gb/s (gigabits per second, a link's rate: a Spark port is 200); the probe
    # reports GB/s (gigabytes), so 11.8 GB/s is 94.4 Gb/s. Below it `up` and `status` warn.
    min_gbps: float | None = None
    # Before any serving container, on every node at once (components/node_proof): the image's GPU
    # step and one torch.distributed group over the fabric (NCCL; gloo without containers.gpu_runtime)
    # on the head's probe_port, judged from NCCL's own lines. unset: as `check` says.
    node_proof: CheckMode | None = None
    # The node proof's floor on its all-reduce's bus bandwidth, in GB/s (gigabytes per second, as
    # nccl-tests prints busbw: NVIDIA's two-Spark setup shows about 21.9). Below it: refused under
    # enforce, recorded under report.
    min_busbw_gbps: float | None = None

    @field_validator("min_gbps", "min_busbw_gbps")
    @classmethod
    def _positive_floor(cls, v: float | None, info: Any) -> float | None:
        # The two floors differ by 8x (bits and bytes): every refusal says which unit its key is in.
        if v is not None and v <= 0:
            raise ValueError(
                f"{v:g}: give a positive floor in {FLOOR_UNITS[info.field_name]}, or leave it unset"
            )
        return v

    @field_validator("socket_ifname")
    @classmethod
    def _ifname(cls, v: str) -> str:
        return _check_ifname(v)

    @field_validator("check", "node_proof", mode="before")
    @classmethod
    def _check_off(cls, v: Any) -> Any:
        # YAML 1.1 (Pulumi's stack files) reads an unquoted `off` as false.
        return "off" if v is False else v

    @field_validator("gid_index", mode="before")
    @classmethod
    def _gid_text(cls, v: Any) -> Any:
        # `pulumi config set --path fabric.gid_index 4` stores the text "4".
        return int(v) if isinstance(v, str) and v.strip().isdigit() else v

    @field_validator("ib_hca")
    @classmethod
    def _hca(cls, v: list[str] | None) -> list[str] | None:
        return _check_hcas(v)

    @model_validator(mode="after")
    def _old_and_new(self) -> FabricConfig:
        if self.ib_gid_index is not None and "gid_index" in self.model_fields_set:
            raise ValueError(
                "fabric.ib_gid_index and fabric.gid_index are both set: ib_gid_index is the old name "
                f"of gid_index; keep only `gid_index: {self.ib_gid_index}` (or resolve, or unset)"
            )
        if self.min_busbw_gbps is not None and self.min_busbw_gbps > MAX_BUSBW_GBPS:
            raise ValueError(
                f"fabric.min_busbw_gbps {self.min_busbw_gbps:g} is in {FLOOR_UNITS['min_busbw_gbps']}, "
                f"and no RoCE pair of Sparks reaches {MAX_BUSBW_GBPS:g}: a link rate in Gb/s divided by 8 "
                "is GB/s"
            )
        if self.min_busbw_gbps is not None and self.proof is CheckMode.OFF:
            raise ValueError(
                "fabric.min_busbw_gbps is the node proof's floor, and the proof is off: set "
                "fabric.node_proof to enforce or report, or remove fabric.min_busbw_gbps (its unit: "
                f"{FLOOR_UNITS['min_busbw_gbps']})"
            )
        if self.gid_index == "resolve" and self.check is CheckMode.OFF:
            raise ValueError(
                "fabric.gid_index: resolve needs the check: set fabric.check to enforce or report"
            )
        return self

    @property
    def proof(self) -> CheckMode:
        """The node proof's mode: `node_proof`, or the check's when unset."""
        return self.node_proof if self.node_proof is not None else self.check

    @property
    def gid(self) -> str | int:
        """The GID setting with the old key folded in: "unset", "resolve" or an index."""
        return self.ib_gid_index if self.ib_gid_index is not None else self.gid_index


class RayConfig(_Model):
    """Cluster-wide Ray settings."""

    port: Port = 6379
    dashboard_port: Port = 8265
    # The dashboard listens on the head's fabric address only, unless told otherwise.
    dashboard_host: str | None = None

    @field_validator("dashboard_host")
    @classmethod
    def _dash(cls, v: str | None) -> str | None:
        return None if v is None else _check_host(v)


class Executor(str, Enum):
    """How vLLM reaches the GPUs of the other nodes."""

    # A Ray container on every node; `vllm serve` on the head drives them (the seed's procedure).
    RAY = "ray"
    # vLLM's own multi-node executor: one `vllm serve` per node, the others `--headless`; no Ray.
    MP = "mp"


# vLLM's own default (`ParallelConfig.master_port`): where the head's rank 0 waits for the others.
DEFAULT_MASTER_PORT = 29501


class ClusterConfig(_Model):
    """How the nodes form one vLLM engine: Ray, or vLLM's multi-node executor (`mp`)."""

    executor: Executor = Executor.RAY
    # executor mp only: the head's port (on its fabric address) that the headless ranks dial.
    master_port: Port = DEFAULT_MASTER_PORT

    @model_validator(mode="after")
    def _executor_keys(self) -> ClusterConfig:
        if self.executor is Executor.RAY and "master_port" in self.model_fields_set:
            raise _CrossFieldErrors(
                [
                    (
                        "cluster.master_port",
                        "not used by executor 'ray' (Ray has its own ray.port): remove it, "
                        "or set cluster.executor to 'mp'",
                    )
                ]
            )
        return self


class ContainerConfig(_Model):
    """How the Ray containers run on every node."""

    hf_cache: str = "~/.cache/huggingface"
    privileged: bool = False
    restart: RestartPolicy = RestartPolicy.UNLESS_STOPPED
    # Devices passed through (RoCE/IB verbs); the lab sets this to [].
    devices: list[str] = ["/dev/infiniband"]
    # GPUs requested from the NVIDIA runtime; false in the lab, which has none.
    gpu_runtime: bool = True
    shm_size_mb: int = Field(default=16384, ge=64)
    # host: the node's /dev/shm and IPC, as NCCL and vLLM's shared-memory queues expect on a Spark.
    # private: each container its own, for nodes that share one kernel (the lab): vLLM tells whether two
    # ranks share a node by whether one sees the other's /dev/shm segment.
    ipc: Literal["host", "private"] = "host"
    # The memlock ulimit of every container (-1: unlimited, what RDMA's pinned unified memory needs).
    # A node whose dockerd cannot grant it (the lab's 8 MiB hard limit) fails at container start.
    memlock_bytes: int = Field(default=-1, ge=-1)
    # Prefix of container names on every node (`qwen35-ray-head`, …).
    name_prefix: str = "qwen35"
    # A named volume per node (`<prefix>-compile-cache`) for what vLLM, torch.compile, Inductor,
    # Triton and FlashInfer compile at start: a restart, upgrade or rollback reuses it. Kept on
    # `destroy` as the checkpoint is (`model.keep_on_destroy`). false: every start compiles again.
    compile_cache: bool = True

    @field_validator("hf_cache")
    @classmethod
    def _hf(cls, v: str) -> str:
        return _check_path(v)

    @field_validator("devices")
    @classmethod
    def _devices(cls, v: list[str]) -> list[str]:
        for dev in v:
            if not re.match(r"^/dev/[A-Za-z0-9_/.-]+$", dev):
                raise ValueError(f"{dev!r} is not a /dev path")
        return v

    @field_validator("name_prefix")
    @classmethod
    def _prefix(cls, v: str) -> str:
        if not NODE_NAME.match(v):
            raise ValueError(f"{v!r}: lowercase letters, digits and '-'")
        return v
