"""What the check runs on the head, as argument lists and stdin.

The three proofs run in throwaway containers of the image, by image ID, with no network, each
program packed with `node_programs/proof_bootstrap.py` onto the stdin of the image's python3 (the
image needs nothing else):
- the behaviour proof, `patches/prove_model.py` with its `proof_configs/`, the checkpoint's repo
  folder mounted read-only;
- the cluster proof, `patches/prove_cluster.py` (Ray beside vLLM, a one-node Ray cluster);
- the argument proof, `patches/prove_args.py` (`serve_args.py`), the server's argv after
  `--`.
The head's own reads: `node_programs/model_facts.py` and `docker image inspect`.

Building these touches no node; `proof_payload` and the sources read this repository's files.
"""

from __future__ import annotations

import base64
import gzip
import io
import secrets
import tarfile
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Any

from components.model_support.errors import ModelSupportError
from components.model_support.serve_args import ARGS_PROGRAM, args_argv
from components.node_programs import program_stdin, stdin_argv

PATCH_DIR = Path(__file__).resolve().parents[2] / "patches"
PROOF_PROGRAM = "prove_model.py"
PROOF_CONFIGS = "proof_configs"
CLUSTER_PROGRAM = "prove_cluster.py"
# Where the checkpoint's repo folder (models--ORG--NAME) appears inside the check's container.
CONTAINER_REPO = "/qwen35/checkpoint"


def container_name(props: Mapping[str, Any], kind: str) -> str:
    """A fresh name for one throwaway container of the check: `<prefix>-<kind>-<random>`."""
    return f"{props.get('container_prefix') or 'qwen35'}-{kind}-{secrets.token_hex(4)}"


# ---- the proofs' payloads -------------------------------------------------------------------------------


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
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in files:
            data = path.read_bytes()
            info = tarfile.TarInfo(path.relative_to(proof_dir).as_posix())
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))
    # gzip's header holds a time; 0 keeps the bytes the same from one second to the next.
    return base64.b64encode(gzip.compress(buffer.getvalue(), 9, mtime=0)).decode()


def proof_source(payload: str, deadline_s: float, program: str | None = None) -> bytes:
    """What `python3 -` reads in the container: the bootstrap, after a prelude that sets the payload,
    the deadline and `program` (which program of the payload it runs, prove_model.py when None)."""
    chosen = {"PROGRAM_NAME": program} if program else {}
    return program_stdin(
        "proof_bootstrap", assign={"PAYLOAD": payload, "DEADLINE_S": float(deadline_s), **chosen}
    )


def serve_args_source(payload: str, deadline_s: float) -> bytes:
    """The argument proof's stdin: the same bootstrap, running prove_args.py."""
    return proof_source(payload, deadline_s, ARGS_PROGRAM)


# ---- the proofs' containers -----------------------------------------------------------------------------


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


def proof_argv(props: Mapping[str, Any], container_name: str, shards: bool = False) -> list[str]:
    """`docker run` of the proof in a throwaway container of the image (by ID), offline, no network;
    `shards`: the behaviour proof also reads every shard's header (the argument proof needs none)."""
    # Nothing to fetch: the proof uses the checkpoint on disk or its own fixture configs.
    argv = throwaway_run(
        container_name, "model-support", "--env", "HF_HUB_OFFLINE=1", "--env", "TRANSFORMERS_OFFLINE=1"
    )
    snapshot = props.get("snapshot_path") or ""
    program_args = ["-"]
    if snapshot:
        host, inside = checkpoint_mount(snapshot)
        argv += ["--volume", f"{host}:{CONTAINER_REPO}:ro"]
        program_args += ["--checkpoint", inside, *(["--shards"] if shards else [])]
    return [*argv, str(props["image_id"]), *program_args]


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


def serve_args_argv(props: Mapping[str, Any], container_name: str) -> list[str]:
    """`docker run` of the argument proof: the behaviour proof's container (offline, the checkpoint
    mounted), every headless rank's argv (`rank_argvs`) and the server's exact argv after `--`."""
    ranks = {node: [str(arg) for arg in argv] for node, argv in (props.get("rank_argvs") or {}).items()}
    return args_argv(proof_argv(props, container_name), [str(arg) for arg in props["serve_argv"]], ranks)


# ---- the head's own reads -------------------------------------------------------------------------------


def model_facts_argv(snapshot_path: str) -> list[str]:
    """The facts program (read on stdin by the head's python3) about one snapshot."""
    return stdin_argv([snapshot_path])


def model_facts_source() -> bytes:
    """`node_programs/model_facts.py`, for the head's python3 to read on stdin."""
    return program_stdin("model_facts")


def repo_digests_argv(image_id: str) -> list[str]:
    """The repo digests the head's Docker records for an image ID, as one JSON list."""
    return ["docker", "image", "inspect", "--format", "{{json .RepoDigests}}", image_id]
