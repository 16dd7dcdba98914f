"""Serve arguments on a real release: patches/prove_args.py parses the server's exact command line with
vLLM 0.17.1's own parser (`vllm serve`'s subparser, its validate, `AsyncEngineArgs.from_cli_args`) and
builds its SpeculativeConfig for a 122B-A10B-FP8 checkpoint's config and index, run as the model-support
check runs it (a subprocess with the release's python, offline; its JSON report parsed)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from components.config import ServeConfig, parse_stack_config
from components.mp_executor import mp_serve_argv
from components.vllm_server import serve_argv
from tests.release.checkpoint import index_names, real_config, write_hf_cache
from tests.release.releases import PATCHES, PROOF_TIMEOUT_S, Proof, ReleaseError
from tests.support.program import mp_raw

pytestmark = pytest.mark.release

PROVE_ARGS = PATCHES / "prove_args.py"


def run_args_proof(
    python: Path,
    argv: list[str],
    checkpoint: Path | None = None,
    program: Path = PROVE_ARGS,
    ranks: dict[str, list[str]] | None = None,
) -> Proof:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    options = ["--checkpoint", str(checkpoint)] if checkpoint else []
    for node, rank in (ranks or {}).items():  # each headless rank's argv, proved in the same process
        options += ["--rank", node, json.dumps(rank)]
    started = time.monotonic()
    done = subprocess.run(
        [str(python), str(program), *options, "--", *argv],
        capture_output=True,
        text=True,
        timeout=PROOF_TIMEOUT_S,
        env=env,
        cwd="/",
    )
    try:
        report = json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError) as exc:
        raise ReleaseError(
            f"{program.name} printed no report (exit {done.returncode}):\n{done.stderr[-3000:]}"
        ) from exc
    return Proof(done.returncode, report, done.stderr, time.monotonic() - started)


def recipe_argv(revision: str = "a" * 40, **changes) -> list[str]:
    """The dev stack's server command line (the recipe's defaults), as its container runs it."""
    serve = ServeConfig(max_model_len=32768, served_model_name="qwen3.5-122b", **changes)
    return [*serve_argv(serve), "--revision", revision]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """The checkpoint as the head's HF cache holds it (the check mounts its repo folder)."""
    return write_hf_cache(tmp_path_factory.mktemp("ckpt"))


def test_the_recipe_s_command_line_passes_with_its_mtp_heads(prebuilt, checkpoint):
    proof = run_args_proof(prebuilt, recipe_argv(checkpoint.name), checkpoint)
    assert proof.returncode == 0 and proof.report["verdict"] == "pass", proof.why()
    assert proof.report["vllm"] == "0.17.1"
    assert proof.report["speculative"]["method"] == "mtp", proof.why()
    assert proof.report["speculative"]["num_speculative_tokens"] == 1


def test_a_misspelled_flag_is_refused_naming_it(prebuilt):
    argv = recipe_argv()
    argv[argv.index("--kv-cache-dtype")] = "--kv-cahce-dtype"
    proof = run_args_proof(prebuilt, argv)
    assert proof.returncode == 1 and proof.report["failed_stage"] == "parse", proof.why()
    assert proof.report["flag"] == "--kv-cahce-dtype", proof.why()
    assert "unrecognized arguments: --kv-cahce-dtype" in proof.report["error"], proof.why()


def test_bad_json_for_the_speculative_config_is_refused_quoting_vllm(prebuilt):
    argv = recipe_argv()
    argv[argv.index("--speculative-config") + 1] = '{"method": "mtp", num_speculative_tokens: 1}'
    proof = run_args_proof(prebuilt, argv)
    assert proof.returncode == 1 and proof.report["failed_stage"] == "parse", proof.why()
    assert proof.report["flag"] == "--speculative-config", proof.why()


def test_a_value_of_the_wrong_type_is_refused(prebuilt):
    proof = run_args_proof(prebuilt, [*recipe_argv(), "--max-num-seqs", "four"])
    assert proof.report["failed_stage"] == "parse" and proof.report["flag"] == "--max-num-seqs", proof.why()
    assert "invalid int value: 'four'" in proof.report["error"], proof.why()


def test_an_unknown_speculative_method_is_refused(prebuilt, checkpoint):
    argv = recipe_argv(checkpoint.name, speculative={"method": "mtpp", "num_speculative_tokens": 1})
    proof = run_args_proof(prebuilt, argv, checkpoint)
    assert proof.returncode == 1 and proof.report["failed_stage"] == "speculative", proof.why()
    assert proof.report["flag"] == "--speculative-config" and "mtpp" in proof.report["error"], proof.why()


def test_mtp_without_mtp_weights_in_the_index_is_refused(prebuilt, tmp_path):
    config = real_config()
    names = [name for name in index_names(config) if not name.startswith("mtp.")]
    bare = write_hf_cache(tmp_path, config, names)
    proof = run_args_proof(prebuilt, recipe_argv(bare.name), bare)
    assert proof.returncode == 1 and proof.report["failed_stage"] == "speculative", proof.why()
    assert "no mtp.* tensors" in proof.report["error"], proof.why()


def test_a_model_path_that_is_not_mounted_still_parses(prebuilt):
    # serve.model a path on the nodes and no checkpoint declared: nothing is mounted in the check.
    argv = serve_argv(ServeConfig(model="/models/qwen35", speculative=None, max_model_len=8192))
    proof = run_args_proof(prebuilt, argv)
    assert proof.returncode == 0 and proof.report["verdict"] == "pass", proof.why()
    assert proof.report["speculative"] is None


# ---- serve.load_format: the package its loader imports only once it loads ----------------


def test_a_load_format_whose_package_the_image_lacks_is_refused_at_the_loader_stage(prebuilt):
    """vLLM 0.17.1 takes `--load-format fastsafetensors` at every stage of its own (the package is a
    placeholder until the weights load); the proof refuses it at `loader`, naming the package."""
    argv = serve_argv(ServeConfig(model="/models/qwen35", speculative=None, load_format="fastsafetensors"))
    proof = run_args_proof(prebuilt, argv)
    assert proof.returncode == 1 and proof.report["failed_stage"] == "loader", proof.why()
    assert proof.report["flag"] == "--load-format", proof.why()
    assert "`fastsafetensors`, which this image does not have" in proof.report["error"], proof.why()


def test_a_load_format_whose_package_the_image_has_passes_naming_it(prebuilt):
    argv = serve_argv(ServeConfig(model="/models/qwen35", speculative=None, load_format="gguf"))
    proof = run_args_proof(prebuilt, argv)
    assert proof.returncode == 0 and proof.report["loader"] == "gguf", proof.why()


def vllm_folder(python: Path) -> Path:
    """Where this python's vLLM is installed (found without importing it)."""
    where = "import importlib.util; print(importlib.util.find_spec('vllm').submodule_search_locations[0])"
    return Path(
        subprocess.run([str(python), "-c", where], capture_output=True, text=True, check=True).stdout.strip()
    )


@pytest.mark.parametrize("release", ["prebuilt", "seed_base"])
def test_the_loader_table_is_what_vllm_imports(release, request):
    """Each release's model loaders: every package they import lazily (a `PlaceholderModule`) is in
    patches/prove_args.py's table, and every module of the table that this vLLM has a loader for is
    imported there."""
    import re
    import sys

    sys.path.insert(0, str(PATCHES))
    try:
        from prove_args import LOADER_PACKAGES
    finally:
        sys.path.remove(str(PATCHES))
    loaders = vllm_folder(request.getfixturevalue(release)) / "model_executor" / "model_loader"
    source = "\n".join(path.read_text() for path in sorted(loaders.glob("*.py")))
    lazy = set(re.findall(r'PlaceholderModule\("([a-z_]+)"\)', source))
    modules = {module for module, _ in LOADER_PACKAGES.values()}
    assert lazy and lazy <= modules, (lazy, modules)
    imported = set(re.findall(r"^\s*(?:from|import) ([a-z_]+)", source, re.M))
    assert {"fastsafetensors", "runai_model_streamer", "tensorizer", "gguf"} <= imported & modules, imported


# ---- executor mp: every rank's command line, through vLLM 0.17.1's own checks ------------


def mp_argv(nodes: int, rank: int, revision: str) -> list[str]:
    """Rank `rank`'s command line of a `nodes`-node dev stack under cluster.executor mp, as it runs."""
    cfg = parse_stack_config(mp_raw(nodes))
    return [*mp_serve_argv(cfg, cfg.nodes[rank]), "--revision", revision]


def with_flag(argv: list[str], flag: str, value: str) -> list[str]:
    changed = list(argv)
    changed[changed.index(flag) + 1] = value
    return changed


@pytest.fixture(scope="module")
def mp_proof(prebuilt, checkpoint) -> Proof:
    """One run of the argument proof over a two-node mp stack's command lines, as the check runs it:
    the head's after `--`, node-b's headless one as `--rank`."""
    return run_args_proof(
        prebuilt, mp_argv(2, 0, checkpoint.name), checkpoint, ranks={"node-b": mp_argv(2, 1, checkpoint.name)}
    )


def test_each_mp_rank_s_command_line_passes_the_args_proof_in_one_run(mp_proof):
    assert mp_proof.returncode == 0 and mp_proof.report["verdict"] == "pass", mp_proof.why()
    rank = mp_proof.report["ranks"]["node-b"]
    assert rank["verdict"] == "pass", mp_proof.why()
    for report in (mp_proof.report, rank):
        assert report["speculative"]["method"] == "mtp", mp_proof.why()


@pytest.mark.parametrize("rank", [0, 1], ids=["head", "headless"])
def test_each_mp_rank_gets_vllm_s_parallel_config(mp_proof, rank):
    """The `parallel` stage: vLLM's create_engine_config builds each rank's own ParallelConfig, the
    head's and the headless rank's one after the other in one process."""
    report = mp_proof.report if rank == 0 else mp_proof.report["ranks"]["node-b"]
    assert report["parallel"] == {
        "world_size": 2,
        "nnodes": 2,
        "node_rank": rank,
        "master_addr": "192.168.200.12",
        "master_port": 29501,
        "backend": "mp",
        "headless": rank == 1,
    }, mp_proof.why()


def test_a_headless_rank_vllm_refuses_beside_a_good_head_fails_the_run_and_names_it(prebuilt, checkpoint):
    head = mp_argv(2, 0, checkpoint.name)
    wrong = with_flag(mp_argv(2, 1, checkpoint.name), "--node-rank", "2")
    proof = run_args_proof(prebuilt, head, checkpoint, ranks={"node-b": wrong})
    assert proof.returncode == 1 and proof.report["verdict"] == "pass", proof.why()
    rank = proof.report["ranks"]["node-b"]
    assert (rank["verdict"], rank["failed_stage"]) == ("fail", "parallel"), proof.why()
    assert "node_rank=2 must be less than nnodes=2." in rank["error"], proof.why()


@pytest.mark.parametrize(
    ("case", "flag", "value", "expected"),
    [
        ("node rank at nnodes", "--node-rank", "2", "node_rank=2 must be less than nnodes=2."),
        ("nnodes not dividing the world", "--nnodes", "3", "world_size=2 must be divisible by nnodes=3."),
        ("ray backend over nodes", "--distributed-executor-backend", "ray", "nnodes > 1 can only be set"),
    ],
)
def test_a_wrong_multi_node_layout_is_refused_by_vllm(prebuilt, checkpoint, case, flag, value, expected):
    argv = with_flag(mp_argv(2, 1, checkpoint.name), flag, value)
    proof = run_args_proof(prebuilt, argv, checkpoint)
    assert proof.returncode == 1 and proof.report["failed_stage"] == "parallel", f"{case}: {proof.why()}"
    assert expected in proof.report["error"], f"{case}: {proof.why()}"


def test_a_rank_whose_model_is_not_mounted_is_not_proved_over_nodes(prebuilt):
    """serve.model a path on the nodes and no checkpoint: vLLM's engine config needs the model's
    config, so the layout is said unproved, not refused."""
    raw = mp_raw(2)
    raw["serve"] = {**raw["serve"], "model": "/models/qwen35"}
    cfg = parse_stack_config(raw)
    proof = run_args_proof(prebuilt, mp_serve_argv(cfg, cfg.nodes[1]))
    assert proof.returncode == 0 and proof.report["verdict"] == "pass", proof.why()
    assert proof.report["parallel"] == "not proved: the model's files are not mounted here", proof.why()


def test_one_node_builds_no_parallel_layout(prebuilt, checkpoint):
    proof = run_args_proof(prebuilt, recipe_argv(checkpoint.name), checkpoint)
    assert proof.returncode == 0 and proof.report["parallel"] is None, proof.why()
