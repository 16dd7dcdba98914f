"""Executor mp in the lab: the program's own rank command lines, run by the stand-in `vllm`
in containers on node-a (the head, rank 0) and node-b (a headless rank 1), host network, no Ray. The
head serves a completion that both ranks answered; removing the rank's container ends the head."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest

import lab
from components.config import parse_stack_config
from components.mp_executor import mp_serve_argv
from lab.images import DEBIAN_TAG, FIXED_MTIME, image_id
from lab.nodes import bind_error
from tests.support.program import dev_raw

pytestmark = pytest.mark.lab

STANDIN = Path(__file__).resolve().parents[2] / "lab" / "standin_vllm.py"
MODEL_DIR = "/models/standin"
DOCKERFILE = f"""FROM {DEBIAN_TAG}
COPY standin_vllm.py /opt/vllm-standin/standin_vllm.py
COPY vllm /usr/local/bin/vllm
COPY config.json {MODEL_DIR}/config.json
"""
# `vllm` on PATH: the stand-in with the image's own python3 (executor mp needs no Ray).
ENTRY = """#!/usr/bin/python3
import sys

sys.path.insert(0, "/opt/vllm-standin")
from standin_vllm import main

sys.exit(main())
"""


def context() -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data, mode in [
            ("Dockerfile", DOCKERFILE.encode(), 0o644),
            ("standin_vllm.py", STANDIN.read_bytes(), 0o644),
            ("vllm", ENTRY.encode(), 0o755),
            ("config.json", json.dumps({"model_type": "qwen3_5_moe"}).encode(), 0o644),
        ]:
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), FIXED_MTIME, mode
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def standin_image(node: lab.LabNode) -> str:
    """The lab's Debian with the stand-in as `vllm`, on `node` (built there from a small context)."""
    data = context()
    tag = f"lab-standin-mp:{hashlib.sha256(data).hexdigest()[:16]}"
    if image_id(node, tag):
        return tag
    lab.debian_image(node)
    built = lab.docker(
        node, "build", "--network", "host", "--tag", tag, "-", input=data, timeout=600, check=False
    )
    assert built.returncode == 0, f"{node.name}: building {tag} failed:\n{built.err[-2000:]}"
    return tag


def free_port(host: str) -> int:
    for port in range(18400, 18500):
        if bind_error(host, port) is None:
            return port
    raise AssertionError(f"no free port on {host} in 18400-18499")


def lab_mp_config(node_a: lab.LabNode, node_b: lab.LabNode):
    """The lab stack under executor mp (its Ray settings removed), serving the image's stand-in model."""
    raw = dev_raw("lab")
    raw.pop("ray", None)
    for node in raw["nodes"]:
        node.pop("ray_ports", None)
    assert [n["fabric_ip"] for n in raw["nodes"]] == [node_a.host, node_b.host]
    api_port = free_port(node_a.host)
    raw["serve"] = {**raw["serve"], "model": MODEL_DIR, "host": node_a.host, "port": api_port}
    master_port = next(p for p in range(api_port + 1, 18500) if bind_error(node_a.host, p) is None)
    raw["cluster"] = {"executor": "mp", "master_port": master_port}
    return parse_stack_config(raw)


def run_rank(node: lab.LabNode, image: str, name: str, argv: list[str]) -> None:
    lab.docker(
        node, "run", "--detach", "--name", name, "--network", "host",
        "--env", "VLLM_STANDIN_JOIN_TIMEOUT_S=120", "--entrypoint", argv[0], image, *argv[1:],
    )  # fmt: skip


def http(url: str, body: dict | None = None) -> tuple[int | None, dict | None]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            text = answer.read()
            return answer.status, json.loads(text) if text else None
    except urllib.error.HTTPError as exc:
        return exc.code, None
    except OSError:
        return None, None


def state(node: lab.LabNode, name: str) -> str:
    return lab.docker(node, "inspect", "--format", "{{.State.Status}} {{.State.ExitCode}}", name).out


def test_a_head_and_a_headless_rank_in_containers_serve_and_fail_together(node_a, node_b):
    cfg = lab_mp_config(node_a, node_b)
    images = {node.name: standin_image(node) for node in (node_a, node_b)}
    suffix = uuid.uuid4().hex[:8]
    head, rank = f"qwen35-mptest-vllm-{suffix}", f"qwen35-mptest-vllm-rank1-{suffix}"
    base = f"http://{cfg.serve.host}:{cfg.serve.port}"
    try:
        # As the deployment orders them: the headless rank first, then the head.
        run_rank(node_b, images["node-b"], rank, mp_serve_argv(cfg, cfg.nodes[1]))
        run_rank(node_a, images["node-a"], head, mp_serve_argv(cfg, cfg.nodes[0]))
        deadline = time.monotonic() + 90
        while http(f"{base}/health")[0] != 200:
            assert state(node_a, head).startswith("running"), lab.docker(node_a, "logs", head).err
            assert time.monotonic() < deadline, lab.docker(node_a, "logs", head).out
            time.sleep(0.5)
        request = {"model": cfg.serve.model_name, "messages": [{"role": "user", "content": "hello"}]}
        status, answer = http(f"{base}/v1/chat/completions", request)
        assert status == 200, status
        content = answer["choices"][0]["message"]["content"]
        assert "node rank 0 (ranks 0-0)" in content and "node rank 1 (ranks 1-1)" in content, content
        lab.docker(node_b, "rm", "--force", rank)
        deadline = time.monotonic() + 30
        while not state(node_a, head).startswith("exited"):
            assert time.monotonic() < deadline, "the head kept running after its headless rank died"
            time.sleep(0.5)
        assert state(node_a, head) == "exited 1"
        logs = lab.docker(node_a, "logs", head)
        assert "node rank 1 is gone" in logs.out + logs.err
    finally:
        lab.docker(node_a, "rm", "--force", head, check=False)
        lab.docker(node_b, "rm", "--force", rank, check=False)
