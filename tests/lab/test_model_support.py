"""The model-support check for real on node-a: its provider runs `docker run` over SSH on the lab node,
in a stand-in image (the lab's debootstrapped Debian: python3, no torch, no vLLM), with a checkpoint in
the Hugging Face cache layout mounted read-only.

- The real proof program (patches/prove_model.py) in that image must FAIL at its `environment` stage:
  there is no vLLM to prove, and the check must say so, naming the stage and the image.
- The pass path and "not run again when nothing changed" use a TEST DOUBLE of the proof program
  (DOUBLE_PROGRAM below, shipped exactly as the real one is). It proves nothing about vLLM: it passes
  only if the container it runs in is offline (HF_HUB_OFFLINE=1), has no network but loopback, sees
  the checkpoint's config.json through the snapshot's relative links, and cannot write to it.
- The memory-fit preflight reads the checkpoint's index over SSH on the node and stops a model that
  does not fit before any container starts.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pulumi
import pytest

import lab
from components import model_support
from components.model_support import ModelSupportCheckProvider, ModelSupportError, execute
from components.model_support.errors import MemoryFitError
from components.model_support.memory_fit import GB
from lab.images import DEBIAN_TAG
from lab.ray_image import ray_image
from tests.support.declared import plain
from tests.support.program import run_program, stack_config
from tests.support.provider_host import Engine, ProviderHost

pytestmark = pytest.mark.lab

LABEL = "qwen35.role=model-support"

DOUBLE_PROGRAM = r'''
"""TEST DOUBLE of patches/prove_model.py (same command line and report), for the lab only."""
import errno, json, os, sys

args = sys.argv[1:]
checkpoint = args[args.index("--checkpoint") + 1] if "--checkpoint" in args else None
here = os.path.dirname(os.path.abspath(__file__))
problems = []
if os.environ.get("HF_HUB_OFFLINE") != "1":
    problems.append("HF_HUB_OFFLINE is not 1")
interfaces = sorted(os.listdir("/sys/class/net"))
if interfaces != ["lo"]:
    problems.append(f"network interfaces {interfaces}, expected only lo")
if not os.path.isdir(os.path.join(here, "proof_configs")):
    problems.append("proof_configs/ was not shipped next to the program")
report = {"verdict": "pass", "failed_stage": None, "error": None, "where": None, "vllm": "double",
          "transformers": "double", "torch": None, "architecture": None, "model_type": None,
          "quantization": None, "checks": []}
if checkpoint:
    try:
        with open(os.path.join(checkpoint, "config.json")) as handle:  # a link into ../../blobs
            config = json.load(handle)
        report.update(architecture=config["architectures"][0], model_type=config["model_type"],
                      quantization=config.get("quantization_config"))
    except OSError as exc:
        problems.append(f"config.json unreadable: {exc}")
    try:
        open(os.path.join(checkpoint, "written-by-the-check"), "w").close()
        problems.append("the checkpoint is writable")
    except OSError as exc:
        if exc.errno != errno.EROFS:
            problems.append(f"writing the checkpoint failed with {exc}, not EROFS")
if problems:
    report.update(verdict="fail", failed_stage="environment", error="; ".join(problems))
print("double: " + ("ok" if not problems else "; ".join(problems)), file=sys.stderr)
print(json.dumps(report))
sys.exit(1 if problems else 0)
'''


@pytest.fixture(scope="module")
def standin_image(node_a) -> str:
    """The image ID of the lab's Debian image on node-a: python3 and nothing of vLLM."""
    return lab.debian_image(node_a)


@pytest.fixture
def double_dir(tmp_path, monkeypatch) -> Path:
    """The test double in place of patches/ (prove_model.py + proof_configs/), for this test only."""
    folder = tmp_path / "double"
    (folder / "proof_configs" / "tiny").mkdir(parents=True)
    (folder / "proof_configs" / "tiny" / "config.json").write_text("{}")
    (folder / "prove_model.py").write_text(DOUBLE_PROGRAM)
    monkeypatch.setattr(execute, "PATCH_DIR", folder)
    return folder


def hf_checkpoint(root: Path, total_size: int) -> Path:
    """A checkpoint in the Hugging Face cache layout: blobs, a snapshot of relative links, refs."""
    repo = root / "hub" / "models--lab--standin-qwen35"
    sha = "0123456789abcdef0123456789abcdef01234567"
    blobs, snapshot = repo / "blobs", repo / "snapshots" / sha
    blobs.mkdir(parents=True)
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(sha)
    config = {
        "architectures": ["Qwen3_5MoeForConditionalGeneration"],
        "model_type": "qwen3_5_moe",
        "text_config": {"num_hidden_layers": 48},
        "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]},
    }
    files = {
        "config.json": json.dumps(config).encode(),
        "model.safetensors.index.json": json.dumps(
            {"metadata": {"total_size": total_size}, "weight_map": {"lm_head.weight": "model.safetensors"}}
        ).encode(),
        "model.safetensors": b"\0" * 4096,
    }
    for index, (name, data) in enumerate(files.items()):
        blob = blobs / f"{index:064x}"
        blob.write_bytes(data)
        (snapshot / name).symlink_to(os.path.relpath(blob, snapshot))
    return snapshot


def check_props(node: lab.LabNode, image_id: str, snapshot: Path | None, nodes: int = 2) -> dict:
    memory = {
        "nodes": [{"name": f"n{i}", "memory_gb": 128.0, "gpus": 1} for i in range(nodes)],
        "tensor_parallel_size": nodes,
        "pipeline_parallel_size": 1,
        "gpu_memory_utilization": 0.85,
    }
    return {
        "node": {**lab.node_config(node), "name": node.name},
        "image": DEBIAN_TAG,
        "image_id": image_id,
        "memory": memory,
        "mode": "enforce",
        "checkpoint_digest": "sha256:" + "5" * 64 if snapshot else None,
        "snapshot_path": str(snapshot) if snapshot else None,
        "container_prefix": "qwen35-lab",
        "deadline_s": 120,
    }


def check_containers_created(node: lab.LabNode, since: float) -> list[str]:
    """Names of model-support containers the node's daemon created since `since` (unix seconds)."""
    until = f"{time.time() + 1:.3f}"
    found = lab.docker(
        node, "events", "--since", f"{since:.3f}", "--until", until,
        "--filter", "type=container", "--filter", "event=create", "--filter", f"label={LABEL}",
        "--format", "{{.Actor.Attributes.name}}",
    )  # fmt: skip
    return found.out.split()


def leftover_containers(node: lab.LabNode) -> list[str]:
    return lab.docker(node, "ps", "-a", "--filter", f"label={LABEL}", "--format", "{{.Names}}").out.split()


def test_the_real_proof_fails_an_image_without_vllm_naming_the_environment(node_a, standin_image, tmp_path):
    assert (model_support.PATCH_DIR / "prove_model.py").is_file(), "patches/prove_model.py is missing"
    snapshot = hf_checkpoint(tmp_path, total_size=4096)
    since = time.time()
    with pytest.raises(ModelSupportError) as info:
        ModelSupportCheckProvider().create(check_props(node_a, standin_image, snapshot))
    message = str(info.value)
    assert "node-a: the model-support check failed at stage 'environment'" in message, message
    assert DEBIAN_TAG in message and standin_image[:19] in message
    assert "vLLM >= 0.17" in message
    assert len(check_containers_created(node_a, since)) == 1
    assert leftover_containers(node_a) == []


def test_report_mode_records_the_real_proofs_verdict(node_a, standin_image):
    # The lab stack's setting (Pulumi.lab.yaml): the verdict is recorded and the deployment goes on.
    props = {**check_props(node_a, standin_image, None), "mode": "report"}
    created = ModelSupportCheckProvider().create(props)
    assert created.outs["verdict"] == "fail" and created.outs["failed_stage"] == "environment"


def test_the_double_passes_offline_read_only_and_is_not_run_again(
    node_a, standin_image, double_dir, tmp_path
):
    snapshot = hf_checkpoint(tmp_path, total_size=4096)
    provider = ModelSupportCheckProvider()
    props = check_props(node_a, standin_image, snapshot)
    since = time.time()
    created = provider.create(props)
    outs = created.outs
    assert outs["verdict"] == "pass", outs
    # Read from the mounted snapshot, through its links into ../../blobs.
    assert (
        outs["architecture"] == "Qwen3_5MoeForConditionalGeneration" and outs["model_type"] == "qwen3_5_moe"
    )
    assert outs["quantization"] == {"quant_method": "fp8", "weight_block_size": [128, 128]}
    assert outs["memory_fit"]["fits"] is True and outs["memory_fit"]["weights_from"] == "index"
    assert len(check_containers_created(node_a, since)) == 1
    assert leftover_containers(node_a) == []
    assert not (snapshot / "written-by-the-check").exists()

    # Unchanged inputs: no change, so the engine calls neither create nor update; refresh reads state.
    after_create = time.time()
    assert provider.diff(created.id, outs, dict(props)).changes is False
    assert provider.read(created.id, outs).outs == outs
    # A new image ID asks for a new proof.
    assert provider.diff(created.id, outs, {**props, "image_id": "sha256:" + "9" * 64}).replaces == [
        "image_id"
    ]
    assert check_containers_created(node_a, after_create) == []


def test_a_model_that_does_not_fit_stops_before_any_container(node_a, standin_image, double_dir, tmp_path):
    # The index says 126 GB (the 122B FP8 checkpoint's size); one 128 GB node cannot hold it.
    snapshot = hf_checkpoint(tmp_path, total_size=126 * GB)
    since = time.time()
    with pytest.raises(MemoryFitError) as info:
        ModelSupportCheckProvider().create(check_props(node_a, standin_image, snapshot, nodes=1))
    assert "126.0 GB of weights" in str(info.value) and "n0: needs 132.0 GB per GPU, has 108.8 GB" in str(
        info.value
    )
    assert check_containers_created(node_a, since) == []
    # Over two nodes the same checkpoint fits and the proof runs.
    assert ModelSupportCheckProvider().create(check_props(node_a, standin_image, snapshot))


def test_the_lab_stacks_check_reports_on_the_lab_ray_image(node_a, tmp_path, monkeypatch):
    """The check as the lab stack declares it (Pulumi.lab.yaml: `model_check: report`), run against the
    image the lab cluster really runs (Debian + Ray + the stand-in `vllm`): the real proof finds no
    torch, the verdict is recorded, and the deployment would go on to start Ray. Every refusal is one
    the stack declares (`model_check_expects`): one line, no warning."""
    said: dict[str, list[str]] = {"warn": [], "info": []}
    monkeypatch.setattr(pulumi.log, "warn", lambda message, *_a, **_k: said["warn"].append(message))
    monkeypatch.setattr(pulumi.log, "info", lambda message, *_a, **_k: said["info"].append(message))
    run = run_program(stack_config("lab"))
    declared = run.named("qwen35-model-support")
    props = {k: v for k, v in plain(declared.inputs).items() if k != "__provider"}
    assert props["mode"] == "report" and props["node"]["host"] == node_a.host
    _, ray_image_id = ray_image(node_a)
    # The mocked head checkpoint's path does not exist on node-a: a real one in the same layout does.
    assert props["snapshot_path"] and props["checkpoint_digest"]
    snapshot = hf_checkpoint(tmp_path, total_size=4096)
    created = ModelSupportCheckProvider().create(
        {**props, "image_id": ray_image_id, "snapshot_path": str(snapshot)}
    )
    assert created.outs["verdict"] == "fail" and created.outs["failed_stage"] == "environment"
    assert leftover_containers(node_a) == []
    assert said["warn"] == [] and len(said["info"]) == 1, said
    assert "behaviour at 'environment'" in said["info"][0] and "cluster_layer at 'ray'" in said["info"][0]


def test_the_check_through_the_provider_host_runs_once_until_the_image_changes(
    node_a, standin_image, tmp_path
):
    """As `pulumi up` drives it: the provider pickled by the SDK, served by a fresh `python -m
    pulumi.dynamic`, Check/Create/Diff/Read/Delete over gRPC with the inputs the lab stack registers."""
    run = run_program(stack_config("lab"))
    declared = run.named("qwen35-model-support")
    _, ray_image_id = ray_image(node_a)
    snapshot = hf_checkpoint(tmp_path, total_size=4096)
    registered = {**declared.inputs, "image_id": ray_image_id, "snapshot_path": str(snapshot)}
    with ProviderHost() as host:
        engine = Engine(host, stack="lab")
        since = time.time()
        state = engine.create(declared.typ, declared.name, registered, timeout=300)
        outputs = state.public_outputs()
        assert outputs["verdict"] == "fail" and outputs["failed_stage"] == "environment", outputs
        assert outputs["memory_fit"]["fits"] is True
        # The argument proof ran first, in its own container: the lab image has no vLLM to parse with.
        assert outputs["serve_args"]["verdict"] == "fail", outputs["serve_args"]
        assert outputs["serve_args"]["failed_stage"] == "environment", outputs["serve_args"]
        assert sorted(name.rsplit("-", 1)[0] for name in check_containers_created(node_a, since)) == [
            "qwen35-model-args",
            "qwen35-model-support",
        ]

        # Nothing changed: the next `up` does nothing and `refresh` returns the recorded proof.
        after = time.time()
        assert engine.up(state, registered).op == "same"
        assert engine.refresh(state).public_outputs() == outputs
        assert check_containers_created(node_a, after) == []

        # Another image on the head: the proof runs again (a replacement), once.
        before_new = time.time()
        replaced = engine.up(state, {**registered, "image_id": standin_image}, timeout=300)
        assert replaced.op == "replace" and replaced.diff.delete_before_replace
        assert len(check_containers_created(node_a, before_new)) == 2  # the argument proof and the proof
        engine.delete(replaced.state)
    assert leftover_containers(node_a) == []


# ---- against the real vLLM: vLLM's CPU build in the lab image (lab/vllm_cpu_image.py) --------------------


@pytest.fixture(scope="module")
def real_vllm_image(node_a) -> str:
    """The image ID of the real-vLLM lab image on node-a (loaded from the cache, or built once)."""
    from lab.vllm_cpu_image import vllm_cpu_image

    return vllm_cpu_image(node_a)[1]


@pytest.fixture(scope="module")
def tiny_snapshot(tmp_path_factory) -> Path:
    """The tiny real Qwen3.5-MoE checkpoint (lab/tiny_qwen35.py), as a plain folder of its files."""
    from lab import tiny_qwen35

    return tiny_qwen35.write(tmp_path_factory.mktemp("tiny-qwen35") / "snapshot")


def real_props(node: lab.LabNode, image_id: str, snapshot: Path) -> dict:
    # vLLM's CPU build on one core builds and loads both tiny architectures in about a minute.
    return {**check_props(node, image_id, snapshot), "image": "lab-vllm-cpu", "deadline_s": 600}


def test_the_real_vllm_check_refuses_a_checkpoint_with_a_missing_shard(
    node_a, real_vllm_image, tiny_snapshot, tmp_path
):
    cut = tmp_path / "cut"
    shutil.copytree(tiny_snapshot, cut)
    (cut / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(ModelSupportError) as info:
        ModelSupportCheckProvider().create(real_props(node_a, real_vllm_image, cut))
    message = str(info.value)
    assert "failed at stage 'load'" in message, message
    assert "MissingShard" in message and "model-00002-of-00002.safetensors" in message, message
    assert leftover_containers(node_a) == []


@pytest.mark.parametrize("load_format", ["fastsafetensors", "instanttensor"])
def test_the_real_vllm_check_refuses_a_load_format_whose_package_the_image_lacks(
    node_a, real_vllm_image, tiny_snapshot, load_format
):
    """vLLM 0.32.0 takes both formats at every stage of its own and imports their package only once
    it loads the weights; the lab image has neither package, so `up` stops before any server starts."""
    from components.config import ServeConfig
    from components.vllm_server import serve_argv

    argv = serve_argv(ServeConfig(model="/models/qwen35", speculative=None, load_format=load_format))
    started = time.time()
    with pytest.raises(ModelSupportError) as info:
        ModelSupportCheckProvider().create(
            {**real_props(node_a, real_vllm_image, tiny_snapshot), "serve_argv": argv}
        )
    message = str(info.value)
    assert "'loader'" in message and "(--load-format)" in message, message
    assert f"`{load_format}`, which this image does not have" in message, message
    assert "serve.load_format: auto" in message, message
    print(f"the loader refusal took {time.time() - started:.1f} s")
    assert leftover_containers(node_a) == []


def test_the_real_vllm_check_refuses_a_headless_rank_s_layout_naming_the_rank(
    node_a, real_vllm_image, tiny_snapshot
):
    """Under executor mp each rank's own command line is proved: the head's passes, and vLLM 0.32.0's
    create_engine_config refuses a headless rank whose node rank is not below `--nnodes`."""
    from components.config import parse_stack_config
    from components.mp_executor import mp_serve_argv
    from tests.support.program import mp_raw

    raw = mp_raw(2)
    # The tiny checkpoint, mounted at the check's checkpoint path, with the lab engine's serving flags.
    raw["serve"] = {**raw["serve"], "model": "/qwen35/checkpoint", "speculative": None,
                    "kv_cache_dtype": "auto", "max_model_len": 512, "language_model_only": True}  # fmt: skip
    raw["bench"] = {"mode": "off"}
    raw["answers"] = {"mode": "off"}  # its long prompt would not fit the tiny 512-token context
    cfg = parse_stack_config(raw)
    head, rank = (mp_serve_argv(cfg, node) for node in cfg.nodes)
    rank[rank.index("--node-rank") + 1] = "2"
    props = {**real_props(node_a, real_vllm_image, tiny_snapshot), "serve_argv": head}
    with pytest.raises(ModelSupportError) as info:
        ModelSupportCheckProvider().create({**props, "rank_argvs": {"spark-2": rank}})
    message = str(info.value)
    assert "refuses spark-2's headless rank's command line at 'parallel'" in message, message
    # vLLM 0.32.0's own words (0.17.1 says `node_rank=2 must be less than nnodes=2`).
    assert "`--node-rank` must be between 0 and 1; got `--node-rank 2`" in message, message
    assert leftover_containers(node_a) == []
