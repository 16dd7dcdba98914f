"""The `image` and `copy` sections: where the deployment's image comes from, the model-support check
it must pass, and how NodeImage copies it between nodes.
"""

from __future__ import annotations

import re
from enum import Enum
from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from components.config.fields import _check_path, _check_ref, _CrossFieldErrors, _Model
from components.image_ref import ImageRef, parse_image_ref

# What reaches the image build (tags, pip specs and args): strict patterns, checked before it runs.
IMAGE_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
PIP_SPEC = re.compile(
    r"^(==|>=|<=|~=|!=|>|<)?\s*[0-9]+(\.[0-9]+)*([a-z]+[0-9]*)?(\.post[0-9]+|\.dev[0-9]+)?$"
)
EXTRA_ARG = re.compile(r"^[A-Za-z0-9_./:=,@+%-]*$")


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
    """What a failed model-support check does. Not `CheckMode`: the check has no `off` (every image
    is proven to load the model before a container starts), so `image.model_check` takes these two."""

    # Stop `pulumi up` before any Ray container starts.
    ENFORCE = "enforce"
    # Record the verdict in the stack outputs and go on (stand-in images that hold no vLLM: the lab).
    REPORT = "report"


# The stages each proof of the model-support check can refuse at (patches/prove_model.py,
# prove_args.py, prove_cluster.py), keyed as the check's outputs name the proofs.
PROOF_STAGES: dict[str, tuple[str, ...]] = {
    "behaviour": ("environment", "config", "construct", "load"),
    "serve_args": ("environment", "parse", "validate", "engine_args", "parallel", "loader", "speculative"),
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


class ImageConfig(_Model):
    """The deployment's image: a prebuilt one used as is, or the hybrid built on the head."""

    strategy: ImageStrategy = ImageStrategy.PREBUILT
    # strategy prebuilt: a full Docker reference (name, name:tag, host:port/name:tag, …@sha256:…),
    # present on the head; NodeImage copies it to the other nodes.
    prebuilt: str = DEFAULT_PREBUILT
    # strategy hybrid: the base (Ray/NCCL) and donor (Qwen3.5 code) images, full references.
    base: str = "vllm-node:latest"
    # Older stacks gave the tag apart; still read when `base`/`donor` carry no tag or digest. Leftovers
    # of the keys before 2026-12-02 (7f123fd): remove both once no stack file sets them.
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
