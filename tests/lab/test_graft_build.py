"""The graft build in the lab: a real `docker build` of patches/Dockerfile.graft on node-a with the program's
own build args, FROM stand-ins: the base is the lab Ray image (bookworm's Python 3.11, a real Ray 2.60.0
installed from the lab's wheel cache), the donor carries the real vLLM 0.17.1 tree importable by its
python and no Ray, as the seed's donor and NVIDIA's vLLM containers ship. The graft copies the base's
Ray (same Python ABI); onto a donor on trixie (Python 3.13) it installs exactly that Ray from a wheel
folder, or refuses with the reason when no index is reachable; a base without Ray stops the build.
The built image passes the cluster-layer proof (ray beside vllm at 2.60.0, a one-node Ray cluster
inside the build). The model-support check refuses the Ray-less donor as a prebuilt image, naming
Ray, and passes the graft's cluster layer."""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

import lab
from components.config import ImageConfig
from components.image_build.component import PATCH_DIR, build_args, content_tag, dockerfile
from components.model_support import ModelSupportCheckProvider, ModelSupportError
from lab.images import DEBIAN_TAG, image_id
from lab.ray_image import RAY_VERSION, ray_image, wheels_for
from lab.vllm_images import OTHER_GLIBC, OTHER_PYTHON, OTHER_SUITE, folder_context, graft_donor_standin
from tests.lab.test_model_support import check_props, leftover_containers
from tests.support.vllm_trees import DONOR_VERSION, vllm_tree

pytestmark = pytest.mark.lab

BUILD_TIMEOUT_S = 900
DONOR = f"lab-vllm-graft-donor:{DONOR_VERSION}"
OTHER_DONOR = f"lab-vllm-graft-donor:{DONOR_VERSION}-py313"
DONOR_VLLM_DIR = "/opt/vllm-donor/vllm"
LAB_PIP_ARGS = ["--no-index", "--find-links", "/opt/qwen35/wheels"]


@dataclass(frozen=True)
class Build:
    ref: str
    result: lab.Result
    seconds: float

    @property
    def output(self) -> str:
        return f"{self.result.out}\n{self.result.err}"

    def tail(self, lines: int = 30) -> str:
        return "\n".join(self.output.strip().splitlines()[-lines:])

    def recorded(self, node: lab.LabNode, name: str) -> dict:
        """What the build recorded in /opt/qwen35/ (the last JSON line of `name`): read from the image,
        since a rebuild from the build cache prints none of the steps' output."""
        shown = run_in(node, self.ref, "cat", f"/opt/qwen35/{name}")
        assert shown.returncode == 0, f"{name} is missing in {self.ref}: {shown.err}\n{self.tail()}"
        return json.loads(shown.out.strip().splitlines()[-1] if name.endswith("proof.json") else shown.out)


def graft_config(base: str, **changes) -> ImageConfig:
    """The graft as a lab stack would declare it (no torch in the stand-ins: smoke false)."""
    fields = {
        "strategy": "graft", "base": base, "donor": DONOR, "name": "lab-vllm-qwen35-graft",
        "platform": "linux/amd64", "pip_args": LAB_PIP_ARGS, "build_network": "host", "smoke": False,
    }  # fmt: skip
    return ImageConfig(**{**fields, **changes})


def build_graft(node: lab.LabNode, cfg: ImageConfig, context: Path, **extra_args: str) -> Build:
    """`docker build` of the graft as BuiltImage asks for it: its Dockerfile, tag, network, platform."""
    args = {**build_args(cfg), **extra_args}
    ref = f"{cfg.name}:{content_tag(context, args, cfg.platform)}"
    argv = ["docker", "build", "--file", dockerfile(cfg), "--tag", ref, "--platform", cfg.platform]
    # The lab's legacy builder keeps a failed step's container: the refused builds leave none behind.
    argv += ["--force-rm"]
    argv += ["--network", cfg.build_network or "host"]
    for key, value in args.items():
        argv += ["--build-arg", f"{key}={value}"]
    started = time.monotonic()
    result = lab.on_node(
        node, [*argv, "-"], input=folder_context(context), timeout=BUILD_TIMEOUT_S, check=False
    )
    return Build(ref, result, time.monotonic() - started)


def run_in(node: lab.LabNode, ref: str, *argv: str) -> lab.Result:
    return lab.docker(
        node, "run", "--rm", "--network", "none", "--entrypoint", argv[0], ref, *argv[1:], check=False
    )


def copy_of_patches(dest: Path, wheels: Path | None = None) -> Path:
    context = dest / "context"
    shutil.copytree(PATCH_DIR, context, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "wheels"))
    if wheels is not None:
        shutil.copytree(wheels, context / "wheels", ignore=shutil.ignore_patterns(".complete"))
    return context


@pytest.fixture(scope="module")
def base(node_a) -> str:
    """The lab Ray image's tag on node-a (cached: built once per machine, then loaded)."""
    try:
        return ray_image(node_a)[0]
    except lab.LabError as exc:
        pytest.fail(f"the lab Ray image (the graft's base) could not be made: {exc}", pytrace=False)


@pytest.fixture(scope="module")
def donor(node_a) -> str:
    try:
        return graft_donor_standin(node_a, DONOR, DONOR_VLLM_DIR, vllm_tree(DONOR_VERSION))
    except lab.LabError as exc:
        pytest.fail(f"the graft's donor stand-in could not be made: {exc}", pytrace=False)


@pytest.fixture(scope="module")
def graft(node_a, base, donor, tmp_path_factory) -> Build:
    cfg = graft_config(base)
    build = build_graft(node_a, cfg, copy_of_patches(tmp_path_factory.mktemp("graft")))
    print(f"\n{node_a.name}: graft build {build.seconds:.1f}s ({build.ref})")
    assert build.result.returncode == 0, f"the graft build failed on {node_a.name}:\n{build.tail()}"
    return build


def test_the_graft_copies_the_base_s_ray_and_passes_the_cluster_layer_proof(node_a, graft):
    layer = graft.recorded(node_a, "cluster-layer.json")
    assert layer["way"] == "copy" and layer["why"].startswith("both Pythons are cpython-311"), layer
    assert layer["ray"] == RAY_VERSION and "default" in layer["extras"], layer
    assert any(name.startswith("ray ") for name in layer["copied"]), layer
    assert layer["nccl"] == "no pip NCCL in the base: nothing to carry", layer
    verdict = graft.recorded(node_a, "cluster-proof.json")
    assert verdict["verdict"] == "pass" and verdict["ray"] == RAY_VERSION, verdict
    assert verdict["wanted"] == f"=={RAY_VERSION}" and verdict["vllm"] == DONOR_VERSION, verdict
    assert [(c["stage"], c["ok"]) for c in verdict["checks"]] == [("ray", True), ("cluster", True)], verdict
    # No torch in the stand-ins: the behaviour proofs are skipped (their report is never written).
    assert run_in(node_a, graft.ref, "test", "-e", "/opt/qwen35/proof-report.json").returncode == 1
    # The program's Ray containers run `ray start` by name: the donor's python runs it.
    shown = run_in(node_a, graft.ref, "ray", "--version")
    assert shown.returncode == 0 and RAY_VERSION in shown.out, shown.err
    assert run_in(node_a, graft.ref, "head", "-1", "/opt/venv/bin/ray").out == "#!/opt/venv/bin/python3"


@pytest.fixture(scope="module")
def other_donor(node_a) -> str:
    """The same donor on trixie: Python 3.13, an ABI the base's compiled Ray does not load in."""
    try:
        return graft_donor_standin(node_a, OTHER_DONOR, DONOR_VLLM_DIR, vllm_tree(DONOR_VERSION), OTHER_SUITE)
    except lab.LabError as exc:
        pytest.fail(f"the trixie donor stand-in could not be made: {exc}", pytrace=False)


ABI_DIFFERS = "the two Pythons' ABI differ (base vs donor: cache_tag cpython-311 vs cpython-313"


def test_a_donor_whose_python_abi_differs_gets_exactly_the_base_s_ray_installed(
    node_a, base, other_donor, graft, tmp_path
):
    try:
        wheels = wheels_for(OTHER_PYTHON, OTHER_GLIBC)
    except lab.LabError as exc:
        pytest.fail(f"Ray's wheels for CPython 3.13 are not available: {exc}", pytrace=False)
    build = build_graft(node_a, graft_config(base, donor=other_donor), copy_of_patches(tmp_path, wheels))
    print(f"\n{node_a.name}: graft onto a 3.13 donor (install path) {build.seconds:.1f}s")
    assert build.result.returncode == 0, f"the install path failed:\n{build.tail()}"
    layer = build.recorded(node_a, "cluster-layer.json")
    assert layer["way"] == "install" and layer["why"].startswith(ABI_DIFFERS), layer
    assert layer["installed"] == f"ray[client,default]=={RAY_VERSION}", layer
    verdict = build.recorded(node_a, "cluster-proof.json")
    assert verdict["verdict"] == "pass" and verdict["ray"] == RAY_VERSION, verdict
    assert verdict["python"].startswith("3.13."), verdict


def test_without_a_reachable_index_the_install_path_is_refused_naming_pip_args(
    node_a, base, other_donor, graft, tmp_path
):
    build = build_graft(node_a, graft_config(base, donor=other_donor), copy_of_patches(tmp_path))
    assert build.result.returncode != 0, f"the install path passed without wheels or index:\n{build.tail()}"
    assert f"graft refused: Ray {RAY_VERSION} could not be installed in the donor" in build.output, (
        build.tail()
    )
    assert ABI_DIFFERS in build.output and "image.pip_args" in build.output
    assert "graft failed (exit 1)" in build.output and image_id(node_a, build.ref) is None


def test_a_base_without_ray_stops_the_build_naming_it(node_a, donor, graft, tmp_path):
    build = build_graft(node_a, graft_config(DEBIAN_TAG), copy_of_patches(tmp_path))
    assert build.result.returncode != 0, f"the graft passed on a base without Ray:\n{build.tail()}"
    assert "graft refused: the base image has no Ray" in build.output, build.tail()
    assert image_id(node_a, build.ref) is None


def cluster_props(node: lab.LabNode, image: str, image_ref: str, mode: str = "enforce") -> dict:
    return {
        **check_props(node, image, None),
        "image": image_ref,
        "mode": mode,
        # The stand-ins have no torch: vLLM's executor stage cannot import here (the release tier runs it).
        "cluster": {"ray_version": f"=={RAY_VERSION}", "stages": "ray,cluster"},
    }


def test_the_model_support_check_refuses_the_ray_less_donor_naming_ray(node_a, donor):
    donor_id = image_id(node_a, donor)
    with pytest.raises(ModelSupportError) as info:
        ModelSupportCheckProvider().create(cluster_props(node_a, donor_id, donor))
    message = str(info.value)
    for part in (
        f"node-a: the model-support check refused image {donor}",
        "stage 'ray'",
        f"Ray: none (the stack needs =={RAY_VERSION})",
        f"no Ray in the interpreter that runs vLLM {DONOR_VERSION}",
        "graft",
    ):
        assert part in message, f"{part!r} not in:\n{message}"
    assert leftover_containers(node_a) == []


def test_the_model_support_check_passes_the_graft_s_cluster_layer(node_a, graft):
    created = ModelSupportCheckProvider().create(
        cluster_props(node_a, image_id(node_a, graft.ref), graft.ref, mode="report")
    )
    cluster = created.outs["cluster_layer"]
    assert cluster["verdict"] == "pass" and cluster["ray"] == RAY_VERSION, cluster
    # The behaviour proof still runs after it: no torch in the stand-in.
    assert created.outs["failed_stage"] == "environment"
