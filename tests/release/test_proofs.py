"""The model proofs against real releases: patches/prove_model.py run the way the build and the head run
it (a subprocess with the release's python, offline; its JSON report parsed), on real vLLM from PyPI
with its torch. The seed's pair fails where it really fails; vLLM 0.17.1 passes; a checkpoint is
proven by its own config and tensor names; unknown architectures and quantizations are named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.release.checkpoint import index_names, real_config, write_checkpoint, write_hf_cache
from tests.release.releases import Proof, run_proof

pytestmark = pytest.mark.release

FIXTURES = ("qwen3_5-fp8", "qwen3_5_moe-fp8")
MTP = {"qwen3_5-fp8": "Qwen3_5MTP", "qwen3_5_moe-fp8": "Qwen3_5MoeMTP"}


def every_check(target: str, mtp: str) -> set[tuple[str, str]]:
    """config of the checkpoint; construct and load of the served architecture and of its MTP head."""
    built = {(stage, name) for stage in ("construct", "load") for name in (target, f"{target}:{mtp}")}
    return {("config", target)} | built


def passed(report: dict) -> set[tuple[str, str]]:
    return {(c["stage"], c["target"]) for c in report["checks"] if c["ok"]}


def test_vllm_0_17_1_as_a_prebuilt_image_passes_config_construct_and_load(prebuilt, tmp_path):
    home, tmp = tmp_path / "home", tmp_path / "tmp"
    home.mkdir(), tmp.mkdir()
    proof = run_proof(prebuilt, home=home, tmp=tmp)
    report = proof.report
    # It touches nothing but its own temporary folder, and removes that.
    assert not list(home.iterdir()) and not list(tmp.iterdir()), (list(home.rglob("*")), list(tmp.iterdir()))
    assert proof.returncode == 0 and report["verdict"] == "pass", proof.why()
    assert report["failed_stage"] is None and report["error"] is None
    assert report["vllm"] == "0.17.1" and report["transformers"].startswith("4.57."), report
    assert report["torch"] and report["quantization"] == "fp8"
    expected = set().union(*(every_check(fixture, MTP[fixture]) for fixture in FIXTURES))
    assert passed(report) == expected, proof.why()
    loads = {c["target"]: c["detail"] for c in report["checks"] if c["stage"] == "load"}
    assert all("FP8 weight_scale_inv" in detail for detail in loads.values()), loads


def test_the_seeds_hybrid_stops_at_construction_naming_mark_tower_model(seed_base, seed_hybrid):
    proof = run_proof(seed_base, overlays=(seed_hybrid,))
    report = proof.report
    assert proof.returncode == 1 and report["verdict"] == "fail", proof.why()
    assert report["vllm"] == "0.14.0" and report["transformers"] == "4.57.6", report
    assert report["failed_stage"] == "construct", proof.why()
    assert report["error"].startswith("AttributeError:") and "_mark_tower_model" in report["error"], (
        proof.why()
    )
    assert report["where"].startswith("vllm/model_executor/models/qwen3_5.py:"), report["where"]
    # Names resolving is not compatibility: the config loaded through the donor's classes first.
    assert ("config", "qwen3_5-fp8") in passed(report)


def test_the_seeds_hybrid_with_transformers_5_2_stops_at_the_config_naming_the_type_error(
    seed_base, seed_hybrid, transformers5
):
    proof = run_proof(seed_base, overlays=(seed_hybrid, transformers5))
    report = proof.report
    assert proof.returncode == 1, proof.why()
    assert report["vllm"] == "0.14.0" and report["transformers"] == "5.2.0", report
    assert report["failed_stage"] == "config", proof.why()
    assert report["error"] == "TypeError: unsupported operand type(s) for |: 'list' and 'set'", proof.why()
    # Raised in transformers, called by the donor's config class.
    assert report["where"].startswith("transformers/"), report["where"]
    assert "(from vllm/transformers_utils/configs/qwen3_5.py:" in report["where"], report["where"]
    assert not passed(report)


def test_plain_vllm_0_14_stops_at_the_config_naming_the_unregistered_architecture(seed_base):
    proof = run_proof(seed_base)
    report = proof.report
    assert proof.returncode == 1 and report["failed_stage"] == "config", proof.why()
    assert "'Qwen3_5ForConditionalGeneration' is not registered" in report["error"], proof.why()


# The proof against the checkpoint the cluster will load: its own config and tensor names.


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The snapshot as the head's Hugging Face cache holds it: relative links into read-only blobs."""
    root = tmp_path_factory.mktemp("hf-cache")
    snapshot = write_hf_cache(root)
    yield snapshot
    for folder in (snapshot, snapshot.parent.parent / "blobs"):
        folder.chmod(0o755)  # so pytest can remove its temporary folders


def test_vllm_0_17_1_passes_against_the_checkpoints_own_config_and_tensor_names(prebuilt, checkpoint):
    proof = run_proof(prebuilt, "--checkpoint", str(checkpoint))
    report = proof.report
    assert proof.returncode == 0 and report["verdict"] == "pass", proof.why()
    assert report["architecture"] == "Qwen3_5MoeForConditionalGeneration"
    assert (report["model_type"], report["quantization"]) == ("qwen3_5_moe", "fp8")
    assert passed(report) == every_check(checkpoint.name, "Qwen3_5MoeMTP"), proof.why()
    config = next(c["detail"] for c in report["checks"] if c["stage"] == "config")
    assert "48 layers" in config and "[128, 128]" in config, config


def test_the_seeds_hybrid_fails_against_the_checkpoint_naming_the_construction_error(
    seed_base, seed_hybrid, checkpoint
):
    proof = run_proof(seed_base, "--checkpoint", str(checkpoint), overlays=(seed_hybrid,))
    report = proof.report
    assert proof.returncode == 1 and report["failed_stage"] == "construct", proof.why()
    assert (
        "_mark_tower_model" in report["error"]
        and report["architecture"] == "Qwen3_5MoeForConditionalGeneration"
    )


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (lambda c: c.update(architectures=["Qwen3_5MoeForCausalLMv2"]), "'Qwen3_5MoeForCausalLMv2'"),
        (lambda c: c["quantization_config"].update(quant_method="fp6_e3m2"), "'fp6_e3m2'"),
    ],
    ids=["unknown-architecture", "unknown-quantization"],
)
def test_a_checkpoint_naming_something_unknown_fails_at_the_config_naming_it(
    prebuilt, tmp_path, change, named
):
    config = real_config()
    change(config)
    proof = run_proof(prebuilt, "--checkpoint", str(write_checkpoint(tmp_path / "snapshot", config)))
    report = proof.report
    assert proof.returncode == 1 and report["failed_stage"] == "config", proof.why()
    assert named in report["error"], proof.why()
    assert report["checks"] == [
        {"stage": "config", "target": "snapshot", "ok": False, "detail": report["error"]}
    ]


def prove_without(prebuilt: Path, tmp_path: Path, dropped: str) -> Proof:
    """The proof against the 122B checkpoint's config and index with one tensor left out of the index."""
    config = real_config()
    names = [n for n in index_names(config) if n != dropped]
    return run_proof(prebuilt, "--checkpoint", str(write_checkpoint(tmp_path / "snapshot", config, names)))


def test_a_checkpoint_missing_a_scale_fails_the_load_naming_the_parameter_left_empty(prebuilt, tmp_path):
    # The load proof must be able to fail: drop one FP8 scale of the tiny model's full-attention layer.
    dropped = "model.language_model.layers.3.self_attn.o_proj.weight_scale_inv"
    proof = prove_without(prebuilt, tmp_path, dropped)
    report = proof.report
    assert proof.returncode == 1 and report["failed_stage"] == "load", proof.why()
    assert "language_model.model.layers.3.self_attn.o_proj.weight_scale_inv" in report["error"], proof.why()
    assert "not filled" in report["error"]


def test_a_checkpoint_without_an_mtp_head_passes_and_says_the_head_was_not_proven(prebuilt, tmp_path):
    config = real_config()
    names = [n for n in index_names(config) if not n.startswith("mtp.")]
    proof = run_proof(prebuilt, "--checkpoint", str(write_checkpoint(tmp_path / "snapshot", config, names)))
    assert proof.returncode == 0, proof.why()
    mtp = [c for c in proof.report["checks"] if c["target"] == "snapshot:Qwen3_5MoeMTP"]
    assert mtp == [
        {
            "stage": "construct",
            "target": "snapshot:Qwen3_5MoeMTP",
            "ok": True,
            "detail": "no mtp.* tensors in the checkpoint: MTP head not proven",
        }
    ], proof.why()


def test_a_usage_error_exits_2_with_a_report(prebuilt, tmp_path):
    proof = run_proof(prebuilt, "--checkpoint", str(tmp_path))
    assert proof.returncode == 2, proof.why()
    assert proof.report["verdict"] == "fail" and "config.json is missing" in proof.report["error"]
    assert json.loads(json.dumps(proof.report)) == proof.report


# The load proof must refuse a checkpoint lacking any one shard of a fused parameter (vLLM
# skips its unloaded-weights check for FP8 checkpoints: such memory would be served uninitialized).


@pytest.mark.parametrize(
    ("dropped", "fused"),
    [
        (
            "model.language_model.layers.3.self_attn.k_proj.weight_scale_inv",
            "language_model.model.layers.3.self_attn.qkv_proj.weight_scale_inv",
        ),
        (
            "model.language_model.layers.0.linear_attn.in_proj_z.weight",
            "language_model.model.layers.0.linear_attn.in_proj_qkvz.weight",
        ),
        (
            "model.language_model.layers.1.mlp.experts.2.up_proj.weight",
            "language_model.model.layers.1.mlp.experts.w13_weight",
        ),
        (
            "model.language_model.layers.2.mlp.shared_expert.gate_proj.weight",
            "language_model.model.layers.2.mlp.shared_expert.gate_up_proj.weight",
        ),
    ],
    ids=["k_proj-scale", "in_proj_z", "expert-up_proj", "shared-expert-gate_proj"],
)
def test_a_checkpoint_missing_one_shard_of_a_fused_parameter_fails_the_load_naming_it(
    prebuilt, tmp_path, dropped, fused
):
    proof = prove_without(prebuilt, tmp_path, dropped)
    report = proof.report
    assert proof.returncode == 1 and report["failed_stage"] == "load", proof.why()
    assert report["error"].startswith("IncompleteLoad:"), proof.why()
    assert f"missing from the checkpoint index: {dropped}" in report["error"], proof.why()
    # The fused parameter's own memory is checked too: the rows that shard fills stay unwritten.
    assert f"{fused} (" in report["error"] and "never written" in report["error"], proof.why()


def test_a_checkpoint_missing_a_tensor_beyond_the_tiny_model_fails_naming_it(prebuilt, tmp_path):
    # The known limit of the load: experts and layers beyond the tiny model's are proven by name only.
    dropped = "model.language_model.layers.40.mlp.experts.200.up_proj.weight"
    proof = prove_without(prebuilt, tmp_path, dropped)
    report = proof.report
    assert proof.returncode == 1 and report["failed_stage"] == "load", proof.why()
    assert report["error"].startswith("IncompleteCheckpoint:"), proof.why()
    assert f"missing from the checkpoint index: {dropped};" in report["error"], proof.why()
    # Both tiny models loaded in full before that.
    loaded = [c for c in report["checks"] if c["stage"] == "load" and c["ok"]]
    assert [c["target"] for c in loaded] == ["snapshot", "snapshot:Qwen3_5MoeMTP"], proof.why()
    assert all("loaded for the tiny model's" in c["detail"] for c in loaded), proof.why()


def test_a_checkpoint_with_64_wide_linear_attention_key_heads_passes(prebuilt, tmp_path):
    # 16 key heads of 64 are 1024 rows, whole 128-row FP8 blocks: vLLM loads the full checkpoint. The
    # tiny model must keep its q/k sub-shards block-aligned too (one 64-wide head is half a block).
    config = real_config()
    config["text_config"]["linear_key_head_dim"] = 64
    proof = run_proof(prebuilt, "--checkpoint", str(write_checkpoint(tmp_path / "snapshot", config)))
    assert proof.returncode == 0 and proof.report["verdict"] == "pass", proof.why()
    assert passed(proof.report) == every_check("snapshot", "Qwen3_5MoeMTP"), proof.why()
