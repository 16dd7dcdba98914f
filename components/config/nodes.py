"""The `nodes` and `ssh` sections: the cluster's machines and how the program reaches them."""

from __future__ import annotations

import ipaddress
from enum import Enum

from pydantic import Field, field_validator

from components.config.fields import (
    ABS_PATH,
    NODE_NAME,
    USER,
    ImageStore,
    Port,
    _check_hcas,
    _check_host,
    _check_ifname,
    _check_path,
    _check_user,
    _Model,
)

# The GB10's unified memory; what a node has when config says nothing else (nodes[].memory_gb).
GB10_MEMORY_GB = 128.0


class Role(str, Enum):
    HEAD = "head"
    WORKER = "worker"


# Ports Ray binds on a node when config leaves them to Ray: the head's client server and every
# node's dashboard agent (Ray 2.x defaults); other unset Ray ports are chosen free by Ray itself.
RAY_CLIENT_SERVER_PORT = 10001
RAY_DASHBOARD_AGENT_LISTEN_PORT = 52365


class RayPorts(_Model):
    """Ray's per-node ports. Only needed when two Ray nodes share one kernel (the lab)."""

    node_manager_port: Port | None = None
    object_manager_port: Port | None = None
    metrics_export_port: Port | None = None
    dashboard_agent_listen_port: Port | None = None
    dashboard_agent_grpc_port: Port | None = None
    runtime_env_agent_port: Port | None = None
    min_worker_port: Port | None = None
    max_worker_port: Port | None = None


class NodeConfig(_Model):
    """One machine of the cluster."""

    name: str
    host: str
    fabric_ip: str
    role: Role | None = None
    port: Port | None = None
    user: str | None = None
    proxy_jump: str | None = None
    gpus: int = Field(default=1, ge=0, le=64)
    # The node's memory in GB (10^9 bytes) that its GPUs share: the GB10's 128 GB of unified memory.
    # The memory-fit preflight splits it over the node's GPUs (components/model_support/memory_fit.py).
    memory_gb: float = Field(default=GB10_MEMORY_GB, gt=8, le=100_000)
    # The node's Docker image store. A containerd-store node may hold an image without every layer
    # blob, so the copy tree never uses one as a source; NodeImage checks the declaration.
    image_store: ImageStore = "classic"
    ray_ports: RayPorts = RayPorts()
    # This node's HCAs for NCCL_IB_HCA (`dev` or `dev:port`); unset: FabricCheck's ACTIVE ports.
    ib_hca: list[str] | None = None
    # This node's socket interface (NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME, …, and its FabricCheck);
    # unset: `fabric.socket_ifname`. Two Sparks cabled on different ports name different interfaces.
    socket_ifname: str | None = None
    # LAB ONLY: a folder laid out like /sys (plus `ip-addr.json`, what `ip -j addr show` prints) that
    # FabricCheck reads instead of the node's own; the lab's machines have no RDMA to read.
    sysfs_root: str | None = None
    # The node's Docker socket, mounted into its health watchdog or agent (the lab's daemons each
    # have their own).
    docker_socket: str = "/var/run/docker.sock"
    # LAB ONLY: a crafted meminfo the health programs read instead of the node's /proc/meminfo.
    meminfo_path: str | None = None
    # LAB ONLY: a folder laid out like `/` (proc/driver/nvidia/version, proc/sys/kernel/osrelease,
    # sys/class/infiniband/<dev>/fw_ver, plus `nvidia-smi.txt`: what nvidia-smi prints) where the node
    # proof reads the host's software instead of the node's own.
    host_root: str | None = None

    @field_validator("ib_hca")
    @classmethod
    def _hca(cls, v: list[str] | None) -> list[str] | None:
        return _check_hcas(v)

    @field_validator("socket_ifname")
    @classmethod
    def _ifname(cls, v: str | None) -> str | None:
        return None if v is None else _check_ifname(v)

    @field_validator("docker_socket")
    @classmethod
    def _socket(cls, v: str) -> str:
        if not ABS_PATH.match(v) or not v.startswith("/"):
            raise ValueError(
                f"{v!r}: the absolute path of the node's Docker socket (default /var/run/docker.sock)"
            )
        return v

    @field_validator("meminfo_path")
    @classmethod
    def _meminfo(cls, v: str | None) -> str | None:
        if v is not None and (not ABS_PATH.match(v) or not v.startswith("/") or v == "/proc/meminfo"):
            raise ValueError(
                f"{v!r}: a lab-only absolute path to a crafted meminfo (real nodes read /proc/meminfo: "
                "leave it unset)"
            )
        return v

    @field_validator("host_root")
    @classmethod
    def _host_root(cls, v: str | None) -> str | None:
        if v is not None and (not ABS_PATH.match(v) or not v.startswith("/") or v.rstrip("/") == ""):
            raise ValueError(
                f"{v!r}: a lab-only absolute path to a test tree laid out like / (real nodes read their "
                "own: leave it unset)"
            )
        return v

    @field_validator("sysfs_root")
    @classmethod
    def _sysfs(cls, v: str | None) -> str | None:
        if v is not None and (not ABS_PATH.match(v) or not v.startswith("/") or v.rstrip("/") == "/sys"):
            raise ValueError(
                f"{v!r}: a lab-only absolute path to a test tree (real nodes read /sys: leave it unset)"
            )
        return v

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not NODE_NAME.match(v):
            raise ValueError(f"{v!r}: use lowercase letters, digits and '-' (it names containers)")
        return v

    @field_validator("host")
    @classmethod
    def _host(cls, v: str) -> str:
        return _check_host(v)

    @field_validator("fabric_ip")
    @classmethod
    def _fabric(cls, v: str) -> str:
        try:
            return str(ipaddress.ip_address(v))
        except ValueError:
            raise ValueError(
                f"{v!r} is not an IP address (the node's address on the RoCE/IB fabric)"
            ) from None

    @field_validator("user")
    @classmethod
    def _user(cls, v: str | None) -> str | None:
        return None if v is None else _check_user(v)

    @field_validator("proxy_jump")
    @classmethod
    def _jump(cls, v: str | None) -> str | None:
        if v is None:
            return v
        user, _, hostport = v.rpartition("@")
        host, _, port = hostport.partition(":")
        if user and not USER.match(user):
            raise ValueError(f"{v!r}: bad user in jump host")
        _check_host(host)
        if port and not (port.isdigit() and 1 <= int(port) <= 65535):
            raise ValueError(f"{v!r}: bad port in jump host")
        return v


class SshConfig(_Model):
    """SSH defaults for every node; host keys are always pinned through `known_hosts`."""

    user: str = "root"
    port: Port = 22
    identity_file: str | None = None
    known_hosts: str

    @field_validator("user")
    @classmethod
    def _user(cls, v: str) -> str:
        return _check_user(v)

    @field_validator("identity_file", "known_hosts")
    @classmethod
    def _paths(cls, v: str | None) -> str | None:
        return _check_path(v)
