"""Qwen35Deployment: the whole cluster as one component (providers, images, Ray, vLLM, readiness).

Order, enforced by dependencies (and reversed by `pulumi destroy`):
docker provider per node → FabricCheck per node (the head's first: its MTU is every worker's
reference; none under `fabric.check: off`) → the image on the head (strategy `prebuilt`: already
there, nothing built; `hybrid` or `graft`: BuiltImage builds it) → NodeImage per node →
model-support check on the head, and the node proof on every node (after every NodeImage and
FabricCheck; none under `fabric.node_proof: off`) → Ray head → Ray workers → vLLM server on the
head → readiness gate (every container after every node's FabricCheck and the node proof) → answer
check on the head (none under `answers.mode: off`) → serve bench on the head (none under
`bench.mode: off`) and health (none under `health.mode: off`): the
watchdog's state volume on the head, an agent on every worker, then the watchdog on the head. Under
`cluster.executor: mp` no Ray runs: the headless vLLM ranks (one per worker) → the serving rank on
the head → readiness gate (see components/mp_executor.py). Every container runs the `sha256:` image
ID its node's NodeImage reports and the NCCL settings its node's FabricCheck decided, so a rebuilt
image or a changed GID index replaces exactly the containers it concerns (under mp: every rank, as
the ranks are one world).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_docker as docker

from components.answer_check import AnswerCheck
from components.checkpoint import Checkpoint, checkpoint_tree
from components.config import (
    AnswersMode,
    BenchMode,
    Executor,
    FabricCheckMode,
    HealthMode,
    ImageStrategy,
    NodeConfig,
    StackConfig,
)
from components.containers import (
    ContainerSpec,
    NodeFabric,
    compile_cache_volume_name,
    configured_fabric,
    fabric_env,
)
from components.fabric_check import FabricCheck, probe_after
from components.health.containers import (
    agent_container_spec,
    health_config,
    health_volume_name,
    node_need_bytes,
    watchdog_container_spec,
)
from components.health_secret import HealthSecret
from components.image_build.component import BuiltImage, BuiltImageArgs, image_ref
from components.layout import (
    ANSWER_CHECK_OUTPUTS,
    FABRIC_OUTPUTS,
    MODEL_SUPPORT_OUTPUTS,
    NODE_PROOF_OUTPUTS,
    SERVE_BENCH_OUTPUTS,
    answer_check_inputs,
    cluster_proof,
    fabric_check_inputs,
    health_output,
    memory_inputs,
    nccl_transport,
    node_container_names,
    node_proof_inputs,
    probe_input,
    scrape_targets,
)
from components.model_support import ModelSupportCheck
from components.mp_executor import (
    WORLD_ENV,
    mp_container_name,
    mp_container_spec,
    mp_serve_argv,
    rank_identity,
    ranked_nodes,
    world_digest,
)
from components.node_image import NodeImage, copy_tree
from components.node_proof import NodeProof
from components.nodes import NodeAccess, node_access
from components.ray_cluster import dashboard_host, ray_container_name, ray_container_spec, ray_tmp_volume_name
from components.readiness_gate import ReadinessGate
from components.serve_bench import ServeBench
from components.stack_claim import StackClaim, claimed_ports
from components.vllm_server import (
    endpoint_url,
    local_url,
    serve_argv,
    vllm_container_name,
    vllm_container_spec,
)


@dataclass(frozen=True)
class DeploymentArgs:
    """The validated stack config plus the secrets (secret Outputs, or None)."""

    config: StackConfig
    hf_token: pulumi.Output[str] | None = None
    api_key: pulumi.Output[str] | None = None


def present_secrets(wanted: Mapping[str, str], secrets: dict[str, Any]) -> dict[str, Any]:
    """`wanted` (a variable or file -> a secret's key) with each key's value, for the secrets set."""
    return {target: secrets[key] for target, key in wanted.items() if secrets.get(key) is not None}


def container_envs(
    spec: ContainerSpec, secrets: dict[str, Any], env_list: pulumi.Input[list[str]] | None = None
) -> pulumi.Input[list[str]]:
    """Docker's `KEY=value` list (`env_list`, else the spec's); secret variables are added only when
    set, and make the list secret."""
    plain = spec.env_list() if env_list is None else env_list
    present = present_secrets(spec.secret_env, secrets)
    if not present:
        return plain
    names = sorted(present)
    joined = pulumi.Output.all(plain, *(present[n] for n in names)).apply(
        lambda values: list(values[0]) + [f"{n}={v}" for n, v in zip(names, values[1:], strict=True)]
    )
    return pulumi.Output.secret(joined)


def container_args(
    spec: ContainerSpec, secrets: dict[str, Any], env_list: pulumi.Input[list[str]] | None = None
) -> dict[str, Any]:
    """A ContainerSpec as `pulumi_docker.Container` arguments (`env_list`: its environment, when it
    holds values known only once a resource is created)."""
    return {
        "name": spec.name,
        "image": spec.image,
        # The image's entrypoint is the manual procedure's wrapper script: run our command instead.
        "entrypoints": [spec.command[0]],
        "command": list(spec.command[1:]),
        "envs": container_envs(spec, secrets, env_list),
        "network_mode": spec.network_mode,
        "ipc_mode": spec.ipc_mode,
        "pid_mode": spec.pid_mode,
        "shm_size": spec.shm_size_mb,
        "gpus": spec.gpus,
        "devices": [
            docker.ContainerDeviceArgs(host_path=d, container_path=d, permissions="rwm") for d in spec.devices
        ]
        or None,
        "ulimits": [docker.ContainerUlimitArgs(name=n, soft=s, hard=h) for n, s, h in spec.ulimits],
        # `drops` stated empty: the provider reads it back as [] and a fresh stack's first refresh would
        # otherwise report `~capabilities` on every container (seen under the real engine).
        "capabilities": docker.ContainerCapabilitiesArgs(adds=list(spec.capabilities), drops=[])
        if spec.capabilities
        else None,
        "privileged": spec.privileged,
        "init": spec.init,
        "restart": spec.restart.value,
        "max_retry_count": spec.max_retry_count,
        "volumes": [
            docker.ContainerVolumeArgs(volume_name=m.source, container_path=m.target, read_only=m.read_only)
            if m.volume
            else docker.ContainerVolumeArgs(
                host_path=m.source, container_path=m.target, read_only=m.read_only
            )
            # In the order the provider reads them back (by container path). `volumes` is a set, and
            # the bridge rebuilds its inputs from what refresh read by position: a declared order
            # that differs swapped the watchdog's socket and state volume there, and the next
            # refresh wanted to replace it (seen under the real engine).
            for m in sorted(spec.mounts, key=lambda m: m.target)
        ],
        "labels": [docker.ContainerLabelArgs(label=k, value=v) for k, v in sorted(spec.labels.items())],
        # Refresh records a stopped container as `must_run: false` (it stays on the node, with its
        # logs), so `up --refresh` starts it again in place.
        "must_run": True,
        "destroy_grace_seconds": spec.stop_grace_s,
        "logs": False,
        "attach": False,
        "uploads": container_uploads(spec, secrets),
    }


def container_uploads(
    spec: ContainerSpec, secrets: dict[str, Any]
) -> list[docker.ContainerUploadArgs] | None:
    """The spec's secret files as uploads, each content a secret (None: the spec has none)."""
    files = present_secrets(spec.secret_files, secrets)
    return [
        docker.ContainerUploadArgs(file=path, content=pulumi.Output.secret(value), permissions="0600")
        for path, value in sorted(files.items())
    ] or None


class Qwen35Deployment(pulumi.ComponentResource):
    """Everything one stack deploys, in dependency order: each step below registers one stage."""

    def __init__(self, name: str, args: DeploymentArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("qwen35:index:Deployment", name, None, opts)
        self.config = args.config
        self.access: dict[str, NodeAccess] = node_access(self.config)
        self.providers = self._docker_providers(name)
        self.claims = self._stack_claims(name)
        self.health_secret = self._health_secret(name)
        secrets = {
            "hf_token": args.hf_token,
            "api_key": args.api_key,
            # Secret already (additional_secret_outputs); said again so no path can carry it plain.
            "health_secret": pulumi.Output.secret(self.health_secret.secret) if self.health_secret else None,
        }
        self.fabric_checks: dict[str, FabricCheck] = self._fabric_checks(name)
        self.image = self._image_build(name)
        self.image_ref = image_ref(self.config.image)
        self.node_images: dict[str, NodeImage] = place_images(name, self, self.image_ref, self.image)
        self.checkpoints: dict[str, Checkpoint] = place_checkpoints(name, self, args.hf_token)
        self.model_support = self._model_support_check(name)
        self.node_proof: NodeProof | None = self._node_proof(name)
        self.compile_caches: dict[str, docker.Volume] = self._compile_caches(name)
        self.ray_tmp: docker.Volume | None = None
        self.ray_containers: dict[str, docker.Container] = {}
        # Executor mp: every worker's headless vLLM rank, by node (the head's rank is `server`).
        self.ranks: dict[str, docker.Container] = {}
        if self.config.cluster.executor is Executor.MP:
            specs = self._mp_world(name, secrets)
            self.ranks = self._headless_ranks(name, specs, secrets)
            self.server = self._mp_head(name, specs, secrets)
        else:
            self.ray_tmp, self.ray_containers = self._ray_cluster(name, secrets)
            self.server = self._vllm_server(name, secrets)
        self.ready = self._readiness_gate(name, args.api_key)
        self.answers: AnswerCheck | None = self._answer_check(name, args.api_key)
        self.bench: ServeBench | None = self._serve_bench(name, args.api_key)
        self.health_volume: docker.Volume | None = None
        self.health_agents: dict[str, docker.Container] = {}
        self.watchdog: docker.Container | None = None
        if self.config.health.mode is not HealthMode.OFF:
            self.health_volume, self.health_agents, self.watchdog = self._health(name, secrets)
        self.outputs = self._stack_outputs()
        self.register_outputs(self.outputs)

    # ---- the steps, in the order they register -----------------------------------------------------

    def _docker_providers(self, name: str) -> dict[str, docker.Provider]:
        """One docker provider per node, over SSH."""
        return {
            node_name: docker.Provider(
                f"{name}-docker-{node_name}",
                host=acc.docker_host,
                ssh_opts=acc.docker_ssh_opts(),
                opts=pulumi.ResourceOptions(parent=self),
            )
            for node_name, acc in self.access.items()
        }

    def _stack_claims(self, name: str) -> dict[str, StackClaim]:
        """Before any container or volume on a node: no other stack holds its names or host ports there."""
        cfg = self.config
        owner = f"{pulumi.get_project()}/{pulumi.get_stack()}"
        return {
            node.name: StackClaim(
                f"{name}-claim-{node.name}",
                node=self.access[node.name].node_dict(),
                owner=owner,
                prefix=cfg.containers.name_prefix,
                ports=claimed_ports(cfg, node),
                opts=pulumi.ResourceOptions(parent=self),
            )
            for node in cfg.nodes
        }

    def _health_secret(self, name: str) -> HealthSecret | None:
        """The secret the watchdog signs its requests to the agents with (none under health.mode off)."""
        if self.config.health.mode is HealthMode.OFF:
            return None
        return self._stack_secret(f"{name}-health-secret")

    def _stack_secret(self, resource_name: str) -> HealthSecret:
        """A random secret of this stack's, drawn once and kept encrypted in the state; after every
        node's claim, so a stack refused on any node draws nothing."""
        return HealthSecret(
            resource_name,
            owner=f"{pulumi.get_project()}/{pulumi.get_stack()}",
            prefix=self.config.containers.name_prefix,
            opts=pulumi.ResourceOptions(parent=self, depends_on=list(self.claims.values())),
        )

    def _fabric_checks(self, name: str) -> dict[str, FabricCheck]:
        """Per node, before any container: its RoCE fabric is fit for NCCL; what NCCL there is given.
        The head's first: a worker's MTU must equal the head's recorded one. None under `off`."""
        cfg = self.config
        if cfg.fabric.check is FabricCheckMode.OFF:
            return {}
        checks: dict[str, FabricCheck] = {}
        after = probe_after([w.name for w in cfg.workers])
        for node in [cfg.head, *cfg.workers]:
            head = checks.get(cfg.head.name)
            reference = (
                pulumi.Output.all(head.mtu, head.paths).apply(
                    lambda v, head_name=cfg.head.name: {"node": head_name, "mtu": v[0], "paths": v[1]}
                )
                if head
                else None
            )
            checks[node.name] = FabricCheck(
                f"{name}-fabric-{node.name}",
                **fabric_check_inputs(cfg, node, dict(self.access[node.name].node_dict())),
                reference=reference,
                probe=probe_input(cfg, self.access[cfg.head.name].node_dict()) if head else None,
                # After the claims: a worker's probe listens on the head's claimed fabric.probe_port;
                # after the previous worker's check: one probe at a time holds that port.
                opts=pulumi.ResourceOptions(
                    parent=self,
                    depends_on=[
                        self.claims[node.name],
                        self.claims[cfg.head.name],
                        *([checks[after[node.name]]] if after.get(node.name) else []),
                    ],
                ),
            )
        return checks

    def _image_build(self, name: str) -> BuiltImage | None:
        """The image built on the head; None for strategy prebuilt (the reference is there already)."""
        image = self.config.image
        if image.strategy is ImageStrategy.PREBUILT:
            return None
        head = self.access[self.config.head.name].node_dict()
        # Built by the head's own Docker over the project's SSH transport (not a docker provider).
        return BuiltImage(
            f"{name}-image", BuiltImageArgs(image=image, node=head), opts=pulumi.ResourceOptions(parent=self)
        )

    def _model_support_check(self, name: str) -> ModelSupportCheck:
        """Before any Ray container: the head's image loads the checkpoint, and the model fits."""
        cfg, head = self.config, self.config.head.name
        head_checkpoint = self.checkpoints.get(head)
        return ModelSupportCheck(
            f"{name}-model-support",
            node=self.access[head].node_dict(),
            image=self.image_ref if self.image else cfg.image.prebuilt,
            image_id=self.node_images[head].image_id,
            memory=memory_inputs(cfg),
            mode=cfg.image.model_check.value,
            # The head's checkpoint (none when serve.model is a path and model.repo is unset: then the
            # proof runs on its fixture configs and the memory fit is not checked).
            checkpoint_digest=head_checkpoint.digest if head_checkpoint else None,
            snapshot_path=head_checkpoint.snapshot_path if head_checkpoint else None,
            container_prefix=cfg.containers.name_prefix,
            # The server's exact command line (with the pinned revision): the image's vLLM parses it.
            serve_argv=server_argv(cfg, self._served_revision()),
            rank_argvs=rank_argvs(cfg, self._served_revision()),
            cluster=cluster_proof(cfg),
            expect=cfg.image.model_check_expects.model_dump() if cfg.image.model_check_expects else None,
            opts=pulumi.ResourceOptions(
                parent=self,
                depends_on=[self.node_images[head], *([head_checkpoint] if head_checkpoint else [])],
            ),
        )

    def _node_proof(self, name: str) -> NodeProof | None:
        """Before any serving container, on every node at once: the image's GPU step and one group
        over the fabric whose transport NCCL names (none under `fabric.node_proof: off`)."""
        cfg = self.config
        if cfg.fabric.proof is FabricCheckMode.OFF:
            return None
        nodes = []
        for rank, node in enumerate([cfg.head, *cfg.workers]):
            fabric = self._fabric(node)
            nodes.append(
                {
                    "name": node.name,
                    "node": self.access[node.name].node_dict(),
                    "rank": rank,
                    "image_id": self._image_id(node.name),
                    # What that node's serving containers get: its own interface, HCAs and GID index.
                    "env": self._fabric_env(node),
                    "ib_hca": fabric.apply(lambda f: list(f.ib_hca))
                    if fabric
                    else list(configured_fabric(cfg, node).ib_hca),
                    # Lab only, and only when set (an unset key would change every stack's input).
                    **({"host_root": node.host_root} if node.host_root else {}),
                }
            )
        return NodeProof(
            f"{name}-node-proof",
            nodes=nodes,
            **node_proof_inputs(cfg),
            opts=pulumi.ResourceOptions(
                parent=self,
                # After every node's image and fabric check (whose probes free the head's port).
                depends_on=[*self.claims.values(), *self.node_images.values(), *self.fabric_checks.values()],
            ),
        )

    def _compile_caches(self, name: str) -> dict[str, docker.Volume]:
        """Per node, what vLLM and its compilers build at start, for the next start to reuse (none
        with `containers.compile_cache` off). Kept on `destroy` as the checkpoint is: a kept volume
        is only forgotten by the stack, and the next stack's create takes it over under its name."""
        cfg = self.config
        if not cfg.containers.compile_cache:
            return {}
        return {
            node.name: docker.Volume(
                f"{name}-compile-cache-{node.name}",
                name=compile_cache_volume_name(cfg),
                opts=pulumi.ResourceOptions.merge(
                    self._on(node.name), pulumi.ResourceOptions(retain_on_delete=cfg.model.keep_on_destroy)
                ),
            )
            for node in cfg.nodes
        }

    def _ray_cluster(
        self, name: str, secrets: dict[str, Any]
    ) -> tuple[docker.Volume, dict[str, docker.Container]]:
        """The Ray head with its temp volume, then every worker (a worker joins the head's GCS)."""
        cfg, head = self.config, self.config.head
        # Shared by the Ray head and the vLLM server (the driver needs the raylet's socket).
        ray_tmp = docker.Volume(f"{name}-ray-tmp", name=ray_tmp_volume_name(cfg), opts=self._on(head.name))
        containers = {
            head.name: self._container(
                f"{name}-ray-head",
                self._specs(head, lambda f: ray_container_spec(cfg, head, self._image_id(head.name), f)),
                head.name,
                secrets,
                depends_on=[ray_tmp],
            )
        }
        for worker in cfg.workers:
            containers[worker.name] = self._container(
                f"{name}-ray-worker-{worker.name}",
                self._specs(
                    worker, lambda f, w=worker: ray_container_spec(cfg, w, self._image_id(w.name), f)
                ),
                worker.name,
                secrets,
                # A worker joins the head's GCS: never start one before the head.
                depends_on=[containers[head.name]],
            )
        return ray_tmp, containers

    def _vllm_server(self, name: str, secrets: dict[str, Any]) -> docker.Container:
        """The vLLM server on the head, serving the pinned revision of a Hub checkpoint."""
        cfg, head = self.config, self.config.head.name
        return self._container(
            f"{name}-vllm",
            self._specs(cfg.head, lambda f: vllm_container_spec(cfg, self._image_id(head), f)),
            head,
            secrets,
            # The server claims every GPU of the cluster: only once every Ray container runs.
            depends_on=[*self.ray_containers.values(), self.ray_tmp],
            revision=self._served_revision(),
        )

    def _mp_world(
        self, name: str, secrets: dict[str, Any]
    ) -> dict[str, tuple[ContainerSpec, pulumi.Input[list[str]]]]:
        """Executor mp: every rank's spec and environment, the environment carrying the world's digest
        (components/mp_executor.py, WORLD_ENV) so that a change to any rank replaces every rank."""
        cfg, revision = self.config, self._served_revision()
        specs = {
            n.name: self._specs(n, lambda f, n=n: mp_container_spec(cfg, n, self._image_id(n.name), f))
            for n in ranked_nodes(cfg)
        }

        def identity(spec: ContainerSpec, env_list: pulumi.Input[list[str]] | None) -> pulumi.Output[dict]:
            present = present_secrets(spec.secret_env, secrets)
            names = sorted(present)
            return pulumi.Output.all(
                spec.image,
                spec.env_list() if env_list is None else env_list,
                revision,
                *(present[n] for n in names),
            ).apply(
                lambda v: rank_identity(
                    spec,
                    v[0],
                    v[1],
                    [*spec.command, *(["--revision", v[2]] if v[2] is not None else [])],
                    dict(zip(names, v[3:], strict=True)),
                )
            )

        # Keyed by a secret of the stack's own, drawn once (HealthSecret's kind: it never changes).
        key = self._stack_secret(f"{name}-mp-world-key")
        world = pulumi.Output.all(key.secret, *(identity(*specs[n.name]) for n in ranked_nodes(cfg))).apply(
            lambda v: world_digest(v[1:], v[0])
        )
        return {
            node: (
                spec,
                pulumi.Output.all(spec.env_list() if env_list is None else env_list, world).apply(
                    lambda v: [*v[0], f"{WORLD_ENV}={v[1]}"]
                ),
            )
            for node, (spec, env_list) in specs.items()
        }

    def _headless_ranks(
        self,
        name: str,
        specs: dict[str, tuple[ContainerSpec, pulumi.Input[list[str]]]],
        secrets: dict[str, Any],
    ) -> dict[str, docker.Container]:
        """Executor mp: a headless `vllm serve` rank on every worker, before the head's rank 0."""
        return {
            worker.name: self._container(
                f"{name}-vllm-headless-{worker.name}",
                specs[worker.name],
                worker.name,
                secrets,
                depends_on=[],
                # Every rank loads its own shard of the pinned revision from its node's cache.
                revision=self._served_revision(),
            )
            for worker in self.config.workers
        }

    def _mp_head(
        self,
        name: str,
        specs: dict[str, tuple[ContainerSpec, pulumi.Input[list[str]]]],
        secrets: dict[str, Any],
    ) -> docker.Container:
        """Executor mp: rank 0 on the head, which serves the API once every headless rank joined (it
        waits for them on its master port, within vLLM's own timeout)."""
        head = self.config.head
        return self._container(
            f"{name}-vllm",
            specs[head.name],
            head.name,
            secrets,
            depends_on=list(self.ranks.values()),
            revision=self._served_revision(),
        )

    def _readiness_gate(self, name: str, api_key: pulumi.Output[str] | None) -> ReadinessGate:
        """Passes once the server answers a request: with every node and GPU in the Ray cluster, or
        under executor mp (no Ray to ask: `--no-ray-check`) once the head serves, which it does only
        after every rank joined."""
        cfg, head = self.config, self.config.head
        mp = cfg.cluster.executor is Executor.MP
        head_checkpoint = self.checkpoints.get(head.name)
        return ReadinessGate(
            f"{name}-ready",
            node=self.access[head.name].node_dict(),
            server_id=self.server.id,
            url=local_url(cfg.serve),
            model=cfg.serve.model_name,
            expect_nodes=len(cfg.nodes),
            expect_gpus=sum(n.gpus for n in cfg.nodes),
            # Ray node address -> name, so a gate that times out names the node that never joined.
            expect_node_ips=None if mp else {n.name: n.fabric_ip for n in cfg.nodes},
            container_ids=self._gate_container_ids(),
            deadline_s=cfg.serve.ready_timeout,
            ray_container=None if mp else ray_container_name(cfg, head),
            log_container=vllm_container_name(cfg),
            api_key=api_key,
            deployed=deployed(cfg, self.image_ref, head_checkpoint.revision if head_checkpoint else None),
            serving_logs=self._serving_logs(),
            nccl_fabric=self._nccl_fabric(),
            transport_mode=cfg.fabric.proof.value,
            opts=pulumi.ResourceOptions(
                parent=self,
                depends_on=[self.server, *self.ray_containers.values(), *self.ranks.values()],
            ),
        )

    def _serving_logs(self) -> dict[str, dict[str, Any]]:
        """Where the gate reads what the serving ranks logged about their transport: under executor mp
        each node's rank container; under Ray the server's container on the head, where Ray forwards
        every rank's lines (recorded under the head)."""
        cfg, head = self.config, self.config.head
        if cfg.cluster.executor is Executor.MP:
            return {
                n.name: {"node": self.access[n.name].node_dict(), "container": mp_container_name(cfg, n)}
                for n in cfg.nodes
            }
        server = {"node": self.access[head.name].node_dict(), "container": vllm_container_name(cfg)}
        return {head.name: server}

    def _answer_check(self, name: str, api_key: pulumi.Output[str] | None) -> AnswerCheck | None:
        """After the gate, on the head: the served answers recorded and judged (none under
        `answers.mode: off`). It checks again when every node's image ID, the server's argv, the node
        set, the fabric NCCL is given, the prompt set, the reference or the settings change."""
        cfg, head = self.config, self.config.head
        if cfg.answers.mode is AnswersMode.OFF:
            return None
        return AnswerCheck(
            f"{name}-answers",
            node=self.access[head.name].node_dict(),
            url=local_url(cfg.serve),
            model=cfg.serve.model_name,
            **answer_check_inputs(cfg),
            image_ids={n.name: self._image_id(n.name) for n in cfg.nodes},
            server_argv=server_argv(cfg, self._served_revision()),
            nodes=[n.name for n in cfg.nodes],
            fabric=self._nccl_fabric(),
            api_key=api_key,
            opts=pulumi.ResourceOptions(parent=self, depends_on=[self.ready]),
        )

    def _nccl_fabric(self) -> dict[str, Any]:
        """Per node, the HCAs and GID index NCCL is given (FabricCheck's, else config's): a change is
        a change to how the ranks compute together. Not the probes' figures, which move every run."""
        fabric = {}
        for node in self.config.nodes:
            check = self.fabric_checks.get(node.name)
            if check is None:
                configured = configured_fabric(self.config, node)
                fabric[node.name] = {"ib_hca": list(configured.ib_hca), "gid_index": configured.gid_index}
            else:
                fabric[node.name] = {"ib_hca": check.ib_hca, "gid_index": check.gid_index}
        return fabric

    def _answers_output(self) -> dict[str, Any]:
        """The stack output `answers`: the mode, the settings, the prompt set and the reference's
        path, and what the last run recorded (receipts, verdict, problems, what it judged against)."""
        answers = self.config.answers
        if self.answers is None:
            return {"mode": answers.mode.value}
        return {
            "mode": answers.mode.value,
            "settings": answers.settings(),
            "reference": answers.reference,
            **{key: getattr(self.answers, key) for key in ANSWER_CHECK_OUTPUTS},
        }

    def _serve_bench(self, name: str, api_key: pulumi.Output[str] | None) -> ServeBench | None:
        """After the gate, on the head: the served speed measured (none under `bench.mode: off`). It
        measures again when a node's image ID or NCCL settings, the server's argv, the node set or the
        bench settings change; FabricCheck's outputs only explain a figure below its floor."""
        cfg, head = self.config, self.config.head
        if cfg.bench.mode is BenchMode.OFF:
            return None
        return ServeBench(
            f"{name}-bench",
            node=self.access[head.name].node_dict(),
            url=local_url(cfg.serve),
            model=cfg.serve.model_name,
            mode=cfg.bench.mode.value,
            settings=cfg.bench.settings(),
            floors=cfg.bench.floors(),
            image_ids={n.name: self._image_id(n.name) for n in cfg.nodes},
            server_argv=server_argv(cfg, self._served_revision()),
            nodes=[n.name for n in cfg.nodes],
            log_container=vllm_container_name(cfg),
            api_key=api_key,
            fabric=self._fabric_outputs(),
            nccl_env={n.name: self._nccl_env(n) for n in cfg.nodes},
            # After the answer check: the bench's streams would share the server's batches with the
            # check's requests, and a batch changes logprobs by a little.
            opts=pulumi.ResourceOptions(
                parent=self, depends_on=[self.ready, *([self.answers] if self.answers else [])]
            ),
        )

    def _bench_output(self) -> dict[str, Any]:
        """The stack output `serve_bench`: the mode, the settings and floors, and what the last run
        measured (figures, verdict, the floors missed and their likely causes)."""
        bench = self.config.bench
        if self.bench is None:
            return {"mode": bench.mode.value}
        return {
            "mode": bench.mode.value,
            "settings": bench.settings(),
            "floors": bench.floors(),
            **{key: getattr(self.bench, key) for key in SERVE_BENCH_OUTPUTS},
        }

    def _health(
        self, name: str, secrets: dict[str, Any]
    ) -> tuple[docker.Volume, dict[str, docker.Container], docker.Container]:
        """After the gate (the watchdog never judges a cluster `up` has not seen ready): the watchdog's
        state volume on the head, an agent on every worker, then the watchdog (it asks the agents)."""
        cfg, head = self.config, self.config.head
        volume = docker.Volume(
            f"{name}-health", name=health_volume_name(cfg), opts=self._on(head.name, depends_on=[self.ready])
        )
        agents = {
            worker.name: self._container(
                f"{name}-health-agent-{worker.name}",
                self._health_specs(
                    worker,
                    lambda j, w=worker: agent_container_spec(cfg, w, self._image_id(w.name), j),
                ),
                worker.name,
                secrets,
                depends_on=[self.ready],
            )
            for worker in cfg.workers
        }
        watchdog = self._container(
            f"{name}-watchdog",
            self._health_specs(head, lambda j: watchdog_container_spec(cfg, self._image_id(head.name), j)),
            head.name,
            secrets,
            depends_on=[self.ready, volume, *agents.values()],
        )
        return volume, agents, watchdog

    def _health_specs(
        self, node: NodeConfig, build: Callable[[str], ContainerSpec]
    ) -> tuple[ContainerSpec, pulumi.Output[list[str]]]:
        """A health container's spec and its environment: the config JSON carries each node's memory
        need, known once the model-support check recorded its memory fit."""
        cfg = self.config

        def env(fit: Any) -> list[str]:
            needs = {n.name: node_need_bytes(fit, n.name, n.gpus) for n in cfg.nodes}
            return build(health_config(cfg, node, needs)).env_list()

        return build(health_config(cfg, node)), self.model_support.memory_fit.apply(env)

    def _gate_container_ids(self) -> dict[str, pulumi.Output[str]]:
        """`node/container` -> ID of what the gate watches: a recreated container (a worker started
        again by `up`) makes the gate probe again."""
        cfg, head = self.config, self.config.head
        if cfg.cluster.executor is Executor.MP:
            servers = {head.name: self.server, **self.ranks}
            return {f"{n.name}/{mp_container_name(cfg, n)}": servers[n.name].id for n in cfg.nodes}
        return {
            **{f"{n.name}/{ray_container_name(cfg, n)}": self.ray_containers[n.name].id for n in cfg.nodes},
            f"{head.name}/{vllm_container_name(cfg)}": self.server.id,
        }

    def _stack_outputs(self) -> dict[str, Any]:
        """The stack's outputs (`__main__` exports them)."""
        cfg = self.config
        return {
            # Only known once the gate passed: an endpoint output means "has answered a request".
            "endpoint": self.ready.id.apply(lambda _: endpoint_url(cfg)),
            "served_model": cfg.serve.model_name,
            # No Ray, no Ray dashboard under executor mp.
            "dashboard": None
            if cfg.cluster.executor is Executor.MP
            else f"http://{dashboard_host(cfg)}:{cfg.ray.dashboard_port}",
            "images": {
                node: {"image_id": img.image_id, "layers": img.layers}
                for node, img in self.node_images.items()
            },
            "checkpoints": {
                node: {
                    "revision": c.revision,
                    "digest": c.digest,
                    "files": c.files,
                    "bytes": c.bytes,
                    "snapshot_path": c.snapshot_path,
                }
                for node, c in self.checkpoints.items()
            },
            "containers": node_container_names(cfg),
            "health": health_output(cfg),
            # Prometheus file_sd: `pulumi stack output scrape_targets --json > targets.json`.
            "scrape_targets": scrape_targets(cfg),
            "model_support": {key: getattr(self.model_support, key) for key in MODEL_SUPPORT_OUTPUTS},
            "fabric": self._fabric_outputs(),
            # The serving start the gate waited for: seconds from the container's start to the weights
            # loaded, the engine and the API ready, and its first completion (docs/bench.md).
            "cold_start": self.ready.report.apply(lambda report: (report or {}).get("cold_start")),
            # The served speed as the last `up` measured it (ServeBench; `status` shows it).
            "serve_bench": self._bench_output(),
            # The served answers as the last `up` recorded and judged them (AnswerCheck; `status` shows it).
            "answers": self._answers_output(),
            # How many replaced images each node keeps for a rollback (image.keep_previous).
            "keep_previous": cfg.image.keep_previous,
            "head": cfg.head.name,
            "nodes": [n.name for n in cfg.nodes],
        }

    def _fabric_outputs(self) -> dict[str, Any]:
        """The stack output `fabric`: the check's mode and, per node, what NCCL is given and why."""
        cfg = self.config
        if not self.fabric_checks:  # off: what config alone gives NCCL
            nodes = {
                n.name: {
                    "ib_hca": list(configured_fabric(cfg, n).ib_hca),
                    "gid_index": configured_fabric(cfg, n).gid_index,
                }
                for n in cfg.nodes
            }
            return {
                "check": cfg.fabric.check.value,
                "nodes": nodes,
                **self._proof_output(),
                "serving": self.ready.serving_transport,
            }
        return {
            "check": cfg.fabric.check.value,
            "nodes": {
                node: {key: getattr(check, key) for key in FABRIC_OUTPUTS}
                for node, check in self.fabric_checks.items()
            },
            **self._proof_output(),
            # What the serving ranks logged about their transport, read by the gate (node -> record).
            "serving": self.ready.serving_transport,
        }

    def _proof_output(self) -> dict[str, Any]:
        """`fabric.proof`: the node proof's mode and verdict (none under `fabric.node_proof: off`)."""
        if self.node_proof is None:
            return {}
        proof = {key: getattr(self.node_proof, key) for key in NODE_PROOF_OUTPUTS}
        return {"proof": {"mode": self.config.fabric.proof.value, **proof}}

    # ---- shared by the steps --------------------------------------------------------------------------

    def _fabric(self, node: NodeConfig) -> pulumi.Output[NodeFabric] | None:
        """The node's FabricCheck outputs as NodeFabric; None where config alone decides them (the
        check off, or HCAs pinned and no `gid_index: resolve`: the check then gives back the pin and
        the configured index), so an existing stack's containers keep a known environment in preview."""
        check = self.fabric_checks.get(node.name)
        if check is None or (self.config.hca_pin(node) is not None and self.config.fabric.gid != "resolve"):
            return None
        return pulumi.Output.all(check.ib_hca, check.gid_index).apply(
            # (a dynamic resource's numbers come back as floats: 3.0 must read "3")
            lambda v: NodeFabric(tuple(v[0] or ()), None if v[1] is None else int(v[1]))
        )

    def _fabric_env(self, node: NodeConfig) -> pulumi.Input[dict[str, str]]:
        """The fabric environment of `node`'s serving containers (its FabricCheck's HCAs and GID index)."""
        fabric = self._fabric(node)
        if fabric is None:
            return fabric_env(self.config, node)
        return fabric.apply(lambda f: fabric_env(self.config, node, f))

    def _nccl_env(self, node: NodeConfig) -> pulumi.Input[dict[str, str]]:
        """What picks NCCL's transport in `node`'s serving containers (the bench measures again when
        it changes)."""
        env = self._fabric_env(node)
        return env.apply(nccl_transport) if isinstance(env, pulumi.Output) else nccl_transport(env)

    def _specs(
        self, node: NodeConfig, build: Callable[[NodeFabric | None], ContainerSpec]
    ) -> tuple[ContainerSpec, pulumi.Input[list[str]] | None]:
        """A container's spec, and its environment from the node's FabricCheck outputs (None: the
        spec's own, under `fabric.check: off`). Only the environment depends on those outputs."""
        fabric = self._fabric(node)
        return build(None), (fabric.apply(lambda f: build(f).env_list()) if fabric is not None else None)

    def _image_id(self, node: str) -> pulumi.Output[str]:
        """The image ID of `node`'s own copy (IDs differ across image stores): what its containers run."""
        return self.node_images[node].image_id

    def _served_revision(self) -> pulumi.Output[str] | None:
        """The commit the server serves: the head checkpoint's, when `serve.model` is the Hub repo."""
        head_checkpoint = self.checkpoints.get(self.config.head.name)
        if head_checkpoint is None or self.config.serve.model != self.config.hub_repo:
            return None
        return head_checkpoint.revision

    def _on(self, node: str, depends_on: list[pulumi.Resource] | None = None) -> pulumi.ResourceOptions:
        return pulumi.ResourceOptions(
            parent=self, provider=self.providers[node], depends_on=[self.claims[node], *(depends_on or [])]
        )

    def _container(
        self,
        resource_name: str,
        specs: tuple[ContainerSpec, pulumi.Input[list[str]] | None],
        node: str,
        secrets: dict[str, Any],
        depends_on: list[pulumi.Resource],
        revision: pulumi.Output[str] | None = None,
    ) -> docker.Container:
        """A container on `node`, created after that node's NodeImage (whose ID the spec carries), the
        node's checkpoint, the model-support check and every node's FabricCheck; `revision`: the commit
        `vllm serve` must serve."""
        spec, env_list = specs
        kwargs = container_args(spec, secrets, env_list)
        if revision is not None:
            kwargs["command"] = revision.apply(lambda sha: [*spec.command[1:], "--revision", sha])
        checkpoint = [self.checkpoints[node]] if node in self.checkpoints else []
        cache = [self.compile_caches[node]] if node in self.compile_caches else []
        return docker.Container(
            resource_name,
            **kwargs,
            opts=pulumi.ResourceOptions(
                parent=self,
                provider=self.providers[node],
                depends_on=[
                    self.claims[node],
                    self.node_images[node],
                    *checkpoint,
                    *cache,
                    self.model_support,
                    # Every node's fabric before any container on any node (NCCL spans them all).
                    *self.fabric_checks.values(),
                    *([self.node_proof] if self.node_proof else []),
                    *depends_on,
                ],
                additional_secret_outputs=["envs", *(["uploads"] if spec.secret_files else [])],
                # The old container must release the GPUs and host ports before its successor starts.
                delete_before_replace=True,
            ),
        )


def deployed(cfg: StackConfig, ref: str, revision: pulumi.Output[str] | None) -> pulumi.Input[dict]:
    """What the gate records as served once it passes: the image reference and the checkpoint's
    commit, each with the config line that selects it again (the rollback hint of a later failure)."""
    if cfg.image.strategy is ImageStrategy.PREBUILT:
        image_line = f"image.prebuilt: {ref}"
    else:  # a build's tag is a hash of its inputs: going back is the image section that built it
        image_line = f"image (the {cfg.image.strategy.value} inputs that built {ref})"
    if revision is None:
        return {"image": ref, "revision": None, "lines": {"image": image_line}}
    return revision.apply(
        lambda sha: {
            "image": ref,
            "revision": sha,
            "lines": {"image": image_line, "revision": f"model.revision: {sha}"},
        }
    )


def server_argv(cfg: StackConfig, revision: pulumi.Output[str] | None) -> pulumi.Input[list[str]]:
    """The server's final argument list, as its container runs it (`--revision` the pinned commit):
    under executor mp the head's rank 0 (each headless rank's is `rank_argvs`)."""
    argv = mp_serve_argv(cfg, cfg.head) if cfg.cluster.executor is Executor.MP else serve_argv(cfg.serve)
    if revision is None:
        return argv
    return revision.apply(lambda sha: [*argv, "--revision", sha])


def rank_argvs(cfg: StackConfig, revision: pulumi.Output[str] | None) -> dict[str, Any] | None:
    """Under executor mp, each headless rank's final argument list by node (its node rank and
    `--headless` differ from the head's); None under Ray, where one server runs, and on one node."""
    if cfg.cluster.executor is not Executor.MP or not cfg.workers:
        return None
    argvs = {n.name: mp_serve_argv(cfg, n) for n in cfg.workers}
    if revision is None:
        return argvs
    return {
        name: revision.apply(lambda sha, argv=argv: [*argv, "--revision", sha])
        for name, argv in argvs.items()
    }


def place_images(
    name: str, deployment: Qwen35Deployment, ref: str, build: BuiltImage | None
) -> dict[str, NodeImage]:
    """One NodeImage per node, copied along a fan-out tree from the head (where the image is)."""
    return copy_tree(
        f"{name}-image",
        ref,
        deployment.access,
        deployment.config.head.name,
        # Every node's claim first: a stack refused on any node copies nothing to any node.
        opts=pulumi.ResourceOptions(
            parent=deployment, depends_on=[*deployment.claims.values(), *([build] if build else [])]
        ),
        # The built image's ID: a rebuild under the same tag (a pinned `image.tag`, or a drifted tag
        # built again) re-places the image everywhere; an identical one changes nothing downstream.
        # A prebuilt image re-tagged on the head shows at refresh (NodeImage reads the head's ID).
        trigger=build.image_id if build else None,
        tuning=deployment.config.copy_.tuning() or None,
        # Only classic-store nodes serve others (a containerd store may lack layer blobs).
        can_reexport={n.name for n in deployment.config.nodes if n.image_store == "classic"},
        keep_previous=deployment.config.image.keep_previous,
    )


def place_checkpoints(
    name: str, deployment: Qwen35Deployment, hf_token: pulumi.Output[str] | None
) -> dict[str, Checkpoint]:
    """The checkpoint on every node (none when `serve.model` is a path and `model.repo` unset).

    Without `model.fetch_python` the head fetches in a short-lived container of the deployment's
    image (it has the Hub client), so the fetch waits for that image on the head.
    """
    cfg = deployment.config
    if cfg.hub_repo is None:
        return {}
    head_image = deployment.node_images[cfg.head.name]
    needs_image = cfg.model.source == "hub" and not cfg.model.fetch_python and not cfg.model.fetch_image
    return checkpoint_tree(
        f"{name}-checkpoint",
        cfg,
        deployment.access,
        opts=pulumi.ResourceOptions(
            parent=deployment,
            depends_on=[*deployment.claims.values(), *([head_image] if needs_image else [])],
        ),
        hf_token=hf_token,
        fetch_image=head_image.image_id if needs_image else None,
    )
