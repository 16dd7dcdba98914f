"""ModelSupportCheck: on the head, before any Ray container, prove the image loads the checkpoint and fits.

create(), over SSH on the head:
1. With a checkpoint declared: read the snapshot's size and layer count on the head
   (`node_programs/checkpoint_facts.py`) and run the memory-fit preflight (`memory_fit.py`), so a
   model that cannot fit stops here, before any container starts.
2. With a pinned reference (`…@sha256:`): the head's image must carry that repo digest.
3. Run the proof program (`patches/prove_model.py` and its `proof_configs/`) in a short-lived
   container of the image, by image ID: `docker run --rm`, no network, `HF_HUB_OFFLINE=1`, the
   checkpoint's Hugging Face repo folder mounted read-only (its snapshot's `../../blobs` links
   resolve inside it). The program arrives on stdin, packed into `node_programs/proof_bootstrap.py`,
   so the image needs nothing but python3. Its last stdout line is one JSON report.
4. With `cluster` set (the deployment sets it for every strategy), before that proof: the cluster
   layer (`patches/prove_cluster.py`) in another throwaway container of the image: Ray imports
   beside vLLM at the stack's `image.ray_version` (and within vLLM's own Ray pin), a one-node Ray
   cluster starts and stops, vLLM's Ray executor imports. An image without Ray is refused here,
   naming Ray, instead of crash-looping its Ray containers under the readiness gate.
A failed proof stops `pulumi up` naming the stage, the error, the image and its vLLM (mode
`enforce`), or is recorded in the outputs (mode `report`: stand-in images, the lab).

It is a proof, not live state: diff asks for a new run only when the image ID, the checkpoint digest
or the memory inputs change; diff and check do no I/O; read returns what was recorded.
Pickled by reference to this module: keep it importable without side effects, and do not rename
`ModelSupportCheckProvider` (existing stacks refer to it).
"""

from __future__ import annotations

import base64
import io
import json
import re
import secrets
import tarfile
from collections.abc import Mapping
from enum import Enum
from pathlib import Path, PurePosixPath
from typing import Any

import pulumi
import pulumi.dynamic as dynamic
from pulumi.output import Unknown
from pulumi.runtime.rpc import UNKNOWN

from components.config import ModelCheckMode as Mode
from components.errors import Qwen35Error
from components.image_ref import ImageRefError, parse_image_ref
from components.memory_fit import NodeMemory, ServeMemory, check_memory_fit, memory_fit, model_shape
from components.nodes import target_from_dict
from components.remote import RemoteError, Result, SshTransport, stderr_tail
from components.serve_args import (
    ARGS_PROGRAM,
    ServeArgsError,
    args_argv,
    args_source,
)
from components.serve_args import failure_message as args_failure_message
from components.serve_args import parse_report as parse_args_report

PATCH_DIR = Path(__file__).resolve().parent.parent / "patches"
NODE_PROGRAMS = Path(__file__).resolve().parent / "node_programs"
PROOF_PROGRAM = "prove_model.py"
PROOF_CONFIGS = "proof_configs"
# Where the checkpoint's repo folder (models--ORG--NAME) appears inside the check's container.
CONTAINER_REPO = "/qwen35/checkpoint"
DEFAULT_DEADLINE_S = 900
# Beyond the proof's own deadline: SSH, `docker run` start-up and removal.
TRANSPORT_SLACK_S = 60
FACTS_TIMEOUT_S = 120
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
# A change of any of these asks for a new proof; anything else is updated in place.
RERUN_KEYS = ("image_id", "checkpoint_digest", "memory", "serve_argv", "cluster")
SOFT_KEYS = ("node", "image", "mode", "snapshot_path", "deadline_s", "container_prefix")


class ProofExit(int, Enum):
    """The proof program's exit statuses (its contract), and the bootstrap's deadline."""

    PASS = 0
    FAILED = 1
    USAGE = 2
    DEADLINE = 124


# What to do when a stage fails: the README's troubleshooting rows say the same.
STAGE_HINTS = {
    "environment": (
        "the image's python3 cannot run the proof (vLLM, transformers or torch missing or broken): "
        "use an image with vLLM >= 0.17 (image.strategy: prebuilt, image.prebuilt)"
    ),
    "config": (
        "the image's vLLM/transformers cannot load this checkpoint's config.json: use an image whose "
        "vLLM knows this model_type (vLLM >= 0.17 for qwen3_5 / qwen3_5_moe), or pin transformers "
        "to what that vLLM expects"
    ),
    "construct": (
        "the image's vLLM cannot build this architecture (the seed's hybrid stops here at "
        "_mark_tower_model): use a prebuilt image with vLLM >= 0.17 (image.strategy: prebuilt)"
    ),
    "load": (
        "an error naming tensors missing from the checkpoint index (IncompleteLoad, "
        "IncompleteCheckpoint) means the checkpoint on the head is incomplete or not the revision its "
        "config.json belongs to: `pulumi up --refresh` re-sends it; otherwise its tensor names do not "
        "land in the model's parameters: the image's vLLM and this checkpoint (or revision) do not "
        "match; use a vLLM that supports this checkpoint"
    ),
}


# The first vLLM with Qwen3.5 built in, and the architectures the proof knows as Qwen3.5.
NATIVE_VLLM = (0, 17)
QWEN35_ARCHITECTURES = ("Qwen3_5MoeForConditionalGeneration", "Qwen3_5ForConditionalGeneration")
PREBUILT = "use an image with vLLM >= 0.17 and Ray (image.strategy: prebuilt, image.prebuilt)"
CHECKPOINT_AT_FAULT = (
    "check qwen35-spark:model.repo and model.revision (a complete, unmodified Qwen3.5 snapshot), "
    "then `pulumi up --refresh` so the Checkpoint re-verifies its files"
)


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
            "the check called the proof with arguments it refuses: a bug in components/model_support.py "
            "(proof_argv); report it with the error above"
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


class ModelSupportError(Qwen35Error, RuntimeError):
    """The check could not prove support (or could not run); the message says what to do."""


def _known(value: Any) -> bool:
    # The engine's preview sends a not-yet-known input to `check` as an `Unknown` (the provider host
    # of the mock-runtime tests sent the UNKNOWN marker string instead).
    return value is not None and value != UNKNOWN and not isinstance(value, Unknown)


def validate(props: Mapping[str, Any]) -> list[str]:
    """Problems with the inputs, each naming its field (no I/O; unknown values pass)."""
    problems = []
    node = props.get("node")
    if not isinstance(node, Mapping) or not node.get("host") or not node.get("known_hosts"):
        problems.append("node: the head's access details (host, known_hosts) are required")
    image = props.get("image")
    if _known(image):
        try:
            parse_image_ref(image)
        except ImageRefError as exc:
            problems.append(f"image: {exc}")
    image_id = props.get("image_id")
    if _known(image_id) and not (isinstance(image_id, str) and IMAGE_ID.match(image_id)):
        problems.append(f"image_id: {image_id!r} is not a sha256: image ID")
    snapshot = props.get("snapshot_path")
    if _known(snapshot) and snapshot != "" and not (isinstance(snapshot, str) and HOST_PATH.match(snapshot)):
        problems.append(f"snapshot_path: {snapshot!r}: an absolute path without ':', ',' or spaces")
    mode = props.get("mode", Mode.ENFORCE.value)
    if mode not in {m.value for m in Mode}:
        problems.append(f"mode: {mode!r}: one of {', '.join(m.value for m in Mode)}")
    memory = props.get("memory")
    if _known(memory) and memory is not None:
        try:
            _memory_nodes(memory)
            int(memory["tensor_parallel_size"]), int(memory["pipeline_parallel_size"])
            float(memory["gpu_memory_utilization"])
            serve_memory(memory)
        except (KeyError, TypeError, ValueError) as exc:
            problems.append(f"memory: {exc!r}: nodes, tensor/pipeline parallel sizes and utilization")
    return problems


def _memory_nodes(memory: Mapping[str, Any]) -> list[NodeMemory]:
    return [NodeMemory(str(n["name"]), float(n["memory_gb"]), int(n["gpus"])) for n in memory["nodes"]]


# ---- what runs on the head ----------------------------------------------------------------------------


def proof_payload(proof_dir: Path, program_name: str = PROOF_PROGRAM, configs: bool = True) -> str:
    """base64 of a gzip tar of the proof program and its fixture configs (stable bytes for same files)."""
    program = proof_dir / program_name
    if not program.is_file():
        raise ModelSupportError(
            f"model-support check: {program} is missing: the proof program ships with this repository "
            f"(patches/{program_name}); restore it"
        )
    files = [program]
    configs_dir = proof_dir / PROOF_CONFIGS
    if configs and configs_dir.is_dir():
        files += sorted(p for p in configs_dir.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", format=tarfile.PAX_FORMAT) as tar:
        for path in files:
            data = path.read_bytes()
            info = tarfile.TarInfo(path.relative_to(proof_dir).as_posix())
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))
    return base64.b64encode(buffer.getvalue()).decode()


def proof_source(payload: str, deadline_s: float, program: str | None = None) -> bytes:
    """What `python3 -` reads in the container: the payload, the deadline, then the bootstrap
    (`program`: which program of the payload it runs, prove_model.py when None)."""
    bootstrap = (NODE_PROGRAMS / "proof_bootstrap.py").read_text()
    chosen = f"PROGRAM_NAME = {program!r}\n" if program else ""
    return f"PAYLOAD = {payload!r}\nDEADLINE_S = {float(deadline_s)!r}\n{chosen}{bootstrap}".encode()


def checkpoint_mount(snapshot_path: str) -> tuple[str, str]:
    """(host folder to mount, the snapshot's path in the container).

    A Hugging Face snapshot holds relative links into `../../blobs`: mount the repo folder
    (`models--ORG--NAME`) so they resolve; a plain folder of files is mounted as it is.
    """
    snapshot = PurePosixPath(snapshot_path)
    if snapshot.parent.name == "snapshots" and snapshot.parent.parent.name.startswith("models--"):
        repo = snapshot.parent.parent
        return str(repo), f"{CONTAINER_REPO}/{snapshot.relative_to(repo).as_posix()}"
    return str(snapshot), CONTAINER_REPO


def throwaway_run(container_name: str, role: str, *options: str) -> list[str]:
    """`docker run` of a program read on stdin by the image's python3, in a throwaway container with
    no network; `role` labels it (counted per kind), `options` go before the entrypoint."""
    return [
        "docker", "run", "--rm", "-i",
        "--name", container_name,
        "--label", f"qwen35.role={role}",
        "--network", "none",
        *options,
        # The image's own entrypoint (the Ray wrapper script) must not run.
        "--entrypoint", "python3",
    ]  # fmt: skip


def proof_argv(props: Mapping[str, Any], container_name: str) -> list[str]:
    """`docker run` of the proof in a throwaway container of the image (by ID), offline, no network."""
    # Nothing to fetch: the proof uses the checkpoint on disk or its own fixture configs.
    argv = throwaway_run(
        container_name, "model-support", "--env", "HF_HUB_OFFLINE=1", "--env", "TRANSFORMERS_OFFLINE=1"
    )
    snapshot = props.get("snapshot_path") or ""
    program_args = ["-"]
    if snapshot:
        host, inside = checkpoint_mount(snapshot)
        argv += ["--volume", f"{host}:{CONTAINER_REPO}:ro"]
        program_args += ["--checkpoint", inside]
    return [*argv, str(props["image_id"]), *program_args]


def last_json_line(text: str) -> dict[str, Any] | None:
    """The report: the last non-empty stdout line, when it is a JSON object."""
    for line in reversed(text.strip().splitlines()):
        line = line.strip()
        if not line:
            continue
        try:
            value = json.loads(line)
        except ValueError:
            return None
        return value if isinstance(value, dict) else None
    return None


def _image_label(props: Mapping[str, Any], report: Mapping[str, Any] | None = None) -> str:
    image_id = str(props.get("image_id") or "")
    vllm = (report or {}).get("vllm") or "unknown"
    transformers = (report or {}).get("transformers") or "unknown"
    return f"{props.get('image')} ({image_id[:19]}…, vLLM {vllm}, transformers {transformers})"


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
        f"{node}: {what} in image {_image_label(props, report)}",
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


def parse_proof(props: Mapping[str, Any], result: Result) -> dict[str, Any]:
    """The proof's report from its container run; ModelSupportError when it gave none."""
    node = props["node"]["name"]
    report = last_json_line(result.text)
    if result.returncode in (ProofExit.PASS, ProofExit.FAILED, ProofExit.USAGE) and report is not None:
        if report.get("verdict") not in ("pass", "fail"):
            raise ModelSupportError(f"{node}: the proof's report has no verdict: {json.dumps(report)[:300]}")
        if (report["verdict"] == "pass") != (result.returncode == ProofExit.PASS):
            raise ModelSupportError(
                f"{node}: the proof exited {result.returncode} but reported {report['verdict']!r}"
            )
        return report
    if result.returncode == ProofExit.DEADLINE:
        why = f"the proof did not finish within its deadline ({props.get('deadline_s')} s)"
        hint = "raise the check's deadline, or see whether the head is short of memory or CPU"
    elif result.returncode == 125:
        why = "docker could not start the check's container"
        hint = "the image ID must be on the head (NodeImage placed it): run `pulumi up --refresh`"
    elif result.returncode in (126, 127):
        why = "the image has no runnable python3"
        hint = STAGE_HINTS["environment"]
    else:
        why = f"the proof ended without a report (exit {result.returncode})"
        hint = "its stderr is above; a crash of the image's python is an environment failure"
    raise ModelSupportError(
        f"{node}: the model-support check could not run in image {_image_label(props)}: {why}\n"
        f"  stderr: {stderr_tail(result.stderr, lines=20)}\n  next: {hint}"
    )


def checkpoint_facts(transport: SshTransport, snapshot_path: str) -> dict[str, Any]:
    """Size, source of that size and layer count of the snapshot, read on the head."""
    source = (NODE_PROGRAMS / "checkpoint_facts.py").read_bytes()
    result = transport.run(["python3", "-", snapshot_path], stdin=source, timeout=FACTS_TIMEOUT_S)
    report = last_json_line(result.text) if result.ok else None
    if report is None:
        raise RemoteError(
            transport.name, ["python3", "-", snapshot_path], result.returncode, result.stderr,
            "the head needs python3 (it already runs the readiness probe and NodeImage's helpers)",
        )  # fmt: skip
    if report.get("error") or not report.get("weight_bytes"):
        raise ModelSupportError(
            f"{transport.name}: checkpoint snapshot {snapshot_path}: "
            f"{report.get('error') or 'no model.safetensors.index.json and no *.safetensors shards'}\n"
            "  next: the checkpoint on the head is incomplete; `pulumi up --refresh` re-sends it"
        )
    return report


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


def verify_pin(transport: SshTransport, props: Mapping[str, Any]) -> None:
    """A `…@sha256:` reference: the head's image must carry that repo digest."""
    ref = parse_image_ref(props["image"])
    if ref.digest is None:
        return
    argv = ["docker", "image", "inspect", "--format", "{{json .RepoDigests}}", str(props["image_id"])]
    result = transport.run(argv, timeout=FACTS_TIMEOUT_S)
    result.check("the image NodeImage placed on the head must still be there: `pulumi up --refresh`")
    digests = json.loads(result.out or "null") or []
    if not any(d.endswith(f"@{ref.digest}") for d in digests):
        raise ModelSupportError(
            f"{transport.name}: image {ref} is pinned to {ref.digest}, but the head's {ref.tagged} "
            f"({props['image_id'][:19]}…) has repo digests {digests or 'none'}\n"
            f"  next: `docker pull {ref.pullable}` on the head (then tag it {ref.tagged}), "
            "or change the pin in image.prebuilt"
        )


# ---- the cluster layer (issue 27) ---------------------------------------------------------------------

CLUSTER_PROGRAM = "prove_cluster.py"
# What the stack outputs carry of the cluster proof's report.
CLUSTER_FIELDS = ("verdict", "failed_stage", "error", "ray", "wanted", "vllm", "vllm_ray_requirement")
CLUSTER_HINT = (
    "use an image whose Ray is what the stack needs in the interpreter that runs vLLM; an image "
    "without Ray (the seed's donor, NVIDIA's vLLM container): image.strategy: graft carries the base "
    "image's Ray onto it"
)


def cluster_argv(props: Mapping[str, Any], container_name: str) -> list[str]:
    """`docker run` of the cluster proof: no network but loopback (Ray binds 127.0.0.1), by image ID."""
    cluster = props.get("cluster") or {}
    # Its own role: a count of the behaviour proof's containers stays one per run. Ray's object store
    # lives in /dev/shm; Docker's default 64 MB makes it fall back with warnings.
    argv = throwaway_run(container_name, "cluster-check", "--shm-size", "256m")
    argv += [str(props["image_id"]), "-", "--stages", str(cluster.get("stages") or "ray,cluster,executor")]
    if cluster.get("ray_version"):
        argv += ["--ray-version", str(cluster["ray_version"])]
    return argv


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


def check_cluster_layer(transport: SshTransport, props: Mapping[str, Any], deadline: float) -> dict[str, Any]:
    """Run prove_cluster.py in a throwaway container of the image; refuse (enforce) or record it."""
    name = f"{props.get('container_prefix') or 'qwen35'}-cluster-check-{secrets.token_hex(4)}"
    source = proof_source(proof_payload(PATCH_DIR, CLUSTER_PROGRAM, configs=False), deadline, CLUSTER_PROGRAM)
    result = transport.run(cluster_argv(props, name), stdin=source, timeout=deadline + TRANSPORT_SLACK_S)
    report = last_json_line(result.text)
    if report is None or report.get("verdict") not in ("pass", "fail"):
        if result.returncode in (126, 127):
            report = {"verdict": "fail", "failed_stage": "ray", "error": "the image has no runnable python3"}
        else:
            raise ModelSupportError(
                f"{props['node']['name']}: the cluster-layer proof ended without a report in image "
                f"{props.get('image')} (exit {result.returncode})\n"
                f"  stderr: {stderr_tail(result.stderr, lines=20)}"
            )
    outs = {key: report.get(key) for key in CLUSTER_FIELDS}
    if report["verdict"] != "pass":
        message = cluster_failure(props, report)
        if props.get("mode", Mode.ENFORCE.value) == Mode.ENFORCE.value:
            raise ModelSupportError(message)
        pulumi.log.warn(f"{message}\n  (image.model_check: report: continuing)")
    return outs


def run_check(props: Mapping[str, Any], proof_dir: Path | None = None) -> dict[str, Any]:
    """The whole check on the head; the outputs. Raises when it fails (mode enforce) or cannot run."""
    problems = validate(props)
    if not IMAGE_ID.match(str(props.get("image_id") or "")) and not _known(props.get("image_id")):
        # check() lets an unknown ID through (preview); create needs the head's real one.
        problems.append(f"image_id: {props.get('image_id')!r} is not a sha256: image ID")
    if problems:
        raise ModelSupportError("model-support check: " + "; ".join(problems))
    transport = SshTransport(target_from_dict(props["node"]))
    payload = proof_payload(proof_dir or PATCH_DIR)  # before any I/O: a missing program fails at once
    args = (
        proof_payload(proof_dir or PATCH_DIR, ARGS_PROGRAM, configs=False) if props.get("serve_argv") else ""
    )
    outs: dict[str, Any] = {"memory_fit": None, "serve_args": None, "cluster_layer": None}
    snapshot = props.get("snapshot_path") or ""
    if snapshot and props.get("memory"):
        outs["memory_fit"] = check_fit(props, checkpoint_facts(transport, snapshot))
    verify_pin(transport, props)
    deadline = float(props.get("deadline_s") or DEFAULT_DEADLINE_S)
    if props.get("cluster"):
        outs["cluster_layer"] = check_cluster_layer(transport, props, deadline)
    if props.get("serve_argv"):
        outs["serve_args"] = prove_serve_args(transport, props, args, deadline)
    name = f"{props.get('container_prefix') or 'qwen35'}-model-support-{secrets.token_hex(4)}"
    result = transport.run(
        proof_argv(props, name), stdin=proof_source(payload, deadline), timeout=deadline + TRANSPORT_SLACK_S
    )
    report = parse_proof(props, result)
    outs.update({key: report.get(key) for key in REPORT_FIELDS})
    if report["verdict"] != "pass":
        message = failure_message(props, report)
        if props.get("mode", Mode.ENFORCE.value) == Mode.ENFORCE.value:
            raise ModelSupportError(message)
        # The provider process's log goes to stderr (pulumi/pulumi#6065): the outputs carry it too.
        pulumi.log.warn(f"{message}\n  (image.model_check: report: continuing)")
    return outs


def _outputs_of(props: Mapping[str, Any]) -> dict[str, Any]:
    return {key: props.get(key) for key in (*REPORT_FIELDS, "memory_fit", "serve_args", "cluster_layer")}


# ---- the argument proof (components/serve_args.py, patches/prove_args.py) -------------------------------


def prove_serve_args(
    transport: SshTransport, props: Mapping[str, Any], payload: str, deadline: float
) -> dict[str, Any]:
    """The image's vLLM parses the server's exact argv; a refusal stops `up` (mode enforce)."""
    name = f"{props.get('container_prefix') or 'qwen35'}-model-args-{secrets.token_hex(4)}"
    argv = args_argv(proof_argv(props, name), [str(arg) for arg in props["serve_argv"]])
    bootstrap = (NODE_PROGRAMS / "proof_bootstrap.py").read_text()
    result = transport.run(
        argv, stdin=args_source(payload, deadline, bootstrap), timeout=deadline + TRANSPORT_SLACK_S
    )
    node = props["node"]["name"]
    try:
        report = parse_args_report(node, result, last_json_line(result.text))
    except ServeArgsError as exc:
        raise ModelSupportError(str(exc)) from None
    if report["verdict"] != "pass":
        message = args_failure_message(node, _image_label(props, report), report)
        if props.get("mode", Mode.ENFORCE.value) == Mode.ENFORCE.value:
            raise ModelSupportError(message)
        pulumi.log.warn(f"{message}\n  (image.model_check: report: continuing)")
    return report


class ModelSupportCheckProvider(dynamic.ResourceProvider):
    """create: run the check; diff: compare inputs only; read: the recorded proof; delete: nothing."""

    def check(self, _olds: dict[str, Any], news: dict[str, Any]) -> dynamic.CheckResult:
        failures = [
            dynamic.CheckFailure(problem.split(":", 1)[0], problem.split(":", 1)[1].strip())
            for problem in validate(news)
        ]
        return dynamic.CheckResult(news, failures)

    def create(self, props: dict[str, Any]) -> dynamic.CreateResult:
        outs = {**props, **run_check(props)}
        image_id = str(props["image_id"]).removeprefix("sha256:")[:12]
        digest = str(props.get("checkpoint_digest") or "none").removeprefix("sha256:")[:12]
        return dynamic.CreateResult(id_=f"{props['node']['name']}-{image_id}-{digest}", outs=outs)

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> dynamic.DiffResult:
        rerun = [key for key in RERUN_KEYS if olds.get(key) != news.get(key)]
        soft = [key for key in SOFT_KEYS if olds.get(key) != news.get(key)]
        return dynamic.DiffResult(changes=bool(rerun or soft), replaces=rerun, delete_before_replace=True)

    def update(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> dynamic.UpdateResult:
        recorded = _outputs_of(olds)
        if news.get("mode") == Mode.ENFORCE.value and recorded.get("verdict") == "fail":
            # Switching to enforce over a recorded failure: no new run needed to say no.
            raise ModelSupportError(failure_message({**olds, **news}, recorded))
        cluster = recorded.get("cluster_layer") or {}
        if news.get("mode") == Mode.ENFORCE.value and cluster.get("verdict") == "fail":
            raise ModelSupportError(cluster_failure({**olds, **news}, cluster))
        return dynamic.UpdateResult(outs={**news, **recorded})

    def read(self, id_: str, props: dict[str, Any]) -> dynamic.ReadResult:
        # A proof about an image ID and a checkpoint digest does not drift: those are its inputs.
        return dynamic.ReadResult(id_=id_, outs=props)

    def delete(self, _id: str, _props: dict[str, Any]) -> None:
        # The container was `--rm`: nothing is left on the head.
        return None


class ModelSupportCheck(dynamic.Resource, module="qwen35", name="ModelSupportCheck"):
    """On the head: this image loads this checkpoint (config, construction, weights) and it fits."""

    verdict: pulumi.Output[str]
    failed_stage: pulumi.Output[str | None]
    vllm: pulumi.Output[str]
    transformers: pulumi.Output[str]
    architecture: pulumi.Output[str]
    model_type: pulumi.Output[str]
    quantization: pulumi.Output[Any]
    memory_fit: pulumi.Output[dict | None]
    serve_args: pulumi.Output[dict | None]
    # The cluster-layer proof's verdict, Ray's version and what was wanted (None: not asked for). Not
    # `cluster`: that is the input (what to prove), and a dynamic provider's diff sees both in one map.
    cluster_layer: pulumi.Output[dict | None]

    def __init__(
        self,
        name: str,
        *,
        node: dict[str, Any],
        image: str,
        image_id: pulumi.Input[str],
        memory: dict[str, Any],
        mode: str = Mode.ENFORCE.value,
        checkpoint_digest: pulumi.Input[str] | None = None,
        snapshot_path: pulumi.Input[str] | None = None,
        container_prefix: str = "qwen35",
        deadline_s: float = DEFAULT_DEADLINE_S,
        serve_argv: list[str] | None = None,
        cluster: dict[str, Any] | None = None,
        opts: pulumi.ResourceOptions | None = None,
    ):
        props = {
            "node": node,
            "image": image,
            "image_id": image_id,
            "memory": memory,
            "mode": mode,
            "checkpoint_digest": checkpoint_digest,
            "snapshot_path": snapshot_path,
            "container_prefix": container_prefix,
            "deadline_s": deadline_s,
            # The server's final argument list: the image's vLLM must parse it (prove_args.py).
            "serve_argv": serve_argv,
            "cluster": cluster,
            **{key: None for key in (*REPORT_FIELDS, "memory_fit", "serve_args", "cluster_layer")},
        }
        super().__init__(ModelSupportCheckProvider(), name, props, opts)
