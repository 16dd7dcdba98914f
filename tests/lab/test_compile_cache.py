"""The compile cache on a real Docker daemon: what a container writes under its
VLLM_CACHE_ROOT is there for the container that replaces it, because the volume holds it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import lab
from components.containers import ContainerSpec, compile_cache_volume_name
from components.ray_cluster import ray_container_spec
from tests.support.program import config_from

pytestmark = pytest.mark.lab

# A prefix of its own: the test never touches a lab stack's `qwen35-compile-cache`.
CONFIG = config_from("lab", containers={"name_prefix": "cachetest"})
PROBE = "torch_compile_cache/probe"
TOKEN = "compiled-once"


def cache_flags(spec: ContainerSpec) -> list[str]:
    """`docker run` flags for the spec's compile cache: its named volume and VLLM_CACHE_ROOT."""
    (mount,) = [m for m in spec.mounts if m.volume and m.source == compile_cache_volume_name(CONFIG)]
    return ["-v", f"{mount.source}:{mount.target}", "-e", f"VLLM_CACHE_ROOT={spec.env['VLLM_CACHE_ROOT']}"]


@pytest.fixture
def head(node_a) -> Iterator[tuple[lab.LabNode, ContainerSpec, str]]:
    """node-a, the head's Ray container spec, and the busybox image; the volume fresh, then removed."""
    spec = ray_container_spec(CONFIG, CONFIG.head, "unused")
    image = lab.busybox_image(node_a)
    volume = compile_cache_volume_name(CONFIG)
    lab.docker(node_a, "rm", "-f", "cachetest-first", check=False)
    lab.docker(node_a, "volume", "rm", "-f", volume, check=False)
    lab.docker(node_a, "volume", "create", volume)
    try:
        yield node_a, spec, image
    finally:
        lab.docker(node_a, "rm", "-f", "cachetest-first", check=False)
        lab.docker(node_a, "volume", "rm", "-f", volume, check=False)


def run_sh(node: lab.LabNode, image: str, flags: list[str], script: str, name: str | None = None):
    """`sh -c script` in a busybox container with `flags`: kept under `name`, else removed at exit."""
    named = ["--name", name] if name else ["--rm"]
    argv = ["run", *named, "--network", "none", *flags, image, "sh", "-c", script]
    return lab.docker(node, *argv, check=False)


def test_a_file_in_the_cache_survives_its_container_s_replacement(head):
    node, spec, image = head
    flags = cache_flags(spec)
    write = f'mkdir -p "$VLLM_CACHE_ROOT/torch_compile_cache" && echo {TOKEN} > "$VLLM_CACHE_ROOT/{PROBE}"'
    wrote = run_sh(node, image, flags, write, name="cachetest-first")
    assert wrote.returncode == 0, wrote.err
    # The replacement: the first container deleted, a new one from the same spec.
    lab.docker(node, "rm", "-f", "cachetest-first")
    read = run_sh(node, image, flags, f'cat "$VLLM_CACHE_ROOT/{PROBE}"')
    assert read.returncode == 0 and read.out.strip() == TOKEN, (read.out, read.err)
    # The control: without the volume the same path is empty, so it is the volume that kept it.
    env_only = flags[2:]
    bare = run_sh(node, image, env_only, f'cat "$VLLM_CACHE_ROOT/{PROBE}"')
    assert bare.returncode != 0 and TOKEN not in bare.out
