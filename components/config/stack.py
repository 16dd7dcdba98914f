"""StackConfig: every section in one model, validated across sections (the checks are in
cross_checks.py), and what the program reads across sections (the head, a node's pin, cache, user).
"""

from __future__ import annotations

from pydantic import Field, model_validator

from components.config.answers import AnswersConfig
from components.config.bench import BenchConfig
from components.config.checkpoint import HUB_REPO, ModelConfig
from components.config.cluster import (
    LEGACY_IB_HCA,
    ClusterConfig,
    ContainerConfig,
    FabricConfig,
    RayConfig,
)
from components.config.cross_checks import cross_problems
from components.config.fields import CheckMode, _CrossFieldErrors, _Model
from components.config.health import HealthConfig
from components.config.image import CopyConfig, ImageConfig
from components.config.nodes import NodeConfig, Role, SshConfig
from components.config.serve import ServeConfig


class StackConfig(_Model):
    """Everything a deployment needs, validated across fields."""

    nodes: list[NodeConfig] = Field(min_length=1)
    ssh: SshConfig
    image: ImageConfig = ImageConfig()
    serve: ServeConfig = ServeConfig()
    fabric: FabricConfig = FabricConfig()
    ray: RayConfig = RayConfig()
    cluster: ClusterConfig = ClusterConfig()
    containers: ContainerConfig = ContainerConfig()
    copy_: CopyConfig = Field(default=CopyConfig(), alias="copy")
    model: ModelConfig = ModelConfig()
    health: HealthConfig = HealthConfig()
    bench: BenchConfig = BenchConfig()
    answers: AnswersConfig = AnswersConfig()

    @model_validator(mode="after")
    def _cross_checks(self) -> StackConfig:
        problems = cross_problems(self)
        if problems:
            raise _CrossFieldErrors(problems)
        return self

    def hca_pin(self, node: NodeConfig) -> tuple[str, ...] | None:
        """The node's pinned HCAs: `nodes[].ib_hca`, else the old `fabric.ib_hca`; with the check off
        and no pin, the old default pair (what such a stack always deployed). None: FabricCheck's."""
        pin = node.ib_hca if node.ib_hca is not None else self.fabric.ib_hca
        if pin is None and self.fabric.check is CheckMode.OFF:
            return LEGACY_IB_HCA
        return None if pin is None else tuple(pin)

    def socket_ifname(self, node: NodeConfig) -> str:
        """The node's socket interface: `nodes[].socket_ifname`, else `fabric.socket_ifname`."""
        return node.socket_ifname or self.fabric.socket_ifname

    @property
    def head(self) -> NodeConfig:
        for node in self.nodes:
            if node.role == Role.HEAD:
                return node
        return self.nodes[0]

    @property
    def workers(self) -> list[NodeConfig]:
        head = self.head
        return [n for n in self.nodes if n is not head]

    @property
    def hub_repo(self) -> str | None:
        """The Hub repo every node holds: `model.repo`, else `serve.model` when it is a Hub id."""
        if self.model.repo:
            return self.model.repo
        return self.serve.model if HUB_REPO.match(self.serve.model) else None

    def hf_cache(self, node: NodeConfig) -> str:
        """The node's HF cache dir (HF_HOME of its containers): `model.cache_dirs`, else containers'."""
        return self.model.cache_dirs.get(node.name, self.containers.hf_cache)

    def node_user(self, node: NodeConfig) -> str:
        return node.user or self.ssh.user

    def node_port(self, node: NodeConfig) -> int:
        return node.port or self.ssh.port

    def jump_spec(self, node: NodeConfig) -> str | None:
        """`user@host:port` of the node's jump host (node names resolved), or None."""
        if not node.proxy_jump:
            return None
        by_name = {n.name: n for n in self.nodes}
        jump = by_name.get(node.proxy_jump)
        if jump is None:
            return node.proxy_jump
        return f"{self.node_user(jump)}@{jump.host}:{self.node_port(jump)}"
