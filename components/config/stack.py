"""StackConfig: every section in one model, and the checks that span sections (one head, distinct
names and addresses, ports that do not collide, GPUs that match the parallelism).
"""

from __future__ import annotations

import difflib

from pydantic import Field, model_validator

from components.config.answers import AnswersConfig, AnswersMode
from components.config.bench import BenchConfig, BenchMode
from components.config.checkpoint import HUB_REPO, ModelConfig
from components.config.cluster import (
    FLOOR_UNITS,
    LEGACY_IB_HCA,
    ClusterConfig,
    ContainerConfig,
    Executor,
    FabricCheckMode,
    FabricConfig,
    RayConfig,
    RestartPolicy,
)
from components.config.fields import _CrossFieldErrors, _Model
from components.config.health import HealthConfig, HealthMode
from components.config.image import CopyConfig, ImageConfig
from components.config.nodes import (
    RAY_CLIENT_SERVER_PORT,
    RAY_DASHBOARD_AGENT_LISTEN_PORT,
    NodeConfig,
    Role,
    SshConfig,
)
from components.config.serve import ServeConfig
from components.node_programs.wire import bench_prompt_slack


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
        problems: list[tuple[str, str]] = []
        heads = [i for i, n in enumerate(self.nodes) if n.role == Role.HEAD]
        if len(heads) > 1:
            problems.append(("nodes", f"exactly one head allowed, found {len(heads)} (nodes {heads})"))
        if not heads and self.nodes[0].role == Role.WORKER:
            problems.append(
                ("nodes", "no node has role 'head' (and the first node is a worker): mark one `role: head`")
            )
        for attr in ("name", "host", "fabric_ip"):
            seen: dict[str, int] = {}
            for i, node in enumerate(self.nodes):
                value = getattr(node, attr)
                if value in seen:
                    problems.append((f"nodes.{i}.{attr}", f"{value!r} is also used by nodes.{seen[value]}"))
                seen.setdefault(value, i)
        names = {n.name for n in self.nodes}
        for i, node in enumerate(self.nodes):
            if node.proxy_jump and node.proxy_jump == node.name:
                problems.append((f"nodes.{i}.proxy_jump", "a node cannot jump through itself"))
            elif node.proxy_jump and "@" not in node.proxy_jump and node.proxy_jump not in names:
                problems.append(
                    (
                        f"nodes.{i}.proxy_jump",
                        f"{node.proxy_jump!r} is not a node name nor user@host[:port]",
                    )
                )
        for node in self.model.cache_dirs:
            if node not in names:
                hint = difflib.get_close_matches(node, sorted(names), n=1)
                problems.append(
                    (
                        f"model.cache_dirs.{node}",
                        "not a node of this stack" + (f" (did you mean {hint[0]!r}?)" if hint else ""),
                    )
                )
        if self.model.repo is None and self.model.source == "cache" and self.serve.model.startswith("/"):
            problems.append(
                ("model.repo", "source: cache needs the Hub repo id the cache holds (serve.model is a path)")
            )
        problems += self._fabric_problems()
        total_gpus = sum(n.gpus for n in self.nodes)
        need = self.serve.tensor_parallel_size * self.serve.pipeline_parallel_size
        if need != total_gpus:
            problems.append(
                (
                    "serve.tensor_parallel_size",
                    f"tensor_parallel_size × pipeline_parallel_size = {need}, but the nodes have "
                    f"{total_gpus} GPUs in all: make them equal",
                )
            )
        problems += self._mp_problems()
        problems += self._cpu_problems()
        problems += self._health_problems()
        problems += self._bench_problems()
        problems += self._answers_problems()
        if problems:
            raise _CrossFieldErrors(problems)
        return self

    def _health_problems(self) -> list[tuple[str, str]]:
        """The health ports against every other port the stack listens on; lab-only keys under off."""
        health = self.health
        problems = []
        if health.mode is HealthMode.OFF:
            problems += [
                (f"nodes.{i}.{key}", "is read by the health programs only, and health.mode is off: remove it")
                for i, n in enumerate(self.nodes)
                for key in ("docker_socket", "meminfo_path")
                if key in n.model_fields_set
            ]
            return problems
        if self.containers.restart is RestartPolicy.ALWAYS:
            # Docker starts an `always` container at every daemon start, even one stopped by hand: a
            # reboot would bring back a cluster the watchdog stopped for a spent budget.
            problems.append(
                (
                    "containers.restart",
                    "'always' restarts, at every reboot, the containers the watchdog stopped when its "
                    "restart budget was spent: use unless-stopped (the default), or set health.mode to off",
                )
            )
        taken = {"serve.port": self.serve.port, "fabric.probe_port": self.fabric.probe_port}
        if self.cluster.executor is Executor.MP:
            taken["cluster.master_port"] = self.cluster.master_port
        else:
            taken["ray.port"] = self.ray.port
            taken["ray.dashboard_port"] = self.ray.dashboard_port
            for i, node in enumerate(self.nodes):
                for key, value in node.ray_ports.model_dump().items():
                    if value is not None:
                        taken[f"nodes.{i}.ray_ports.{key}"] = value
        for key in ("port", "agent_port"):
            value = getattr(health, key)
            for other, used in taken.items():
                low_high = other.endswith(("min_worker_port", "max_worker_port"))
                if used == value and not low_high:
                    problems.append((f"health.{key}", f"{value} is {other} too: choose another port"))
            for i, node in enumerate(self.nodes):
                low, high = node.ray_ports.min_worker_port, node.ray_ports.max_worker_port
                if self.cluster.executor is Executor.RAY and low and high and low <= value <= high:
                    problems.append(
                        (f"health.{key}", f"{value} is in nodes.{i}.ray_ports' worker range {low}-{high}: "
                         "choose another port")
                    )  # fmt: skip
        return problems

    def _bench_problems(self) -> list[tuple[str, str]]:
        """The bench's longest request (its prompt, or a short prompt and its output) fits
        `serve.max_model_len`, when that is set."""
        bench, limit = self.bench, self.serve.max_model_len
        if bench.mode is BenchMode.OFF or limit is None:
            return []
        # The prompt may come out up to its slack over prompt_tokens (the program sizes it to within
        # that), and 8 more for the nonce and the special tokens.
        requests = {
            "bench.prompt_tokens": bench.prompt_tokens + bench_prompt_slack(bench.prompt_tokens) + 8,
            "bench.output_tokens": bench.output_tokens + 32,
        }
        return [
            (
                key,
                f"a bench request of about {tokens} tokens exceeds serve.max_model_len {limit}: lower it",
            )
            for key, tokens in requests.items()
            if tokens > limit
        ]

    def _answers_problems(self) -> list[tuple[str, str]]:
        """The answer check's longest request (the long prompt, its generation and the chat
        template's few tokens) fits `serve.max_model_len`, when that is set."""
        answers, limit = self.answers, self.serve.max_model_len
        if answers.mode is AnswersMode.OFF or limit is None:
            return []
        tokens = answers.long_prompt_tokens + answers.max_tokens + 64
        if tokens <= limit:
            return []
        return [
            (
                "answers.long_prompt_tokens",
                f"the long prompt and its generation, about {tokens} tokens, exceed serve.max_model_len "
                f"{limit}: lower it",
            )
        ]

    def _mp_problems(self) -> list[tuple[str, str]]:
        """Under executor mp: no Ray key is set (nothing would read it), and the world splits evenly
        over the nodes (vLLM gives every node the same number of local ranks)."""
        if self.cluster.executor is not Executor.MP:
            return []
        unused = (
            "not used by cluster.executor 'mp' (no Ray runs): remove it, or set cluster.executor to 'ray'"
        )
        problems = [("ray", unused)] if "ray" in self.model_fields_set else []
        if self.cluster.master_port == self.serve.port:
            problems.append(
                (
                    "cluster.master_port",
                    f"{self.cluster.master_port} is serve.port too: rank 0 listens on both on the head; "
                    "choose another port",
                )
            )
        problems += [
            (f"nodes.{i}.ray_ports", unused)
            for i, n in enumerate(self.nodes)
            if "ray_ports" in n.model_fields_set
        ]
        if "ray_version" in self.image.model_fields_set:
            problems.append(("image.ray_version", unused))
        per_node = self.head.gpus
        problems += [
            (
                f"nodes.{i}.gpus",
                f"{n.name} has {n.gpus} GPUs but the head {self.head.name} has {per_node}: executor mp "
                "splits the world evenly over the nodes: give every node the same gpus",
            )
            for i, n in enumerate(self.nodes)
            if n.gpus != per_node
        ]
        return problems

    def _cpu_problems(self) -> list[tuple[str, str]]:
        """`serve.cpu` only where vLLM's CPU build serves: no GPU runtime, executor mp, known nodes."""
        cpu = self.serve.cpu
        if cpu is None:
            return []
        problems = []
        if self.containers.gpu_runtime:
            problems.append(
                ("serve.cpu", "is for vLLM's CPU build (the lab) and this stack runs GPUs "
                 "(containers.gpu_runtime): remove serve.cpu")
            )  # fmt: skip
        if self.cluster.executor is not Executor.MP:
            problems.append(
                ("serve.cpu", "vLLM's CPU platform refuses the Ray executor: set cluster.executor to 'mp'")
            )
        names = sorted(n.name for n in self.nodes)
        for node in cpu.threads_bind:
            if node not in names:
                hint = difflib.get_close_matches(node, names, n=1)
                problems.append(
                    (f"serve.cpu.threads_bind.{node}",
                     "not a node of this stack" + (f" (did you mean {hint[0]!r}?)" if hint else ""))
                )  # fmt: skip
        return problems

    def _head_ports(self) -> dict[str, int]:
        """The head's listening ports other than the probe's, by the key that sets each."""
        if self.cluster.executor is Executor.MP:
            return {"serve.port": self.serve.port, "cluster.master_port": self.cluster.master_port}
        ports = {
            "serve.port": self.serve.port,
            "ray.port": self.ray.port,
            "ray.dashboard_port": self.ray.dashboard_port,
        }
        for key, port in self.head.ray_ports.model_dump().items():
            if port is not None and key not in ("min_worker_port", "max_worker_port"):
                ports[f"nodes.{self.nodes.index(self.head)}.ray_ports.{key}"] = port
        # What Ray binds when config leaves it to Ray (the StackClaim claims these too).
        ports["Ray's client server port (fixed by Ray)"] = RAY_CLIENT_SERVER_PORT
        if self.head.ray_ports.dashboard_agent_listen_port is None:
            ports["Ray's default dashboard agent port (nodes[].ray_ports.dashboard_agent_listen_port)"] = (
                RAY_DASHBOARD_AGENT_LISTEN_PORT
            )
        return ports

    def _probe_port_problems(self) -> list[tuple[str, str]]:
        """fabric.probe_port is none of the head's other ports: a container holding it would make the
        next probe (a drift repaired by `up`) fail as an unreachable head."""
        fabric = self.fabric
        if (fabric.check is FabricCheckMode.OFF and fabric.proof is FabricCheckMode.OFF) or len(
            self.nodes
        ) < 2:
            return []
        port = self.fabric.probe_port
        rp = self.head.ray_ports
        taken = [key for key, value in self._head_ports().items() if value == port]
        ray = self.cluster.executor is Executor.RAY
        if (
            ray
            and rp.min_worker_port
            and rp.max_worker_port
            and rp.min_worker_port <= port <= rp.max_worker_port
        ):
            i = self.nodes.index(self.head)
            taken.append(
                f"inside nodes.{i}.ray_ports.min_worker_port–max_worker_port "
                f"({rp.min_worker_port}–{rp.max_worker_port})"
            )
        return [
            (
                "fabric.probe_port",
                f"{port} is {key} too: each worker's fabric probe and the node proof's group listen "
                "there on the head; choose another fabric.probe_port",
            )
            for key in taken
        ]

    def _fabric_problems(self) -> list[tuple[str, str]]:
        problems = self._probe_port_problems()
        if self.fabric.min_busbw_gbps is not None and len(self.nodes) < 2:
            problems.append(
                (
                    "fabric.min_busbw_gbps",
                    f"one node forms no group, so the node proof measures no bus bandwidth (the floor, in "
                    f"{FLOOR_UNITS['min_busbw_gbps']}, is never compared): remove it",
                )
            )
        for i, node in enumerate(self.nodes):
            if node.ib_hca is not None and self.fabric.ib_hca is not None:
                problems.append(
                    (
                        f"nodes.{i}.ib_hca",
                        "fabric.ib_hca (the old pin of every node) is set too: move it to each "
                        "node's nodes[].ib_hca and remove fabric.ib_hca",
                    )
                )
            if node.host_root is not None and self.fabric.proof is FabricCheckMode.OFF:
                problems.append(
                    (
                        f"nodes.{i}.host_root",
                        "is read by the node proof only, and fabric.node_proof is off: remove it",
                    )
                )
            if node.sysfs_root is not None and self.fabric.check is FabricCheckMode.OFF:
                problems.append(
                    (
                        f"nodes.{i}.sysfs_root",
                        "is read by FabricCheck only, and fabric.check is off: remove it",
                    )
                )
        return problems

    def hca_pin(self, node: NodeConfig) -> tuple[str, ...] | None:
        """The node's pinned HCAs: `nodes[].ib_hca`, else the old `fabric.ib_hca`; with the check off
        and no pin, the old default pair (what such a stack always deployed). None: FabricCheck's."""
        pin = node.ib_hca if node.ib_hca is not None else self.fabric.ib_hca
        if pin is None and self.fabric.check is FabricCheckMode.OFF:
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
