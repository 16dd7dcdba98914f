"""The hybrid build in the lab: a real `docker build` of patches/Dockerfile on a lab node, over SSH, with the
build args the program itself passes (`build_args` of the lab stack's image config), against stand-in
base and donor images that carry the real vLLM 0.14.0 and 0.17.1 Python trees. A passing pair builds
and the image holds what the Dockerfile promises; a failing proof, and a base without the tree, stop
the build with a reason a person can act on."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

import pytest

import lab
from components.checkpoint import CheckpointError, CheckpointProvider
from components.config import ImageConfig, parse_stack_config
from components.image_build.component import PATCH_DIR, build_args, content_tag
from components.image_ref import parse_image_ref
from lab.buildx import buildx_argv, ensure_buildx
from lab.images import image_id
from lab.layout import data_dir
from lab.standin_hub import StandinHub, generate_repo
from lab.vllm_images import base_standin, donor_standin, folder_context, transformers_wheels
from tests.support.program import stack_config
from tests.support.vllm_trees import BASE_VERSION, DONOR_VERSION, vllm_tree

pytestmark = pytest.mark.lab

BUILD_TIMEOUT_S = 900
CLOSURE_NAME = "MambaStateCopyFuncCalculator"


class Builder(str, Enum):
    """Which builder runs the Dockerfile on the node's daemon."""

    LEGACY = "legacy"  # `docker build` with this CLI (no buildx plugin): the classic builder
    BUILDKIT = "buildkit"  # the daemon's BuildKit, as pulumi_docker.Image uses by default


@dataclass(frozen=True)
class Build:
    """One `docker build` of the hybrid: what it was asked, what it said, how long it took."""

    ref: str
    args: dict[str, str]
    result: lab.Result
    seconds: float

    @property
    def output(self) -> str:
        return f"{self.result.out}\n{self.result.err}"

    def tail(self, lines: int = 25) -> str:
        return "\n".join(self.output.strip().splitlines()[-lines:])


def lab_image_config() -> ImageConfig:
    """The image section of Pulumi.lab.yaml, validated the way the program validates it."""
    raw = {key.split(":", 1)[1]: value for key, value in stack_config("lab").items()}
    return parse_stack_config(raw).image


def make_context(dest: Path, wheels: Path) -> Path:
    """A copy of patches/ (what BuiltImage sends) with the transformers wheels in wheels/."""
    context = dest / "context"
    shutil.copytree(PATCH_DIR, context, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "wheels"))
    shutil.copytree(wheels, context / "wheels", ignore=shutil.ignore_patterns(".complete"))
    return context


def build_hybrid(
    node: lab.LabNode,
    cfg: ImageConfig,
    context: Path,
    args: dict[str, str],
    builder: Builder = Builder.LEGACY,
) -> Build:
    """A build of the hybrid on the node as BuiltImage asks for it: its tag, network, platform, args."""
    tag = content_tag(context, args, cfg.platform)
    ref = f"{cfg.name}:{tag if builder is Builder.LEGACY else f'{builder.value}-{tag}'}"
    argv = ["build", "--file", "Dockerfile", "--tag", ref, "--platform", cfg.platform]
    if cfg.build_network:
        argv += ["--network", cfg.build_network]
    for key, value in args.items():
        argv += ["--build-arg", f"{key}={value}"]
    if builder is Builder.BUILDKIT:
        try:
            command = [*buildx_argv(ensure_buildx()), *argv, "--progress", "plain"]
        except lab.LabError as exc:
            pytest.fail(f"BuildKit's client (docker-buildx) is not available: {exc}", pytrace=False)
    else:
        # The legacy builder keeps a failed step's container: the refused builds leave none behind.
        command = ["docker", *argv, "--force-rm"]
    started = time.monotonic()
    tar = folder_context(context)
    result = lab.on_node(node, [*command, "-"], input=tar, timeout=BUILD_TIMEOUT_S, check=False)
    return Build(ref, args, result, time.monotonic() - started)


def run_in(node: lab.LabNode, ref: str, *argv: str, input: bytes | None = None) -> lab.Result:
    """Run argv in a throwaway container of the image (no network: the daemons have no bridge)."""
    interactive = ["--interactive"] if input is not None else []
    return lab.docker(
        node, "run", "--rm", "--network", "none", *interactive, ref, *argv, input=input, check=False
    )


def sha256_in_image(node: lab.LabNode, ref: str, root: str, files: list[str]) -> dict[str, str]:
    script = (
        b"import hashlib, sys\n"
        b"for rel in sys.argv[2:]:\n"
        b"    with open(sys.argv[1] + '/' + rel, 'rb') as f:\n"
        b"        print(rel, hashlib.sha256(f.read()).hexdigest())\n"
    )
    found = run_in(node, ref, "python3", "-", root, *files, input=script)
    assert found.returncode == 0, f"hashing {files} in {ref} failed:\n{found.err}"
    return dict(line.split(" ", 1) for line in found.out.splitlines())


@pytest.fixture(scope="module")
def cfg() -> ImageConfig:
    return lab_image_config()


def lab_context(cfg: ImageConfig, dest: Path) -> Path:
    """The lab's build context in `dest`: patches/ and the transformers wheels (fails the test without)."""
    try:
        wheels = transformers_wheels(f"transformers{cfg.transformers}")
    except lab.LabError as exc:
        pytest.fail(f"transformers wheels for the hybrid build are not available: {exc}", pytrace=False)
    return make_context(dest, wheels)


@pytest.fixture(scope="module")
def context(cfg: ImageConfig, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return lab_context(cfg, tmp_path_factory.mktemp("hybrid"))


def standins(node: lab.LabNode, cfg: ImageConfig) -> float:
    """Build (or find) the base and donor stand-ins named in the lab stack on the node; seconds taken."""
    started = time.monotonic()
    try:
        base_standin(node, cfg.base_ref, cfg.base_vllm_dir, vllm_tree(BASE_VERSION))
        donor_standin(node, cfg.donor_ref, cfg.donor_vllm_dir, vllm_tree(DONOR_VERSION))
    except lab.LabError as exc:
        pytest.fail(f"the stand-in images could not be made on {node.name}: {exc}", pytrace=False)
    return time.monotonic() - started


@pytest.fixture(scope="module")
def hybrid(node_a: lab.LabNode, cfg: ImageConfig, context: Path) -> Build:
    standin_s = standins(node_a, cfg)
    build = build_hybrid(node_a, cfg, context, build_args(cfg))
    print(f"\n{node_a.name}: stand-ins {standin_s:.1f}s, hybrid build {build.seconds:.1f}s ({build.ref})")
    assert build.result.returncode == 0, (
        f"the hybrid build failed on {node_a.name} (exit {build.result.returncode}):\n{build.tail()}"
    )
    return build


def test_the_program_build_args_build_the_hybrid(node_a, cfg, hybrid):
    assert hybrid.args["SMOKE"] == "0" and hybrid.args["BASE_IMAGE"] == cfg.base_ref
    assert image_id(node_a, hybrid.ref), f"{hybrid.ref} is missing on {node_a.name} after a successful build"
    # The stand-ins hold no torch: the lab stack turns the behaviour proofs off, and the build says so.
    assert hybrid.args["PROOFS"] == ""
    assert "PROOFS is empty: behaviour proofs skipped" in hybrid.output, hybrid.tail()


def test_the_behaviour_proofs_run_in_the_build_and_stop_it_naming_the_missing_torch(
    node_a, cfg, context, hybrid
):
    # PROOFS as the Sparks' builds set it: the proof stage runs prove_model.py in the image and the build
    # stops at its first failure, here the environment (a vLLM tree and transformers, but no torch).
    args = {**build_args(cfg), "PROOFS": "config,construct,load"}
    build = build_hybrid(node_a, cfg, context, args)
    print(f"\n{node_a.name}: proofs-enabled build {build.seconds:.1f}s")
    assert build.result.returncode != 0, f"the build passed its proofs without torch:\n{build.tail()}"
    verdict = next(
        (json.loads(line[line.index("{") :]) for line in build.output.splitlines() if '"verdict"' in line),
        None,
    )
    assert verdict is not None, f"no proof verdict in the build output:\n{build.tail()}"
    assert (verdict["verdict"], verdict["failed_stage"]) == ("fail", "environment"), verdict
    assert verdict["error"].startswith("ModuleNotFoundError: No module named 'torch'"), verdict
    assert verdict["transformers"] == cfg.transformers.removeprefix("=="), verdict
    assert "behaviour proof failed (exit 2)" in build.output, build.tail()
    assert image_id(node_a, build.ref) is None


def test_the_proof_says_ok_and_the_staged_files_are_the_donors(node_a, cfg, hybrid):
    # The proof could only find the donor files if `COPY --from=donor ${DONOR_VLLM_DIR}` expanded its ARG.
    proof = run_in(node_a, hybrid.ref, "cat", "/opt/qwen35/compat-proof.txt")
    assert proof.returncode == 0, proof.err
    assert "OK: every vllm module and name the copied files import resolves" in proof.out, proof.out
    copied_line = next(line for line in proof.out.splitlines() if line.startswith("copied from donor:"))
    copied = [name.strip() for name in copied_line.split(":", 1)[1].split(",")]
    assert "model_executor/layers/mamba/mamba_utils.py" in copied and len(copied) == 5, copied
    donor = vllm_tree(DONOR_VERSION)
    expected = {rel: hashlib.sha256((donor / rel).read_bytes()).hexdigest() for rel in copied}
    assert sha256_in_image(node_a, hybrid.ref, cfg.base_vllm_dir, copied) == expected


def test_the_registries_are_patched_in_the_image(node_a, cfg, hybrid):
    patcher = "/opt/qwen35/patch_vllm_qwen35.py"
    check = run_in(node_a, hybrid.ref, "python3", patcher, "--vllm-dir", cfg.base_vllm_dir, "--check")
    assert check.returncode == 0, f"patcher --check in {hybrid.ref}: exit {check.returncode}\n{check.err}"


def test_transformers_is_installed_and_knows_qwen3_5(node_a, cfg, hybrid):
    shown = run_in(node_a, hybrid.ref, "python3", "-m", "pip", "show", "transformers")
    assert shown.returncode == 0, shown.err
    assert f"Version: {cfg.transformers.removeprefix('==')}" in shown.out.splitlines(), shown.out
    lookup = (
        "from transformers import CONFIG_MAPPING as m; "
        "print(m['qwen3_5'].__name__, m['qwen3_5_moe'].__name__)"
    )
    known = run_in(node_a, hybrid.ref, "python3", "-c", lookup)
    assert known.returncode == 0, known.err
    assert known.out == "Qwen3_5Config Qwen3_5MoeConfig"
    recorded = run_in(node_a, hybrid.ref, "cat", "/opt/qwen35/pip-check.txt")
    assert recorded.returncode == 0, f"/opt/qwen35/pip-check.txt is missing: {recorded.err}"
    # The stand-in's vLLM is a bare tree, not a pip install: nothing conflicts with transformers 5 here.
    assert recorded.out == "No broken requirements found.", recorded.out


def test_the_deployment_image_fetches_the_checkpoint_from_the_hub(node_a, hybrid):
    """The default fetch (no `model.fetch_python`): Checkpoint runs the Hub client of the deployment's
    image in a short-lived container on the head (`docker run -i --network host --user <cache
    owner>`, the cache's hub dir mounted, the token on stdin). This image's client is the one its
    transformers brought (huggingface_hub 1.x), not this project's; the stand-in Hub wants a token."""
    cache = data_dir() / "hf-cache-container" / node_a.name
    shutil.rmtree(cache, ignore_errors=True)
    cache.mkdir(parents=True)
    token = "hf_container_fetch_token_321"
    workdir = data_dir() / "hf-container-repo"
    shutil.rmtree(workdir, ignore_errors=True)
    repo = generate_repo(workdir, shards=2, shard_bytes=2 << 20)
    props = {
        "node": {**lab.node_config(node_a), "name": node_a.name},
        "repo": "lab/container-fetch",
        "requested_revision": "main",
        "cache_dir": str(cache),
        "source": None,
        "source_mode": "hub",
        "refresh": "full",
        "keep": True,
        "reserve": 0,
        "fetch": {"image": hybrid.ref},
        "tuning": {},
        "hf_token": token,
    }
    try:
        with StandinHub({"lab/container-fetch": repo}) as hub:
            hub.require_token = token
            props["fetch"]["endpoint"] = hub.endpoint
            outs = CheckpointProvider().create(props).outs
            with pytest.raises(CheckpointError) as refused:
                CheckpointProvider().create({**props, "hf_token": "hf_wrong_token_000"})
        assert outs["revision"] == hub.repos["lab/container-fetch"].sha
        assert outs["files"] == len(hub.repos["lab/container-fetch"].files) and outs["problems"] == {}
        assert "401" in str(refused.value) and "hf_wrong_token_000" not in str(refused.value)
        # Read back on the node by every byte (refresh: full), as a worker's copy would be planned.
        assert CheckpointProvider().read("x", outs).outs["problems"] == {}
        root = cache / "hub" / "models--lab--container-fetch"
        assert os.readlink(root / "snapshots" / outs["revision"] / "config.json").startswith("../../blobs/")
    finally:
        shutil.rmtree(cache, ignore_errors=True)
        shutil.rmtree(workdir, ignore_errors=True)


def test_a_failing_proof_stops_the_build_and_says_why(node_a, cfg, context, hybrid):
    args = {**build_args(cfg), "EXTRA_DONOR_FILES": ""}
    build = build_hybrid(node_a, cfg, context, args)
    print(f"\n{node_a.name}: failing-proof build {build.seconds:.1f}s")
    assert build.result.returncode != 0, f"the build passed without mamba_utils.py:\n{build.tail()}"
    assert CLOSURE_NAME in build.output
    assert "provided by donor model_executor/layers/mamba/mamba_utils.py" in build.output
    assert "compatibility proof failed (exit 1)" in build.output and "EXTRA_DONOR_FILES" in build.output
    assert image_id(node_a, build.ref) is None


def test_a_base_without_the_vllm_tree_stops_the_build_naming_base_vllm_dir(node_a, cfg, context, hybrid):
    bare = f"{parse_image_ref(cfg.base).name}:no-vllm"
    try:
        base_standin(node_a, bare, None, None)
    except lab.LabError as exc:
        pytest.fail(f"the tree-less base stand-in could not be made: {exc}", pytrace=False)
    build = build_hybrid(node_a, cfg, context, {**build_args(cfg), "BASE_IMAGE": bare})
    print(f"\n{node_a.name}: tree-less base build {build.seconds:.1f}s")
    assert build.result.returncode != 0, f"the build passed on a base without vLLM:\n{build.tail()}"
    assert f"BASE_VLLM_DIR={cfg.base_vllm_dir} is not a vllm package directory in BASE_IMAGE" in build.output
    assert image_id(node_a, build.ref) is None


@pytest.mark.parametrize("node_name", ["node-a", "node-c"])
def test_buildkit_builds_the_hybrid_and_stops_on_a_failing_proof(lab_node, node_name, cfg, context):
    node = lab_node(node_name)
    standins(node, cfg)
    build = build_hybrid(node, cfg, context, build_args(cfg), Builder.BUILDKIT)
    print(f"\n{node.name} ({node.engine}) BuildKit: hybrid build {build.seconds:.1f}s")
    assert build.result.returncode == 0, f"the BuildKit build failed on {node.name}:\n{build.tail()}"
    proof = run_in(node, build.ref, "cat", "/opt/qwen35/compat-proof.txt")
    assert "OK: every vllm module" in proof.out, proof.out + proof.err
    failing = build_hybrid(node, cfg, context, {**build_args(cfg), "EXTRA_DONOR_FILES": ""}, Builder.BUILDKIT)
    assert failing.result.returncode != 0, f"BuildKit passed without mamba_utils.py:\n{failing.tail()}"
    assert CLOSURE_NAME in failing.output and "compatibility proof failed (exit 1)" in failing.output


def test_docker_26_builds_the_hybrid_too(node_c, cfg, context):
    standin_s = standins(node_c, cfg)
    build = build_hybrid(node_c, cfg, context, build_args(cfg))
    print(f"\n{node_c.name} ({node_c.engine}): stand-ins {standin_s:.1f}s, hybrid build {build.seconds:.1f}s")
    assert build.result.returncode == 0, f"the hybrid build failed on {node_c.name}:\n{build.tail()}"
    proof = run_in(node_c, build.ref, "cat", "/opt/qwen35/compat-proof.txt")
    assert "OK: every vllm module" in proof.out, proof.out + proof.err
