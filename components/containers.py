"""Every container of the deployment as a pure value: the settings the vLLM, Ray, mp and health
containers share on a node (runtime, devices, limits, the HF and compile caches), the fabric
variables every process on a node needs, and the spec the graph turns into a `pulumi_docker.Container`.
Keeping the spec pure lets tests check every flag without a node or mocks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Union

from components.config import NodeConfig, RestartPolicy, StackConfig

if TYPE_CHECKING:
    import pulumi

# The image a container runs: its node's image ID, known only once that node's NodeImage is created
# (an Output in the program; a plain `sha256:` string in tests of the spec alone).
ImageId = Union[str, "pulumi.Output[str]"]  # noqa: UP007 (a string forward reference needs Union)

# Where the HF cache is mounted in every container (they run as root), and HF_HOME points there.
CONTAINER_HF_HOME = "/root/.cache/huggingface"

# Where every vLLM container mounts its node's compile cache volume (`containers.compile_cache`).
COMPILE_CACHE = "/root/.cache/qwen35-compile"

# Each compiler's cache under it, by the variable that moves it (read in the image's vLLM 0.17.1 and
# the torch, Triton and FlashInfer it ships). vLLM's torch.compile cache is VLLM_CACHE_ROOT's
# `torch_compile_cache/`, where vLLM points Inductor and Triton once it sets up that cache; these two
# catch what they build before or without it (Inductor's default is /tmp, Triton's ~/.triton).
# FlashInfer's JIT ops go to `$FLASHINFER_WORKSPACE_BASE/.cache/flashinfer`.
COMPILE_CACHE_ENV = {
    "VLLM_CACHE_ROOT": f"{COMPILE_CACHE}/vllm",
    "TORCHINDUCTOR_CACHE_DIR": f"{COMPILE_CACHE}/inductor",
    "TRITON_CACHE_DIR": f"{COMPILE_CACHE}/triton",
    "FLASHINFER_WORKSPACE_BASE": f"{COMPILE_CACHE}/flashinfer",
}

# Unified memory is pinned for RDMA: memlock must be unlimited; NCCL and vLLM want a large stack.
ULIMITS = (("memlock", -1, -1), ("stack", 67108864, 67108864))


def ulimits(memlock_bytes: int) -> tuple[tuple[str, int, int], ...]:
    """ULIMITS with the configured memlock (`containers.memlock_bytes`; -1 is unlimited)."""
    return tuple(
        (name, memlock_bytes, memlock_bytes) if name == "memlock" else (name, soft, hard)
        for name, soft, hard in ULIMITS
    )


# RDMA needs to pin memory; IPC_LOCK grants that without --privileged. Spelled as the daemon reports
# it back (CAP_…), or every refresh would see a change.
CAPABILITIES = ("CAP_IPC_LOCK",)

# With `on-failure`, a server that keeps crashing stops after this many tries instead of looping
# (each crash of a 120 GB model can leak unified memory until the node is rebooted).
ON_FAILURE_RETRIES = 5


@dataclass(frozen=True)
class Mount:
    """A bind mount (`source` is a host path) or a named volume (`volume=True`)."""

    source: str
    target: str
    volume: bool = False
    read_only: bool = False


@dataclass(frozen=True)
class ContainerSpec:
    """Everything about one container, as plain values. Secrets appear only by name."""

    name: str
    node: str
    role: str
    image: ImageId
    command: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    # Environment variable -> secret config key (`hf_token`, `api_key`); values never enter the spec.
    secret_env: dict[str, str] = field(default_factory=dict)
    # File in the container -> secret config key: written at the container's creation (pulumi-docker
    # `uploads`), for a secret that must not be in its environment (`docker inspect` shows that).
    secret_files: dict[str, str] = field(default_factory=dict)
    devices: tuple[str, ...] = ()
    ulimits: tuple[tuple[str, int, int], ...] = ULIMITS
    capabilities: tuple[str, ...] = CAPABILITIES
    privileged: bool = False
    mounts: tuple[Mount, ...] = ()
    restart: RestartPolicy = RestartPolicy.UNLESS_STOPPED
    max_retry_count: int | None = None
    init: bool = True
    network_mode: str = "host"
    ipc_mode: str = "host"
    # None: the container's own PID namespace.
    pid_mode: str | None = None
    shm_size_mb: int | None = None
    gpus: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    # Seconds `docker stop` waits before SIGKILL on replace/destroy.
    stop_grace_s: int = 30

    def env_list(self) -> list[str]:
        """The non-secret environment as Docker's `KEY=value` list, sorted so diffs are stable."""
        return [f"{k}={v}" for k, v in sorted(self.env.items())]


def compile_cache_volume_name(config: StackConfig) -> str:
    """The compile cache volume's name on every node (one volume per node, under the same name)."""
    return f"{config.containers.name_prefix}-compile-cache"


def compile_cache(config: StackConfig) -> tuple[tuple[Mount, ...], dict[str, str]]:
    """The compile cache's mount and variables for a vLLM container; none with the switch off."""
    if not config.containers.compile_cache:
        return (), {}
    return (Mount(compile_cache_volume_name(config), COMPILE_CACHE, volume=True),), dict(COMPILE_CACHE_ENV)


def host_path(path: str, user: str) -> str:
    """`~/…` as the node's absolute path for `user` (Docker does not expand `~` in bind mounts)."""
    if not path.startswith("~/"):
        return path
    home = "/root" if user == "root" else f"/home/{user}"
    return home + path[1:]


# What NCCL prints in every serving container: its init and network choice, nothing per message.
SERVING_NCCL_DEBUG = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET"}


@dataclass(frozen=True)
class NodeFabric:
    """What NCCL on one node is given: its HCAs and RoCE GID index (None: NCCL_IB_GID_INDEX unset).
    From that node's FabricCheck outputs, or from config alone when `fabric.check` is off."""

    ib_hca: tuple[str, ...]
    gid_index: int | None = None


def configured_fabric(config: StackConfig, node: NodeConfig) -> NodeFabric:
    """The node's NCCL settings from config alone (`fabric.check: off`): the pin and a pinned index."""
    gid = config.fabric.gid
    return NodeFabric(config.hca_pin(node) or (), gid if isinstance(gid, int) else None)


def fabric_env(config: StackConfig, node: NodeConfig, fabric: NodeFabric | None = None) -> dict[str, str]:
    """The fabric settings every process on `node` needs: its own address and the RDMA interfaces
    (`fabric`: what the node's FabricCheck decided; None: from config alone)."""
    fabric = fabric or configured_fabric(config, node)
    # The node's own interface: two nodes cabled on different ports name different ones.
    ifname = config.socket_ifname(node)
    env = {
        # vLLM and Ray must agree on the node's address: the fabric one, never the management one.
        "VLLM_HOST_IP": node.fabric_ip,
        "NCCL_SOCKET_IFNAME": ifname,
        "GLOO_SOCKET_IFNAME": ifname,
        "TP_SOCKET_IFNAME": ifname,
        "UCX_NET_DEVICES": ifname,
        "OMPI_MCA_btl_tcp_if_include": ifname,
        # No HCA (the lab pins none) turns InfiniBand off rather than letting NCCL guess.
        "NCCL_IB_DISABLE": "0" if fabric.ib_hca else "1",
        # NCCL's own account of the transport it chose (a few dozen lines per start): after the gate,
        # the serving ranks' network, HCAs and GID index are read from these (docs/fabric.md).
        **SERVING_NCCL_DEBUG,
        # Ray's memory monitor kills workers when unified memory looks "full" (the model fills it).
        "RAY_memory_monitor_refresh_ms": "0",
        "HF_HOME": CONTAINER_HF_HOME,
    }
    if config.hub_repo is not None:
        # The checkpoint is placed on every node by the program (components/checkpoint): serving never
        # talks to the Hub, and a node without its copy fails instead of downloading 120 GB on its own.
        env["HF_HUB_OFFLINE"] = "1"
    if fabric.ib_hca:
        # This node's own ports (names differ per node): leaving one out halves the bandwidth.
        env["NCCL_IB_HCA"] = ",".join(fabric.ib_hca)
    if fabric.gid_index is not None:
        # Never an empty value: NCCL parses "" as 0, the link-local GID.
        env["NCCL_IB_GID_INDEX"] = str(fabric.gid_index)
    return env


def node_container_spec(
    config: StackConfig,
    node: NodeConfig,
    *,
    name: str,
    role: str,
    image_id: ImageId,
    command: list[str],
    env: dict[str, str],
    secret_env: dict[str, str],
    extra_mounts: tuple[Mount, ...] = (),
    stop_grace_s: int = 30,
    pid_mode: str | None = None,
) -> ContainerSpec:
    """The settings every container of the deployment shares on `node` (runtime, devices, limits,
    the HF cache and the compile cache): every one of them runs vLLM."""
    c = config.containers
    hf_cache = Mount(host_path(config.hf_cache(node), config.node_user(node)), CONTAINER_HF_HOME)
    cache_mounts, cache_env = compile_cache(config)
    return ContainerSpec(
        name=name,
        node=node.name,
        role=role,
        image=image_id,
        command=tuple(command),
        env={**env, **cache_env},
        secret_env=secret_env,
        devices=tuple(c.devices),
        ulimits=ulimits(c.memlock_bytes),
        privileged=c.privileged,
        # Privileged already grants every capability; adding one would only add noise to diffs.
        capabilities=() if c.privileged else CAPABILITIES,
        mounts=(hf_cache, *cache_mounts, *extra_mounts),
        restart=c.restart,
        max_retry_count=ON_FAILURE_RETRIES if c.restart is RestartPolicy.ON_FAILURE else None,
        # Host IPC shares /dev/shm with the host; shm_size covers a container with its own.
        ipc_mode=c.ipc,
        pid_mode=pid_mode,
        shm_size_mb=c.shm_size_mb,
        gpus="all" if c.gpu_runtime else None,
        labels={"qwen35.role": role, "qwen35.node": node.name},
        stop_grace_s=stop_grace_s,
    )
