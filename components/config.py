"""Typed, validated stack configuration: the program's interface to operators.

Stack config (Pulumi.<stack>.yaml) → frozen pydantic models → components. Components never read
`pulumi.Config`; `load_stack_config` is the one place that does, and a bad config becomes one
`ConfigError` naming every bad field by path, before any resource is registered.
"""

from __future__ import annotations

import contextlib
import difflib
import ipaddress
import os
import re
from collections.abc import Mapping
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from components.errors import Qwen35Error
from components.image_ref import ImageRef, ImageRefError, parse_image_ref

NAMESPACE = "qwen35-spark"
# The GB10's unified memory; what a node has when config says nothing else (nodes[].memory_gb).
GB10_MEMORY_GB = 128.0
# The directory of Pulumi.yaml: relative paths in a stack file mean this checkout's files, wherever
# it was cloned (a stack file is committed; one checkout's absolute path is wrong in every other).
PROJECT_DIR = Path(__file__).resolve().parent.parent

# Names that reach Docker and a shell: strict patterns, checked before anything runs.
NODE_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
HOSTNAME = re.compile(
    r"^(?=.{1,253}$)([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$"
)
USER = re.compile(r"^[a-z_][a-z0-9_.-]{0,31}$")
IMAGE_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
IFNAME = re.compile(r"^[A-Za-z0-9_.:-]{1,15}$")
HCA = re.compile(r"^[A-Za-z0-9_.-]{1,64}(:[0-9]{1,2})?$")
ABS_PATH = re.compile(r"^(/|~/)[A-Za-z0-9_./@+-]*$")
MODEL_ID = re.compile(r"^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)?$|^/[A-Za-z0-9_./-]+$")
SERVED_NAME = re.compile(r"^[A-Za-z0-9_.:/-]{1,128}$")
PIP_SPEC = re.compile(
    r"^(==|>=|<=|~=|!=|>|<)?\s*[0-9]+(\.[0-9]+)*([a-z]+[0-9]*)?(\.post[0-9]+|\.dev[0-9]+)?$"
)
# Flags whose values are secrets: they come from Pulumi secrets, never from plain extra args.
SECRET_FLAGS = frozenset({"--api-key", "--hf-token", "--token"})
EXTRA_ARG = re.compile(r"^[A-Za-z0-9_./:=,@+%-]*$")

Port = Annotated[int, Field(ge=1, le=65535)]
# A node's Docker image store: the one definition (NodeImage, the copy tree and config use it).
ImageStore = Literal["classic", "containerd"]
IMAGE_STORES: tuple[str, ...] = get_args(ImageStore)


class ConfigError(Qwen35Error, ValueError):
    """A stack config that cannot be deployed; `problems` are `path: message` lines."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__(
            "invalid stack configuration:\n"
            + "\n".join(f"  - {p}" for p in problems)
            + "\nFix these in Pulumi.<stack>.yaml (or `pulumi config set`) and run again."
        )


class Role(str, Enum):
    HEAD = "head"
    WORKER = "worker"


class RestartPolicy(str, Enum):
    # `unless-stopped` brings the cluster back after a reboot; `on-failure` bounds crash loops.
    UNLESS_STOPPED = "unless-stopped"
    ALWAYS = "always"
    ON_FAILURE = "on-failure"
    NO = "no"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, str_strip_whitespace=True)


def _check_host(value: str) -> str:
    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        pass
    if not HOSTNAME.match(value) or value.replace(".", "").isdigit():
        raise ValueError(f"{value!r} is neither an IP address nor a valid hostname")
    return value


def _check_user(value: str) -> str:
    if not USER.match(value):
        raise ValueError(f"{value!r} is not a valid user name")
    return value


def _check_path(value: str | None) -> str | None:
    if value is not None and not ABS_PATH.match(value):
        raise ValueError(f"{value!r}: give an absolute path (or ~/…) without spaces or shell characters")
    return value


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
    # LAB ONLY: a folder laid out like /sys (plus `ip-addr.json`, what `ip -j addr show` prints) that
    # FabricCheck reads instead of the node's own; the lab's machines have no RDMA to read.
    sysfs_root: str | None = None
    # The node's Docker socket, mounted into its health watchdog or agent (the lab's daemons each
    # have their own).
    docker_socket: str = "/var/run/docker.sock"
    # LAB ONLY: a crafted meminfo the health programs read instead of the node's /proc/meminfo.
    meminfo_path: str | None = None

    @field_validator("ib_hca")
    @classmethod
    def _hca(cls, v: list[str] | None) -> list[str] | None:
        return _check_hcas(v)

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


class ImageStrategy(str, Enum):
    """Where the deployment's image comes from."""

    # An image that already holds a vLLM with native Qwen3.5 support (vLLM >= 0.17), used as is.
    PREBUILT = "prebuilt"
    # The seed procedure's build: base (Ray/NCCL) + donor's Qwen3.5 code, patched, built on the head.
    HYBRID = "hybrid"
    # The reverse: the donor's complete vLLM, plus the base's cluster layer (Ray, its NCCL), on the head.
    GRAFT = "graft"


# The image keys each strategy reads (besides COMMON_IMAGE_KEYS). A key the stack sets that its strategy
# does not read is refused naming it: it would otherwise be silently ignored.
COMMON_IMAGE_KEYS = frozenset(
    {"strategy", "model_check", "model_check_expects", "ray_version", "keep_previous"}
)
_BUILD_KEYS = frozenset(
    {
        "base",
        "base_tag",
        "donor",
        "donor_tag",
        "name",
        "tag",
        "platform",
        "pip_args",
        "build_network",
        "smoke",
    }
)
STRATEGY_KEYS: dict[ImageStrategy, frozenset[str]] = {
    ImageStrategy.PREBUILT: frozenset({"prebuilt"}),
    ImageStrategy.HYBRID: _BUILD_KEYS | {"transformers", "base_vllm_dir", "donor_vllm_dir"},
    # The donor's vLLM is used where it is installed: no vLLM directories, no transformers pin.
    ImageStrategy.GRAFT: _BUILD_KEYS,
}
# Keys a strategy needs the stack to give (their defaults name the seed's images, not the operator's).
STRATEGY_REQUIRED: dict[ImageStrategy, tuple[str, ...]] = {
    ImageStrategy.PREBUILT: (),
    ImageStrategy.HYBRID: (),
    ImageStrategy.GRAFT: ("donor", "base"),
}


class ModelCheckMode(str, Enum):
    """What a failed model-support check does."""

    # Stop `pulumi up` before any Ray container starts.
    ENFORCE = "enforce"
    # Record the verdict in the stack outputs and go on (stand-in images that hold no vLLM: the lab).
    REPORT = "report"


# The stages each proof of the model-support check can refuse at (patches/prove_model.py,
# prove_args.py, prove_cluster.py), keyed as the check's outputs name the proofs.
PROOF_STAGES: dict[str, tuple[str, ...]] = {
    "behaviour": ("environment", "config", "construct", "load"),
    "serve_args": ("environment", "parse", "validate", "engine_args", "speculative"),
    "cluster_layer": ("ray", "cluster", "executor"),
}


class ExpectedRefusals(_Model):
    """Refusals a stack's image is known to earn (`model_check: report` only): each proof's stage.
    They are said once, in one line with `because`, instead of a multi-line warning each."""

    # Why the image cannot pass (one line): what the operator reads instead of the warnings.
    because: str = Field(min_length=1, max_length=200)
    behaviour: str | None = None
    serve_args: str | None = None
    cluster_layer: str | None = None

    @field_validator("because")
    @classmethod
    def _one_line(cls, v: str) -> str:
        if "\n" in v:
            raise ValueError("one line: it stands in for the warnings in the engine's display")
        return v

    @field_validator("behaviour", "serve_args", "cluster_layer")
    @classmethod
    def _stage(cls, v: str | None, info: ValidationInfo) -> str | None:
        stages = PROOF_STAGES[str(info.field_name)]
        if v is not None and v not in stages:
            raise ValueError(f"{v!r} is not a stage of this proof: one of {', '.join(stages)}")
        return v

    @model_validator(mode="after")
    def _some_stage(self) -> ExpectedRefusals:
        if not self.stages():
            raise ValueError(f"name the stage at least one proof refuses at ({', '.join(PROOF_STAGES)})")
        return self

    def stages(self) -> dict[str, str]:
        """proof -> the stage it is expected to refuse at."""
        return {proof: stage for proof in PROOF_STAGES if (stage := getattr(self, proof)) is not None}


# Default prebuilt image: the community DGX Spark `vllm-node` build (vLLM nightly, Ray, system NCCL),
# made on the head by its build script. docs/image-build.md "Choosing the image" says why.
DEFAULT_PREBUILT = "vllm-node:latest"


def _check_ref(value: str, *, tag_required: bool = False) -> str:
    try:
        ref = parse_image_ref(value)
    except ImageRefError as exc:
        raise ValueError(str(exc)) from None
    if tag_required and ref.tag is None and ref.digest is not None:
        raise ValueError(
            f"{value!r}: a digest alone gives NodeImage no tag to place on the nodes: "
            "write name:tag@sha256:… (the tag the head holds the image under)"
        )
    return value


class ImageConfig(_Model):
    """The deployment's image: a prebuilt one used as is, or the hybrid built on the head."""

    strategy: ImageStrategy = ImageStrategy.PREBUILT
    # strategy prebuilt: a full Docker reference (name, name:tag, host:port/name:tag, …@sha256:…),
    # present on the head; NodeImage copies it to the other nodes.
    prebuilt: str = DEFAULT_PREBUILT
    # strategy hybrid: the base (Ray/NCCL) and donor (Qwen3.5 code) images, full references.
    base: str = "vllm-node:latest"
    # Older stacks gave the tag apart; still read when `base`/`donor` carry no tag or digest.
    base_tag: str | None = None
    donor: str = "hellohal2064/vllm-qwen3.5-gb10:latest"
    donor_tag: str | None = None
    # The hybrid's repository name (no tag: `tag` below, or a content hash).
    name: str = "vllm-node-qwen35"
    # Empty: a content hash of the build inputs, so unchanged inputs never rebuild.
    tag: str | None = None
    # An exact pin: a `>=` spec resolves differently on each rebuild. 4.57.6 is what vLLM 0.17 pins and
    # what its Qwen3.5 config classes load with; under 5.x they raise TypeError (docs/hybrid-image.md,
    # the finding).
    transformers: str = "==4.57.6"
    platform: str = "linux/arm64"
    base_vllm_dir: str = "/usr/local/lib/python3.12/dist-packages/vllm"
    donor_vllm_dir: str = "/usr/local/lib/python3.12/dist-packages/vllm"
    # Extra pip flags for the build (e.g. a local wheel directory); empty on the Sparks.
    pip_args: list[str] = []
    # Network for RUN steps of the build: `host` where the daemon has no bridge (the lab).
    build_network: str | None = None
    # false skips the build steps that need torch (behaviour proofs, import smoke): the lab only.
    smoke: bool = True
    # The model-support check on the head (components/model_support/): enforce, or only report.
    model_check: ModelCheckMode = ModelCheckMode.ENFORCE
    # Under `report`: the refusals this image is known to earn (the lab's images hold no torch).
    model_check_expects: ExpectedRefusals | None = None
    # The Ray the stack needs in the image (a pip spec such as ==2.49.1); the model-support check
    # refuses an image whose Ray is missing or differs. Unset: any Ray that vLLM's own pin accepts.
    ray_version: str | None = None
    # Images a node keeps tagged after an upgrade replaced them (newest first), so a rollback to the
    # previous config is a retag, not a copy of tens of GB. 0: the old tag goes with its NodeImage.
    keep_previous: int = Field(default=1, ge=0, le=8)

    @field_validator("prebuilt")
    @classmethod
    def _prebuilt(cls, v: str) -> str:
        return _check_ref(v, tag_required=True)

    @field_validator("base", "donor")
    @classmethod
    def _image(cls, v: str) -> str:
        return _check_ref(v)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        ref = parse_image_ref(_check_ref(v))
        if ref.tag or ref.digest:
            raise ValueError(f"{v!r}: give the repository name only; the tag goes in `image.tag`")
        return v

    @field_validator("tag", "base_tag", "donor_tag")
    @classmethod
    def _tag(cls, v: str | None) -> str | None:
        if v is not None and not IMAGE_TAG.match(v):
            raise ValueError(f"{v!r} is not a safe image tag (letters, digits, '_', '.', '-'; at most 128)")
        return v

    @model_validator(mode="after")
    def _tags_once(self) -> ImageConfig:
        for field in ("base", "donor"):
            ref = parse_image_ref(getattr(self, field))
            if getattr(self, f"{field}_tag") is not None and (ref.tag or ref.digest):
                raise ValueError(
                    f"image.{field}_tag: {field} {str(ref)!r} already carries a tag or digest: "
                    f"drop `{field}_tag`"
                )
        return self

    @model_validator(mode="after")
    def _expects_under_report(self) -> ImageConfig:
        if self.model_check_expects is not None and self.model_check == ModelCheckMode.ENFORCE:
            raise _CrossFieldErrors(
                [
                    (
                        "image.model_check_expects",
                        "only with image.model_check: report (under enforce a refusal stops `up`, "
                        "expected or not): remove it, or set model_check: report",
                    )
                ]
            )
        return self

    @model_validator(mode="after")
    def _strategy_keys(self) -> ImageConfig:
        used = COMMON_IMAGE_KEYS | STRATEGY_KEYS[self.strategy]
        strategy = self.strategy.value
        problems = [
            (
                f"image.{key}",
                f"not used by strategy {strategy!r}: remove it, or set image.strategy to "
                + " or ".join(repr(s.value) for s, keys in STRATEGY_KEYS.items() if key in keys),
            )
            for key in sorted(self.model_fields_set - used)
        ]
        problems += [
            (f"image.{key}", f"strategy {strategy!r} needs it: the full reference of the {key} image")
            for key in STRATEGY_REQUIRED[self.strategy]
            if key not in self.model_fields_set
        ]
        if problems:
            raise _CrossFieldErrors(problems)
        return self

    @field_validator("transformers")
    @classmethod
    def _transformers(cls, v: str) -> str:
        if not PIP_SPEC.match(v):
            raise ValueError(f"{v!r}: give a version such as '==5.2.0' (an exact pin is recommended)")
        return v if v[0] in "=<>~!" else f"=={v}"

    @field_validator("ray_version")
    @classmethod
    def _ray_version(cls, v: str | None) -> str | None:
        if v is None:
            return v
        if not PIP_SPEC.match(v):
            raise ValueError(f"{v!r}: give a version such as '==2.49.1' (the Ray every node runs)")
        return v if v[0] in "=<>~!" else f"=={v}"

    @field_validator("platform")
    @classmethod
    def _platform(cls, v: str) -> str:
        if not re.match(r"^linux/(arm64|amd64)(/v[0-9])?$", v):
            raise ValueError(f"{v!r}: expected linux/arm64 (DGX Spark) or linux/amd64")
        return v

    @field_validator("base_vllm_dir", "donor_vllm_dir")
    @classmethod
    def _dir(cls, v: str) -> str:
        if not v.startswith("/") or not v.rstrip("/").endswith("/vllm"):
            raise ValueError(f"{v!r}: give the absolute path of the `vllm` package directory in the image")
        return _check_path(v)

    @field_validator("build_network")
    @classmethod
    def _network(cls, v: str | None) -> str | None:
        if v is not None and v not in ("host", "default", "none"):
            raise ValueError(f"{v!r}: one of host, default, none")
        return v

    @field_validator("pip_args")
    @classmethod
    def _pip_args(cls, v: list[str]) -> list[str]:
        for arg in v:
            if re.search(r"://[^/]*@", arg):
                # Build args are stored in plain state and in the image's history.
                raise ValueError(
                    "a URL with credentials must not be a pip arg (build args are not secret): "
                    "use a mirror that needs none, or wheels in patches/wheels/"
                )
            if not EXTRA_ARG.match(arg):
                raise ValueError(f"{arg!r} contains characters that are not allowed in a pip argument")
        return v

    @property
    def prebuilt_ref(self) -> ImageRef:
        return parse_image_ref(self.prebuilt)

    def _source_ref(self, field: str) -> str:
        ref = parse_image_ref(getattr(self, field))
        legacy_tag = getattr(self, f"{field}_tag")
        if legacy_tag is not None:
            ref = ImageRef(ref.name, legacy_tag)
        # What a Dockerfile's FROM resolves: the digest when pinned, else name:tag (`latest` if none).
        return ref.pullable

    @property
    def base_ref(self) -> str:
        return self._source_ref("base")

    @property
    def donor_ref(self) -> str:
        return self._source_ref("donor")


# One argv element of `serve.extra_args`: anything but what would end or split it. The server's
# command is an argument list (Docker's exec form), never shell text, so JSON is fine here.
ARGV_FORBIDDEN = ("\x00", "\n", "\r")
KV_CACHE_DTYPES = ("auto", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2")
# A vLLM plugin or parser name: what `--reasoning-parser` / `--tool-call-parser` take.
PARSER_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
SPEC_METHOD = re.compile(r"^[a-z0-9_]{1,32}$")


class SpeculativeConfig(_Model):
    """`--speculative-config`: speculative decoding with the checkpoint's own MTP heads by default."""

    # vLLM's method name; `mtp` drafts with the checkpoint's `mtp.*` layers (no draft model). Which
    # methods this vLLM can use with this checkpoint is proved on the head (patches/prove_args.py).
    method: str = "mtp"
    # Spark recipe and vLLM's Qwen3.5 recipe: MTP-1 (the second position is accepted less often).
    num_speculative_tokens: int = Field(default=1, ge=1, le=16)

    @field_validator("method")
    @classmethod
    def _method(cls, v: str) -> str:
        if not SPEC_METHOD.match(v):
            raise ValueError(f"{v!r}: a vLLM speculative method such as 'mtp' (lowercase, digits, '_')")
        return v

    def as_json(self) -> str:
        """The flag's value, as vLLM's parser reads it (compact JSON, keys in a stable order)."""
        import json

        return json.dumps(self.model_dump(), separators=(",", ":"))


class ServeConfig(_Model):
    """`vllm serve` on the head: the model, its parallelism and the serving recipe's options.

    Defaults of the recipe options come from the two published recipes (docs/model-support.md, Serving): the
    DGX Spark community recipe for this checkpoint (eugr/spark-vllm-docker
    recipes/qwen3.5-122b-fp8.yaml, "Spark recipe" below) and vLLM's Qwen3.5 recipe
    (vllm-project/recipes Qwen/Qwen3.5.md, "vLLM recipe").
    """

    model: str = "Qwen/Qwen3.5-122B-A10B-FP8"
    tensor_parallel_size: int = Field(default=2, ge=1, le=512)
    pipeline_parallel_size: int = Field(default=1, ge=1, le=64)
    port: Port = 8000
    host: str = "0.0.0.0"
    gpu_memory_utilization: float = Field(default=0.85, gt=0.0, le=1.0)
    max_model_len: int | None = Field(default=None, ge=128)
    served_model_name: str | None = None
    # Spark recipe: fp8 halves the full-attention layers' KV bytes per token. `auto`: the model's dtype.
    kv_cache_dtype: Literal[KV_CACHE_DTYPES] = "fp8"  # type: ignore[valid-type]
    # Spark recipe (and vLLM's latency recipe): MTP-1. null turns speculative decoding off.
    speculative: SpeculativeConfig | None = SpeculativeConfig()
    # Spark recipe and vLLM's text-only recipe: experts spread over the ranks instead of sliced.
    expert_parallel: bool = True
    # Both recipes: --enable-prefix-caching. false: --no-enable-prefix-caching; null: vLLM's default.
    prefix_caching: bool | None = True
    # Both recipes: Qwen3.5 thinks in <think> blocks; the `qwen3` parser splits them out.
    reasoning_parser: str | None = "qwen3"
    # Both recipes: tool calls in Qwen's XML form. Auto tool choice needs a parser.
    tool_call_parser: str | None = "qwen3_coder"
    enable_auto_tool_choice: bool = True
    # Spark recipe: 4 sequences at once, 8192 tokens per scheduler step (two Sparks, long contexts).
    max_num_seqs: int | None = Field(default=4, ge=1, le=4096)
    max_num_batched_tokens: int | None = Field(default=8192, ge=1, le=1 << 22)
    # Spark recipe and vLLM's text-only recipe: the vision encoder is not loaded (more KV cache).
    language_model_only: bool = True
    extra_args: list[str] = []
    # A 120 GB model takes a while to load from disk over two nodes.
    ready_timeout: int = Field(default=3600, ge=10, le=6 * 3600)

    @field_validator("model")
    @classmethod
    def _model(cls, v: str) -> str:
        if not MODEL_ID.match(v):
            raise ValueError(f"{v!r}: give a Hugging Face id (org/name) or an absolute path")
        return v

    @field_validator("host")
    @classmethod
    def _host(cls, v: str) -> str:
        return _check_host(v)

    @field_validator("served_model_name")
    @classmethod
    def _served(cls, v: str | None) -> str | None:
        if v is not None and not SERVED_NAME.match(v):
            raise ValueError(f"{v!r}: letters, digits and . _ : / - only")
        return v

    @field_validator("reasoning_parser", "tool_call_parser")
    @classmethod
    def _parser(cls, v: str | None) -> str | None:
        if v is not None and not PARSER_NAME.match(v):
            raise ValueError(f"{v!r}: a vLLM parser name such as 'qwen3' or 'qwen3_coder'")
        return v

    @field_validator("extra_args")
    @classmethod
    def _extra(cls, v: list[str]) -> list[str]:
        for arg in v:
            flag = arg.split("=", 1)[0]
            if flag in SECRET_FLAGS:
                # Never echo the value: it is a secret that would land in argv and in plain state.
                raise ValueError(
                    f"{flag} must not be an extra arg (argv and stack state are not secret): "
                    "use `pulumi config set --secret qwen35-spark:api_key` / `hf_token`"
                )
            if any(c in arg for c in ARGV_FORBIDDEN):
                raise ValueError(
                    f"{arg[:60]!r}: an argument may not hold a NUL or a line break "
                    "(give each flag and each value as its own list element)"
                )
            if flag in TYPED_FLAGS:
                raise ValueError(
                    f"{flag} is a typed option: set {TYPED_FLAGS[flag]} instead "
                    "(it is validated, and the model-support check counts it)"
                )
        return v

    @model_validator(mode="after")
    def _coupled(self) -> ServeConfig:
        # A key the chosen mode would ignore is refused, never silently dropped.
        problems = []
        if self.enable_auto_tool_choice and self.tool_call_parser is None:
            problems.append(
                (
                    "serve.enable_auto_tool_choice",
                    "needs serve.tool_call_parser (vLLM refuses auto tool choice without a parser): "
                    "set tool_call_parser (e.g. qwen3_coder) or set this false",
                )
            )
        if (
            self.max_num_batched_tokens is not None
            and self.max_num_seqs is not None
            and self.max_num_batched_tokens < self.max_num_seqs
        ):
            problems.append(
                (
                    "serve.max_num_batched_tokens",
                    f"{self.max_num_batched_tokens} is below max_num_seqs {self.max_num_seqs}: each "
                    "scheduled sequence needs at least one token per step",
                )
            )
        if problems:
            raise _CrossFieldErrors(problems)
        return self

    @property
    def model_name(self) -> str:
        return self.served_model_name or self.model


# `vllm serve` flags that a typed field of ServeConfig owns: refused in `extra_args`, with the field.
TYPED_FLAGS = {
    "--tensor-parallel-size": "serve.tensor_parallel_size",
    "-tp": "serve.tensor_parallel_size",
    "--pipeline-parallel-size": "serve.pipeline_parallel_size",
    "-pp": "serve.pipeline_parallel_size",
    "--distributed-executor-backend": "cluster.executor",
    # vLLM's multi-node flags: the program sets them per node under cluster.executor mp.
    "--nnodes": "cluster.executor (the node count is the nodes list)",
    "-n": "cluster.executor (the node count is the nodes list)",
    "--node-rank": "cluster.executor (each node's rank is set for it)",
    "-r": "cluster.executor (each node's rank is set for it)",
    "--master-addr": "cluster.executor (the head's fabric_ip)",
    "--master-port": "cluster.master_port",
    "--headless": "cluster.executor (every node but the head runs headless)",
    "--host": "serve.host",
    "--port": "serve.port",
    "--gpu-memory-utilization": "serve.gpu_memory_utilization",
    "--max-model-len": "serve.max_model_len",
    "--served-model-name": "serve.served_model_name",
    "--revision": "model.revision (the commit is pinned for you)",
    "--kv-cache-dtype": "serve.kv_cache_dtype",
    "--speculative-config": "serve.speculative",
    "--enable-expert-parallel": "serve.expert_parallel",
    "--no-enable-expert-parallel": "serve.expert_parallel",
    "-ep": "serve.expert_parallel",
    "--enable-prefix-caching": "serve.prefix_caching",
    "--no-enable-prefix-caching": "serve.prefix_caching",
    "--reasoning-parser": "serve.reasoning_parser",
    "--tool-call-parser": "serve.tool_call_parser",
    "--enable-auto-tool-choice": "serve.enable_auto_tool_choice",
    "--max-num-seqs": "serve.max_num_seqs",
    "--max-num-batched-tokens": "serve.max_num_batched_tokens",
    "--language-model-only": "serve.language_model_only",
    "--no-language-model-only": "serve.language_model_only",
}


class FabricCheckMode(str, Enum):
    """What FabricCheck (components/fabric_check) does on each node before any container."""

    # Refuse `pulumi up` on a fabric NCCL would fail on (no ACTIVE port, no RoCE v2 IPv4 GID, MTUs
    # that disagree), before any container on any node.
    ENFORCE = "enforce"
    # Record the verdict in the stack output `fabric` and go on.
    REPORT = "report"
    # No check: NCCL gets the pinned HCAs (or the old default pair) and the pinned GID index, as before.
    OFF = "off"


# Before FabricCheck this list was every stack's NCCL_IB_HCA: what a stack with `fabric.check: off`
# and no pin still gets, so turning the check off never changes what an existing stack deploys.
LEGACY_IB_HCA = ("rocep1s0f0", "roceP2p1s0f0")
GidIndex = Literal["unset", "resolve"] | Annotated[int, Field(ge=0, le=255)]


def _check_hcas(value: list[str] | None) -> list[str] | None:
    for hca in value or ():
        if not HCA.match(hca):
            raise ValueError(f"{hca!r} is not an HCA name (e.g. rocep1s0f0 or rocep1s0f0:1)")
    return value


class FabricConfig(_Model):
    """The RoCE/InfiniBand link: interface for sockets, the per-node check, GID index and MTU."""

    socket_ifname: str = "enp1s0f0np0"
    check: FabricCheckMode = FabricCheckMode.ENFORCE
    # unset: NCCL_IB_GID_INDEX is never set (NCCL picks a RoCE v2 IPv4 GID per device); resolve: each
    # node's FabricCheck finds that index and its containers get it; an index: that value everywhere.
    gid_index: GidIndex = "unset"
    # The MTU every node's fabric path must have; unset: they must agree with the head's.
    mtu: int | None = Field(default=None, ge=576, le=65535)
    # Before FabricCheck (kept working): the HCAs of every node, now the pin of every node
    # (`nodes[].ib_hca` is the per-node pin), and `ib_gid_index: N`, now `gid_index: N`.
    ib_hca: list[str] | None = None
    ib_gid_index: int | None = Field(default=None, ge=0, le=255)
    # Before Ray: each worker's FabricCheck connects to the head's fabric_ip on this port (a listener
    # there for at most seconds) and measures one bounded copy (1 GiB or 3 s) over the fabric.
    probe_port: int = Field(default=29590, ge=1024, le=65535)
    # The probe's floor in Gb/s (gigabits per second, a link's rate: a Spark port is 200); the probe
    # reports GB/s (gigabytes), so 11.8 GB/s is 94.4 Gb/s. Below it `up` and `status` warn.
    min_gbps: float | None = Field(default=None, gt=0)

    @field_validator("socket_ifname")
    @classmethod
    def _ifname(cls, v: str) -> str:
        if not IFNAME.match(v):
            raise ValueError(f"{v!r} is not a network interface name")
        return v

    @field_validator("check", mode="before")
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
        if self.gid_index == "resolve" and self.check is FabricCheckMode.OFF:
            raise ValueError(
                "fabric.gid_index: resolve needs the check: set fabric.check to enforce or report"
            )
        return self

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


class CopyConfig(_Model):
    """How NodeImage copies the image between nodes (its tuning); every field has a safe default."""

    # No byte through the pipe for this long: abort (a stalled link fails instead of hanging).
    stall_timeout_s: float = Field(default=120.0, ge=5)
    # The whole copy of one node, from the first byte to the verified tag.
    deadline_s: float = Field(default=3600.0, ge=30)
    # gzip trades CPU for link bytes; the fabric is fast, so none by default.
    compression: Literal["none", "gzip"] = "none"
    # Left free in the destination's Docker root after the copy.
    disk_reserve_bytes: int = Field(default=2 * 1024**3, ge=0)
    # A classic load writes the tar, then the layers: about twice the layer bytes.
    disk_factor: float = Field(default=2.0, ge=1.0, le=10.0)
    connect_timeout_s: int = Field(default=10, ge=1, le=300)
    # The key and pinned host keys the *source node* uses for the destination's fabric address
    # (paths on the source node; default: the operator's `ssh.identity_file` / `ssh.known_hosts`).
    peer_identity_file: str | None = None
    peer_known_hosts: str | None = None
    # auto: a classic overlay2 source reads only the missing layers from its layer store.
    source_export: Literal["auto", "save"] = "auto"
    # How often a running copy (and the head's Hub fetch) tells the operator bytes, rate and ETA
    # during `pulumi up`; unset: every 30 s (components/provider_kit/progress.py). Lower it for short copies.
    progress_interval_s: float | None = Field(default=None, ge=0.2, le=3600)

    @field_validator("peer_identity_file", "peer_known_hosts")
    @classmethod
    def _peer_paths(cls, v: str | None) -> str | None:
        return _check_path(v)

    def tuning(self) -> dict[str, Any]:
        """The NodeImage `tuning` input: only what differs from the defaults (stable diffs)."""
        return self.model_dump(exclude_defaults=True)


HUB_REPO = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,95}/[A-Za-z0-9][A-Za-z0-9_.-]{0,95}$")
# A branch, tag or 40-hex commit; what the Hub client accepts, without anything a path could abuse.
REVISION = re.compile(r"^[A-Za-z0-9_.][A-Za-z0-9_./-]{0,199}$")
PATTERN = re.compile(r"^[A-Za-z0-9_.*?\[\]/-]{1,200}$")


class ModelConfig(_Model):
    """The checkpoint on every node: which Hub repo and revision, from where, and how it is checked."""

    # Default: `serve.model` when that is a Hub id (an absolute path there means "no checkpoint here").
    repo: str | None = None
    # A branch, tag or commit. Resolved once to a commit sha and recorded: a moving branch never
    # changes a running stack on its own.
    revision: str = "main"
    # hub: fetched on the head from the Hub; cache: already in the head's cache (downloaded by hand).
    source: Literal["hub", "cache"] = "hub"
    allow_patterns: list[str] = []
    ignore_patterns: list[str] = []
    # What `pulumi refresh` checks on every node: presence and size, or every byte re-hashed.
    refresh: Literal["sizes", "full"] = "sizes"
    # A 120 GB download is expensive: `pulumi destroy` leaves the files unless this is false.
    keep_on_destroy: bool = True
    # Per-node HF cache dir (the directory containers mount as HF_HOME); default containers.hf_cache.
    cache_dirs: dict[str, str] = {}
    # Left free on each node's cache filesystem after the copy.
    disk_reserve_bytes: int = Field(default=10 * 1024**3, ge=0)
    # The Python on the head that runs the Hub client. Unset: a short-lived container of the
    # deployment image (it has huggingface_hub, as vLLM needs it; the head's own Python may not).
    # A relative path (`.venv/bin/python`) is this project's own, made absolute against the project
    # directory: only for a head that shares this machine's filesystem (the lab).
    fetch_python: str | None = None
    # The image of that container when it is not the deployment's own (it must have huggingface_hub).
    fetch_image: str | None = None
    # HF_ENDPOINT for the fetch (a mirror or a stand-in Hub); unset: the client's default, the Hub.
    endpoint: str | None = None

    @field_validator("repo")
    @classmethod
    def _repo(cls, v: str | None) -> str | None:
        if v is not None and not HUB_REPO.match(v):
            raise ValueError(f"{v!r}: give a Hugging Face repo id such as Qwen/Qwen3.5-122B-A10B-FP8")
        return v

    @field_validator("revision")
    @classmethod
    def _revision(cls, v: str) -> str:
        if not REVISION.match(v) or ".." in v:
            raise ValueError(f"{v!r}: give a branch, tag or 40-hex commit (letters, digits, . _ - /)")
        return v

    @field_validator("allow_patterns", "ignore_patterns")
    @classmethod
    def _patterns(cls, v: list[str]) -> list[str]:
        for pattern in v:
            if not PATTERN.match(pattern):
                raise ValueError(
                    f"{pattern!r}: a glob such as '*.safetensors' (letters, digits, . _ * ? [ ] / -)"
                )
        return v

    @field_validator("cache_dirs")
    @classmethod
    def _cache_dirs(cls, v: dict[str, str]) -> dict[str, str]:
        for node, path in v.items():
            if not NODE_NAME.match(node):
                raise ValueError(f"{node!r} is not a node name")
            _check_path(path)
        return v

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, v: str | None) -> str | None:
        if v is not None and not re.match(r"^https?://[A-Za-z0-9_.:\[\]-]+(/[A-Za-z0-9_./-]*)?$", v):
            raise ValueError(f"{v!r}: an http(s) URL without credentials, e.g. https://hf-mirror.example")
        return v

    @field_validator("fetch_python")
    @classmethod
    def _python(cls, v: str | None, info: ValidationInfo) -> str | None:
        if v is None or re.match(r"^(/[A-Za-z0-9_.+-]+)+$|^python3(\.[0-9]+)?$", v):
            return v
        if re.match(r"^[A-Za-z0-9_.+-]+(/[A-Za-z0-9_.+-]+)+$", v):
            project = (info.context or {}).get("project_dir", PROJECT_DIR)
            # normpath, not resolve(): a venv's python is a symlink that must stay the venv's.
            return os.path.normpath(Path(project) / v)
        raise ValueError(
            f"{v!r}: an absolute path to a Python, python3, or a path relative to the project "
            "directory such as .venv/bin/python"
        )

    @field_validator("fetch_image")
    @classmethod
    def _fetch_image(cls, v: str | None) -> str | None:
        return None if v is None else _check_ref(v)


class HealthMode(str, Enum):
    """What the health watchdog (components/health, issue 33) does once `up` has finished."""

    # Probe the server; recover a hung or crashed one in steps, memory-checked, within the budget.
    ENFORCE = "enforce"
    # Probe and record what it would do; never act.
    REPORT = "report"
    # No watchdog, no agents.
    OFF = "off"


class HealthConfig(_Model):
    """The watchdog on the head and its agents on the other nodes (docs/health.md)."""

    mode: HealthMode = HealthMode.ENFORCE
    # Seconds between /health probes, and a probe's deadline.
    interval_s: float = Field(default=10, gt=0, le=3600)
    deadline_s: float = Field(default=5, gt=0, le=600)
    # Every Nth probe is also a one-token chat completion, with its own deadline.
    completion_every: int = Field(default=6, ge=1, le=10_000)
    completion_deadline_s: float = Field(default=60, gt=0, le=3600)
    # Consecutive failed probes before a recovery.
    failures: int = Field(default=3, ge=1, le=1000)
    # No verdict before the server was first ready or this long since the containers started (a
    # first boot can spend tens of minutes in JIT tuning).
    startup_s: float = Field(default=3600, ge=0)
    # After a restart, how long to wait for ready before the next step.
    ready_s: float = Field(default=1800, gt=0)
    # How long MemAvailable may take to reach the memory fit's need before a restart.
    memory_wait_s: float = Field(default=300, ge=0)
    # At most this many restarts per window; then everything is stopped for an operator.
    max_restarts: int = Field(default=3, ge=0, le=1000)
    window_s: float = Field(default=3600, gt=0)
    # The watchdog's /metrics and /state, on metrics_host (default: the head's fabric address).
    port: int = Field(default=29592, ge=1024, le=65535)
    metrics_host: str | None = None
    # Each agent listens on its node's fabric address and this port.
    agent_port: int = Field(default=29593, ge=1024, le=65535)

    @field_validator("mode", mode="before")
    @classmethod
    def _mode_off(cls, v: Any) -> Any:
        # YAML 1.1 (Pulumi's stack files) reads an unquoted `off` as false.
        return "off" if v is False else v

    @field_validator("metrics_host")
    @classmethod
    def _host(cls, v: str | None) -> str | None:
        return None if v is None else _check_host(v)

    @model_validator(mode="after")
    def _keys(self) -> HealthConfig:
        problems = []
        if self.mode is HealthMode.OFF:
            problems += [
                (f"health.{key}", "is not read with health.mode off (no watchdog runs): remove it, or set "
                 "health.mode to enforce or report")
                for key in sorted(self.model_fields_set - {"mode"})
            ]  # fmt: skip
        if self.deadline_s >= self.interval_s:
            problems.append(
                ("health.deadline_s", f"{self.deadline_s:g} s is not below health.interval_s "
                 f"({self.interval_s:g} s): a probe must end before the next one; lower it")
            )  # fmt: skip
        if self.port == self.agent_port:
            problems.append(
                ("health.agent_port", f"{self.agent_port} is health.port too: choose another port")
            )
        if problems:
            raise _CrossFieldErrors(problems)
        return self


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
        problems += self._health_problems()
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
        if self.fabric.check is FabricCheckMode.OFF or len(self.nodes) < 2:
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
                f"{port} is {key} too: each worker's fabric probe listens there on the head; choose "
                "another fabric.probe_port",
            )
            for key in taken
        ]

    def _fabric_problems(self) -> list[tuple[str, str]]:
        problems = self._probe_port_problems()
        for i, node in enumerate(self.nodes):
            if node.ib_hca is not None and self.fabric.ib_hca is not None:
                problems.append(
                    (
                        f"nodes.{i}.ib_hca",
                        "fabric.ib_hca (the old pin of every node) is set too: move it to each "
                        "node's nodes[].ib_hca and remove fabric.ib_hca",
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


class _CrossFieldErrors(ValueError):
    def __init__(self, problems: list[tuple[str, str]]):
        self.problems = problems
        super().__init__("; ".join(f"{p}: {m}" for p, m in problems))


SECTIONS: dict[str, type[BaseModel] | None] = {
    "nodes": NodeConfig,
    "ssh": SshConfig,
    "image": ImageConfig,
    "serve": ServeConfig,
    "fabric": FabricConfig,
    "ray": RayConfig,
    "cluster": ClusterConfig,
    "containers": ContainerConfig,
    "copy": CopyConfig,
    "model": ModelConfig,
    "health": HealthConfig,
}
SECRET_KEYS = ("hf_token", "api_key")


def _did_you_mean(key: str, choices: list[str]) -> str:
    close = difflib.get_close_matches(key, choices, n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else f" (known keys: {', '.join(sorted(choices))})"


def _model_for(loc: tuple) -> type[BaseModel] | None:
    """The model whose field list explains an error at `loc` (for 'did you mean')."""
    model: type[BaseModel] | None = StackConfig
    for part in loc[:-1]:
        if isinstance(part, int) or model is None:
            continue
        field = model.model_fields.get(part) or next(
            (f for f in model.model_fields.values() if f.alias == part), None
        )
        if field is None:
            return None
        ann = field.annotation
        args = getattr(ann, "__args__", ())
        model = next((a for a in (ann, *args) if isinstance(a, type) and issubclass(a, BaseModel)), None)
    return model


def _format_errors(exc: ValidationError) -> list[str]:
    problems = []
    for err in exc.errors():
        loc = tuple(err["loc"])
        path = ".".join(str(p) for p in loc)
        if err["type"] == "extra_forbidden":
            model = _model_for(loc)
            hint = _did_you_mean(str(loc[-1]), list(model.model_fields)) if model else ""
            problems.append(f"{path}: unknown key{hint}")
        elif err["type"] == "value_error" and isinstance(err.get("ctx", {}).get("error"), _CrossFieldErrors):
            problems.extend(f"{p}: {m}" for p, m in err["ctx"]["error"].problems)
        else:
            msg = err["msg"].removeprefix("Value error, ")
            problems.append(f"{path or '(top level)'}: {msg}")
    return problems


def parse_stack_config(raw: Mapping[str, Any], project_dir: Path | None = None) -> StackConfig:
    """Validate the `qwen35-spark:*` keys (without the namespace) into a StackConfig or raise ConfigError.

    Relative paths resolve against `project_dir` (default: the directory of Pulumi.yaml).
    """
    problems = []
    known = list(SECTIONS) + list(SECRET_KEYS)
    body = {}
    for key, value in raw.items():
        if key in SECRET_KEYS:
            continue
        if key not in SECTIONS:
            problems.append(f"{key}: unknown key{_did_you_mean(key, known)}")
            continue
        body[key] = value
    if "nodes" not in body:
        problems.append("nodes: missing: list the cluster's nodes (`qwen35-spark:nodes`)")
    if "ssh" not in body:
        problems.append("ssh: missing: at least `ssh.known_hosts` (host keys are pinned)")
    try:
        config = StackConfig.model_validate(body, context={"project_dir": project_dir or PROJECT_DIR})
    except ValidationError as exc:
        missing_sections = {"nodes", "ssh"} - set(body)
        problems += [p for p in _format_errors(exc) if p.split(":")[0] not in missing_sections]
    if problems:
        raise ConfigError(problems)
    return config


def _raw_namespace() -> dict[str, Any]:
    """Every `qwen35-spark:*` key of the stack, parsed from JSON where it is structured."""
    import json

    import pulumi.runtime.config as runtime_config

    merged = {**runtime_config.get_config_env(), **runtime_config.CONFIG.get()}
    raw: dict[str, Any] = {}
    for full_key, value in merged.items():
        namespace, _, key = full_key.partition(":")
        if namespace != NAMESPACE:
            continue
        if isinstance(value, str):
            with contextlib.suppress(ValueError):
                value = json.loads(value)
        raw[key] = value
    return raw


def load_stack_config() -> StackConfig:
    """Read and validate this stack's config; a bad config raises `pulumi.RunError` (no traceback)."""
    import pulumi

    try:
        return parse_stack_config(_raw_namespace())
    except ConfigError as exc:
        raise pulumi.RunError(str(exc)) from None


def load_secrets() -> dict[str, Any]:
    """The optional secrets (`hf_token`, `api_key`) as secret Outputs, or None when unset."""
    import pulumi

    cfg = pulumi.Config(NAMESPACE)
    return {key: cfg.get_secret(key) for key in SECRET_KEYS}
