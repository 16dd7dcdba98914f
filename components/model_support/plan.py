"""The model-support check's decisions: pure functions of the inputs, the recorded outputs and the
proof programs' reports, tested as tables.

No I/O here: `programs.py` builds the commands, `execute.py` runs them, `facts.py` parses what they
report, and these functions decide: whether the inputs are usable, which steps create runs, whether
a change asks for a new proof, whether the model fits, what a refusal means and what to do about it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from components.config import ModelCheckMode as Mode
from components.image_ref import ImageRefError, parse_image_ref
from components.model_support.facts import STAGE_HINTS, image_label
from components.model_support.memory_fit import (
    NodeMemory,
    ServeMemory,
    check_memory_fit,
    memory_fit,
    model_shape,
)
from components.provider_kit.change import Change
from components.provider_kit.inputs import known

DEFAULT_DEADLINE_S = 900
IMAGE_ID = re.compile(r"^sha256:[0-9a-f]{64}$")
# A host path Docker's `-v host:container:ro` cannot misread.
HOST_PATH = re.compile(r"^/[A-Za-z0-9_./@+=-]*$")
# What the stack outputs carry of the proof's report.
REPORT_FIELDS = (
    "verdict",
    "failed_stage",
    "error",
    "where",
    "vllm",
    "transformers",
    "torch",
    "architecture",
    "model_type",
    "quantization",
)
# What the stack outputs carry of the cluster proof's report.
CLUSTER_FIELDS = ("verdict", "failed_stage", "error", "ray", "wanted", "vllm", "vllm_ray_requirement")
# Everything create records beside the inputs (update and read return it as recorded).
OUTPUT_KEYS = (*REPORT_FIELDS, "memory_fit", "serve_args", "cluster_layer")
# A change of any of these asks for a whole new proof (a replacement): what the proofs are about.
RERUN_KEYS = ("image_id", "checkpoint_digest", "memory", "cluster")
# A change of these proves the command lines again, in place: the image and the checkpoint are the
# ones proven, so the behaviour and cluster proofs hold (a serving flag changed by `up`).
ARGS_KEYS = ("serve_argv", "rank_argvs")
SOFT_KEYS = ("node", "image", "mode", "snapshot_path", "deadline_s", "container_prefix", "expect")


# The first vLLM with Qwen3.5 built in, and the architectures the proof knows as Qwen3.5.
NATIVE_VLLM = (0, 17)
QWEN35_ARCHITECTURES = ("Qwen3_5MoeForConditionalGeneration", "Qwen3_5ForConditionalGeneration")
PREBUILT = "use an image with vLLM >= 0.17 and Ray (image.strategy: prebuilt, image.prebuilt)"
CHECKPOINT_AT_FAULT = (
    "check qwen35-spark:model.repo and model.revision (a complete, unmodified Qwen3.5 snapshot), "
    "then `pulumi up --refresh` so the Checkpoint re-verifies its files"
)
CLUSTER_HINT = (
    "use an image whose Ray is what the stack needs in the interpreter that runs vLLM; an image "
    "without Ray (the seed's donor, NVIDIA's vLLM container): image.strategy: graft carries the base "
    "image's Ray onto it"
)


# ---- the inputs ----------------------------------------------------------------------------------------


def validate(props: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Problems with the inputs, each naming its field (no I/O; unknown values pass)."""
    problems = []
    node = props.get("node")
    if not isinstance(node, Mapping) or not node.get("host") or not node.get("known_hosts"):
        problems.append(("node", "the head's access details (host, known_hosts) are required"))
    image = props.get("image")
    if known(image):
        try:
            parse_image_ref(image)
        except ImageRefError as exc:
            problems.append(("image", f"{exc}"))
    image_id = props.get("image_id")
    if known(image_id) and not (isinstance(image_id, str) and IMAGE_ID.match(image_id)):
        problems.append(("image_id", f"{image_id!r} is not a sha256: image ID"))
    snapshot = props.get("snapshot_path")
    if known(snapshot) and snapshot != "" and not (isinstance(snapshot, str) and HOST_PATH.match(snapshot)):
        problems.append(("snapshot_path", f"{snapshot!r}: an absolute path without ':', ',' or spaces"))
    mode = props.get("mode", Mode.ENFORCE.value)
    if mode not in {m.value for m in Mode}:
        problems.append(("mode", f"{mode!r}: one of {', '.join(m.value for m in Mode)}"))
    memory = props.get("memory")
    if known(memory) and memory is not None:
        try:
            _memory_nodes(memory)
            int(memory["tensor_parallel_size"]), int(memory["pipeline_parallel_size"])
            float(memory["gpu_memory_utilization"])
            serve_memory(memory)
        except (KeyError, TypeError, ValueError) as exc:
            problems.append(("memory", f"{exc!r}: nodes, tensor/pipeline parallel sizes and utilization"))
    return problems


def create_problems(props: Mapping[str, Any]) -> list[str]:
    """What `validate` says, and an image ID still unknown: check() lets one through (preview);
    create needs the head's real one."""
    problems = [f"{key}: {reason}" for key, reason in validate(props)]
    if not IMAGE_ID.match(str(props.get("image_id") or "")) and not known(props.get("image_id")):
        problems.append(f"image_id: {props.get('image_id')!r} is not a sha256: image ID")
    return problems


def enforced(props: Mapping[str, Any]) -> bool:
    """A failed proof stops `up` (mode enforce) rather than only being recorded (mode report)."""
    return props.get("mode", Mode.ENFORCE.value) == Mode.ENFORCE.value


def expected_refusal(props: Mapping[str, Any], proof: str, report: Mapping[str, Any]) -> bool:
    """The stack declared this refusal (image.model_check_expects): the proof's stage as named."""
    stage = ((props.get("expect") or {}).get(proof)) or None
    return stage is not None and report.get("verdict") == "fail" and report.get("failed_stage") == stage


def expected_summary(props: Mapping[str, Any], refused: Mapping[str, str]) -> str:
    """One line for the refusals the stack expected (`refused`: proof -> stage), and why."""
    node = props["node"]["name"]
    stages = ", ".join(f"{proof} at '{stage}'" for proof, stage in refused.items())
    because = (props.get("expect") or {}).get("because") or "declared by image.model_check_expects"
    return (
        f"{node}: the model-support check cannot prove {props.get('image')} here, as this stack expects "
        f"({stages}): {because}; the verdicts are in the `model_support` output"
    )


# ---- which steps create runs, and when a change asks for them again -------------------------------------


@dataclass(frozen=True)
class Steps:
    """What create (or an update) runs on the head, in this order."""

    fit: bool  # read the snapshot's facts and check the memory fit (a checkpoint and memory declared)
    pin: bool  # the reference is pinned (`…@sha256:`): the head's image must carry that repo digest
    cluster: bool  # the cluster-layer proof (patches/prove_cluster.py)
    serve_args: bool  # the argument proof of the server's argv (patches/prove_args.py)
    deadline_s: float  # each proof's own deadline
    behaviour: bool = True  # the behaviour proof (patches/prove_model.py), last

    @property
    def runs(self) -> bool:
        return self.fit or self.pin or self.cluster or self.serve_args or self.behaviour


def plan_steps(props: Mapping[str, Any], olds: Mapping[str, Any] | None = None) -> Steps:
    """From validated inputs (create_problems found none): the steps of create, or of an update from
    `olds` (no key of RERUN_KEYS changed, or diff would have replaced): only the argument proof, and
    only when a command line changed (ARGS_KEYS); the recorded proofs hold for the rest."""
    deadline_s = float(props.get("deadline_s") or DEFAULT_DEADLINE_S)
    change = plan_change(olds, props) if olds is not None else None
    if change is not None and not change.replaces:
        argv = bool(props.get("serve_argv")) and change.updates_any(ARGS_KEYS)
        return Steps(False, False, False, argv, deadline_s, behaviour=False)
    return Steps(
        fit=bool(props.get("snapshot_path") and props.get("memory")),
        pin=parse_image_ref(props["image"]).digest is not None,
        cluster=bool(props.get("cluster")) and cluster_not_run(props) is None,
        serve_args=bool(props.get("serve_argv")),
        deadline_s=deadline_s,
    )


def cluster_not_run(props: Mapping[str, Any]) -> dict[str, Any] | None:
    """What the outputs record when the cluster input names executor mp: the Ray cluster-layer proof
    does not apply (no Ray runs under vLLM's own multi-node executor), so it is not run; else None."""
    cluster = props.get("cluster") or {}
    if cluster.get("executor") != "mp":
        return None
    return {
        "verdict": "not-run",
        "executor": "mp",
        "reason": "cluster.executor is mp: no Ray container runs, so the Ray cluster layer is not proven",
    }


def plan_change(olds: Mapping[str, Any], news: Mapping[str, Any]) -> Change:
    """A proof about an image ID, a checkpoint digest and the memory inputs holds until one of those
    (RERUN_KEYS) changes; a new command line (ARGS_KEYS) is proven again in place; the rest
    (SOFT_KEYS) is recorded in place. No I/O. A replacement deletes the old check first (as it has
    since the check's first version: its delete leaves nothing on the head, so the order costs nothing)."""
    return Change(
        tuple(key for key in RERUN_KEYS if olds.get(key) != news.get(key)),
        tuple(key for key in (*ARGS_KEYS, *SOFT_KEYS) if olds.get(key) != news.get(key)),
        delete_before_replace=True,
    )


def check_id(props: Mapping[str, Any]) -> str:
    """The resource's ID: the head, the image ID and the checkpoint digest it proved."""
    image_id = str(props["image_id"]).removeprefix("sha256:")[:12]
    digest = str(props.get("checkpoint_digest") or "none").removeprefix("sha256:")[:12]
    return f"{props['node']['name']}-{image_id}-{digest}"


def recorded_outputs(props: Mapping[str, Any]) -> dict[str, Any]:
    """The outputs a create recorded (update keeps them: no new run)."""
    return {key: props.get(key) for key in OUTPUT_KEYS}


def recorded_refusal(olds: Mapping[str, Any], news: Mapping[str, Any]) -> str | None:
    """Switching to enforce over a recorded failure: what to refuse with (no new run needed to say
    no); None when the update may go on."""
    if news.get("mode") != Mode.ENFORCE.value:
        return None
    recorded = recorded_outputs(olds)
    if recorded.get("verdict") == "fail":
        return failure_message({**olds, **news}, recorded)
    cluster = recorded.get("cluster_layer") or {}
    if cluster.get("verdict") == "fail":
        return cluster_failure({**olds, **news}, cluster)
    return None


# ---- the memory fit -------------------------------------------------------------------------------------


def _memory_nodes(memory: Mapping[str, Any]) -> list[NodeMemory]:
    return [NodeMemory(str(n["name"]), float(n["memory_gb"]), int(n["gpus"])) for n in memory["nodes"]]


def serve_memory(memory: Mapping[str, Any]) -> ServeMemory:
    """The serving options of the `memory` input (absent in stacks recorded before they existed)."""
    max_len = memory.get("max_model_len")
    return ServeMemory(
        max_model_len=int(max_len) if max_len else None,
        kv_cache_dtype=str(memory.get("kv_cache_dtype") or "auto"),
        speculative_tokens=int(memory.get("speculative_tokens") or 0),
        language_model_only=bool(memory.get("language_model_only")),
        speculative_method=str(memory.get("speculative_method") or "mtp"),
    )


def check_fit(props: Mapping[str, Any], facts: Mapping[str, Any]) -> dict[str, Any]:
    """The memory-fit preflight for this checkpoint; MemoryFitError (with the numbers) if it does not fit."""
    memory = props["memory"]
    utilization = float(memory["gpu_memory_utilization"])
    config = facts.get("config")
    fit = memory_fit(
        int(facts["weight_bytes"]),
        _memory_nodes(memory),
        int(memory["tensor_parallel_size"]),
        int(memory["pipeline_parallel_size"]),
        utilization,
        facts.get("num_layers"),
        shape=model_shape(config) if isinstance(config, Mapping) else None,
        serve=serve_memory(memory),
        mtp_bytes=int(facts.get("mtp_bytes") or 0),
        vision_bytes=int(facts.get("vision_bytes") or 0),
    )
    check_memory_fit(fit, utilization)
    return {**fit.summary(), "weights_from": facts.get("weight_source"), "layers": facts.get("num_layers")}


def pin_mismatch(node: str, props: Mapping[str, Any], repo_digests: list[str]) -> str | None:
    """A `…@sha256:` reference whose digest is not among the head image's repo digests: what to say
    (None: not pinned, or the head's image carries it)."""
    ref = parse_image_ref(props["image"])
    if ref.digest is None or any(d.endswith(f"@{ref.digest}") for d in repo_digests):
        return None
    return (
        f"{node}: image {ref} is pinned to {ref.digest}, but the head's {ref.tagged} "
        f"({props['image_id'][:19]}…) has repo digests {repo_digests or 'none'}\n"
        f"  next: `docker pull {ref.pullable}` on the head (then tag it {ref.tagged}), "
        "or change the pin in image.prebuilt"
    )


# ---- the proofs' refusals -----------------------------------------------------------------------------


def _release(version: Any) -> tuple[int, int] | None:
    """(major, minor) of a version such as '0.17.1rc1' or '0.17.1+cu130'; None when not reported."""
    match = re.match(r"(\d+)\.(\d+)", str(version or ""))
    return (int(match[1]), int(match[2])) if match else None


def next_step(report: Mapping[str, Any]) -> str:
    """What to do about a failed proof, from what failed: the image's vLLM or transformers, the
    checkpoint, the stack config, or the check's own call of the proof (a usage error)."""
    stage, error = report.get("failed_stage"), str(report.get("error") or "")
    vllm, transformers = report.get("vllm"), report.get("transformers")
    release = _release(vllm)
    if not stage and error.startswith("UsageError"):
        if "--checkpoint" in error:
            return (
                f"the checkpoint on the head is not a complete Hugging Face snapshot: {CHECKPOINT_AT_FAULT}"
            )
        return (
            "the check called the proof with arguments it refuses: a bug in "
            "components/model_support/programs.py (proof_argv); report it with the error above"
        )
    if stage == "environment" and not vllm:
        return f"the image has no vLLM: {PREBUILT}"
    if release is not None and release < NATIVE_VLLM:
        return f"the image's vLLM {vllm} predates native Qwen3.5 support (0.17): {PREBUILT}"
    if stage == "environment":
        return (
            f"the image's vLLM {vllm} is recent enough, but its Python environment does not import "
            f"(transformers {transformers}, torch {report.get('torch')}; the error above names the "
            "package): rebuild the image or fix its packages"
        )
    if stage == "config" and report.get("architecture") not in (None, *QWEN35_ARCHITECTURES):
        return (
            f"the checkpoint is a {report.get('architecture')} ({report.get('model_type')}), not the "
            "Qwen3.5 this stack serves: set qwen35-spark:model.repo (and model.revision) to a Qwen3.5 "
            "checkpoint"
        )
    if stage == "config" and (_release(transformers) or (0, 0)) >= (5, 0):
        return (
            f"the image's transformers {transformers} is newer than what vLLM {vllm} loads Qwen3.5's "
            "config with (4.57.6 for 0.17): pin transformers to what that vLLM expects "
            "(image.transformers for a hybrid build), or use an image whose packages match"
        )
    verb = {"config": "read", "construct": "build", "load": "load"}.get(stage)
    if verb and release is not None:
        return (
            f"the image's vLLM {vllm} supports Qwen3.5, so the checkpoint is what it cannot {verb}: "
            f"{CHECKPOINT_AT_FAULT}"
        )
    return STAGE_HINTS.get(stage, "read the error above")


def failure_message(props: Mapping[str, Any], report: Mapping[str, Any]) -> str:
    """The proof said no: stage, error, where, the image and its versions, what to do."""
    node = props["node"]["name"]
    stage = report.get("failed_stage")
    if stage:
        what = f"the model-support check failed at stage '{stage}'"
    elif str(report.get("error") or "").startswith("UsageError"):
        what = "the model-support check's proof refused its inputs (a usage error)"
    else:
        what = "the model-support check failed (the proof named no stage)"
    lines = [
        f"{node}: {what} in image {image_label(props, report)}",
        f"  error: {report.get('error') or '(none reported)'}",
    ]
    if report.get("where"):
        lines.append(f"  where: {report['where']}")
    if report.get("architecture") or report.get("model_type"):
        lines.append(
            f"  checkpoint: {report.get('architecture')} / {report.get('model_type')} / "
            f"quantization {json.dumps(report.get('quantization'))}"
        )
    lines.append(f"  next: {next_step(report)}")
    return "\n".join(lines)


def cluster_failure(props: Mapping[str, Any], report: Mapping[str, Any]) -> str:
    """The cluster layer said no: Ray, its version, the stage, what to do."""
    node = props["node"]["name"]
    wanted = (props.get("cluster") or {}).get("ray_version") or "any (vLLM's own pin)"
    return (
        f"{node}: the model-support check refused image {props.get('image')} "
        f"({str(props.get('image_id'))[:19]}…): its cluster layer failed at stage "
        f"'{report.get('failed_stage')}'\n"
        f"  Ray: {report.get('ray') or 'none'} (the stack needs {wanted}); "
        f"vLLM: {report.get('vllm') or 'unknown'}\n"
        f"  error: {report.get('error') or '(none reported)'}\n"
        f"  next: {CLUSTER_HINT}"
    )
