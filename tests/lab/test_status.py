"""`python -m status` against the lab E2E cluster: the program's declared containers started for real on
node-a and node-b (tests/lab/test_e2e.py's machinery), the deployment image tagged on both nodes as
NodeImage would leave it, and a Hub-layout checkpoint in each node's own cache. Then status is run as
an operator runs it (a subprocess, `--json` parsed) healthy, and with one thing broken at a time.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

import lab
from lab.nodes import running_sshd
from status.gather import ROOT, deployment_image, load_config
from tests.lab.test_e2e import (  # noqa: F401  (engine and placed are fixtures used by name)
    API_KEY,
    HEALTH_ROLES,
    PRECONDITION_DEADLINE_S,
    LabDeployment,
    create_gate,
    engine,
    placed,
    watchdog_state,
)
from tests.support.program import run_program

pytestmark = pytest.mark.lab

MODEL = "lab/standin-qwen35"
# A checkpoint in the Hub cache layout under HF_HOME (argv: the cache dir, the commit): blobs named by
# their sha256, relative snapshot links, refs/main. Prints the path of the second shard's blob.
CACHE_MAKER = r"""
import hashlib, os, sys
home, commit = sys.argv[1], sys.argv[2]
root = os.path.join(home, "hub", "models--lab--standin-qwen35")
files = {"config.json": b'{"model_type": "qwen3_5_moe"}', "tokenizer.json": b"{}",
         "model-00001-of-00002.safetensors": b"a" * 4096, "model-00002-of-00002.safetensors": b"b" * 4096}
for sub in ("blobs", "refs", os.path.join("snapshots", commit)):
    os.makedirs(os.path.join(root, sub), exist_ok=True)
with open(os.path.join(root, "refs", "main"), "w") as f:
    f.write(commit)
for name, data in files.items():
    blob = hashlib.sha256(data).hexdigest()
    with open(os.path.join(root, "blobs", blob), "wb") as f:
        f.write(data)
    link = os.path.join(root, "snapshots", commit, name)
    if not os.path.islink(link):
        os.symlink(os.path.join("..", "..", "blobs", blob), link)
print(os.path.join(root, "blobs", hashlib.sha256(files["model-00002-of-00002.safetensors"]).hexdigest()))
"""
# A status that has not finished by then hangs (it is a few seconds here, figures are printed).
STATUS_DEADLINE_S = 120


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> tuple[Path, dict]:
    """Pulumi.lab.yaml with each node's HF cache in a folder of its own (lab nodes share a filesystem)."""
    folder = tmp_path_factory.mktemp("status")
    document = yaml.safe_load((ROOT / "Pulumi.lab.yaml").read_text())
    caches = {name: str(folder / "hf" / name) for name in ("node-a", "node-b")}
    document["config"].setdefault("qwen35-spark:model", {})["cache_dirs"] = caches
    path = folder / "Pulumi.lab-status.yaml"
    path.write_text(yaml.safe_dump(document))
    return path, caches


@pytest.fixture(scope="module")
def stack_file(stack) -> Path:
    return stack[0]


def make_checkpoint(node: lab.LabNode, cache: str, commit: str) -> str:
    """The checkpoint in `node`'s cache; the path of its second shard's blob."""
    return lab.on_node(node, ["python3", "-", cache, commit], input=CACHE_MAKER.encode()).out


def status(stack_file: Path, *, key: str | None = API_KEY, json_out: bool = True) -> tuple[int, str, float]:
    env = {k: v for k, v in os.environ.items() if k != "QWEN35_API_KEY"}
    if key:
        env["QWEN35_API_KEY"] = key
    argv = [sys.executable, "-m", "status", "--file", str(stack_file), "--connect-timeout", "5"]
    started = time.monotonic()
    done = subprocess.run(
        argv + (["--json"] if json_out else []),
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    elapsed = time.monotonic() - started
    print(f"status: exit {done.returncode} in {elapsed:.1f}s\n{done.stdout[-4000:]}{done.stderr[-2000:]}")
    assert API_KEY not in done.stdout + done.stderr, "the API key must never appear in status output"
    return done.returncode, done.stdout, elapsed


def problems(output: str) -> list[tuple[str, str]]:
    return [(p["node"], p["what"]) for p in json.loads(output)["problems"]]


@pytest.fixture(scope="module")
def program(stack):
    """The program under mocks with this module's stack file (test_e2e's `engine` and `placed` use it)."""
    return run_program(
        yaml.safe_load(stack[0].read_text())["config"], stack="lab", secrets={"api_key": API_KEY}
    )


@pytest.fixture(scope="module")
def cluster(program, engine, placed, node_a, node_b, stack):  # noqa: F811
    """The declared containers running and ready on the image the NodeImages placed, that image also
    under the deployment image's reference, and the checkpoint in each node's own cache."""
    path, caches = stack
    nodes = {node.name: node for node in (node_a, node_b)}
    deployed = LabDeployment(program, nodes, placed)
    (server,) = deployed.of_role("vllm")
    command = list(server.inputs["command"])
    commit = command[command.index("--revision") + 1]  # the pinned commit the server serves
    ref = deployment_image(load_config(path))
    deployed.clean()
    try:
        for name, node in nodes.items():
            lab.docker(node, "tag", deployed.images[name], ref)
            make_checkpoint(node, caches[name], commit)
        deployed.start()
        create_gate(engine, program, PRECONDITION_DEADLINE_S)
        # After the gate, as `up` does: the agent, then the watchdog (report mode in Pulumi.lab.yaml).
        deployed.start(roles=HEALTH_ROLES)
        watchdog_state(program, lambda s: s.get("state") == "healthy")
        yield deployed, ref, commit
    finally:
        deployed.clean()
        for node in nodes.values():
            lab.docker(node, "image", "rm", ref, check=False)
        shutil.rmtree(Path(caches["node-a"]).parent, ignore_errors=True)


def test_healthy_cluster_is_all_green(cluster, stack_file):
    code, out, elapsed = status(stack_file)
    document = json.loads(out)
    assert (code, document["problems"]) == (0, [])
    assert document["ok"] is True
    assert document["cluster"]["ray"].startswith("2/2 nodes, 2/2 GPUs"), document["cluster"]["ray"]
    # Nodes and GPUs are counted from Ray's live node table (`ray status` is a 5 s snapshot).
    table = json.loads(document["facts"]["nodes"]["node-a"]["ray"]["nodes_json"])
    assert sum(row["resources_total"].get("GPU", 0) for row in table if row["state"] == "ALIVE") == 2, table
    assert document["cluster"]["completion"].endswith("tokens/s")
    # The head's watchdog, read on the head: healthy, watching in report mode.
    assert document["cluster"]["watchdog"].startswith("healthy (mode report"), document["cluster"]
    node_b = document["nodes"]["node-b"]
    assert node_b["image"].endswith("= head") and node_b["checkpoint"].endswith("(4 files) = head")
    assert node_b["containers"].startswith("qwen35-ray-worker running")
    assert document["facts"]["nodes"]["node-a"]["docker"]["version"].startswith("20.10")
    # The table for people says the same.
    code, text, _ = status(stack_file, json_out=False)
    assert code == 0 and text.endswith("everything is as declared\n")
    assert "node-b  worker  ok" in text


def test_an_operation_in_flight_is_shown_and_is_not_a_problem(cluster, stack_file, node_a):
    # What the transfer layer leaves on its source node while it copies (pid 1: a writer that lives).
    record = {"operation": "image-copy", "node": "node-a", "peer": "node-b", "stage": "send",
              "bytes_done": 300_000_000, "bytes_total": 1_200_000_000, "rate_bps": 150_000_000,
              "eta_s": 6.0, "started_at": time.time() - 2, "updated_at": time.time(), "pid": 1}  # fmt: skip
    write = "mkdir -p ~/.qwen35/progress && cat > ~/.qwen35/progress/image-copy.json"
    lab.on_node(node_a, ["sh", "-c", write], input=json.dumps(record).encode())
    try:
        code, out, _ = status(stack_file)
        _, text, _ = status(stack_file, json_out=False)
    finally:
        lab.on_node(node_a, ["sh", "-c", "rm -f ~/.qwen35/progress/image-copy.json"])
    (operation,) = json.loads(out)["operations"]
    assert (operation["operation"], operation["on"], operation["alive"]) == ("image-copy", "node-a", True)
    assert code == 0
    assert "image-copy  node-a -> node-b  send   300.0/1200.0 MB 150.0 MB/s eta 6 s  running" in text, text


def test_without_an_api_key_the_completion_is_not_tried(cluster, stack_file):
    code, out, _ = status(stack_file, key=None)
    document = json.loads(out)
    assert document["cluster"]["completion"] == "not tried: no API key"
    assert code == 0, document["problems"]


def test_an_image_that_differs_between_nodes(cluster, stack_file, node_b):
    deployed, ref, _commit = cluster
    lab.docker(node_b, "commit", "qwen35-ray-worker", "status-other:1")
    lab.docker(node_b, "tag", "status-other:1", ref)
    try:
        code, out, _ = status(stack_file)
    finally:
        lab.docker(node_b, "tag", deployed.images["node-b"], ref)
        lab.docker(node_b, "image", "rm", "status-other:1")
    found = problems(out)
    assert code == 1
    assert any(node == "node-b" and "differs from the head's (1 of" in what for node, what in found), found
    assert all(node == "node-b" for node, _ in found), found


def test_a_checkpoint_file_missing_on_one_node(cluster, stack, node_b):
    _deployed, _ref, commit = cluster
    path, caches = stack
    lab.on_node(node_b, ["rm", make_checkpoint(node_b, caches["node-b"], commit)])
    try:
        code, out, _ = status(path)
    finally:
        make_checkpoint(node_b, caches["node-b"], commit)
    assert code == 1
    repo = f"{caches['node-b']}/hub/models--lab--standin-qwen35"
    assert problems(out) == [
        ("node-b", f"1 checkpoint file(s) missing in {repo}: model-00002-of-00002.safetensors")
    ]


def test_node_b_sshd_down_fails_fast_naming_node_b(cluster, stack_file):
    pid = running_sshd("node-b")
    assert pid, "node-b's sshd should be running"
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and running_sshd("node-b"):
        time.sleep(0.1)
    try:
        code, out, elapsed = status(stack_file)
    finally:
        lab.up(["node-b"])
    document = json.loads(out)
    assert code == 1 and document["nodes"]["node-b"]["ssh"] == "unreachable"
    (first, *_rest) = problems(out)
    assert first[0] == "node-b" and "not reachable over SSH" in first[1], first
    # No hang: status itself runs under a deadline (`status()`); how long it took is printed there.
    assert document["facts"]["nodes"]["node-b"]["reachable"] is False


def test_worker_ray_container_stopped_is_named(cluster, stack_file, node_b):
    lab.docker(node_b, "stop", "--time", "5", "qwen35-ray-worker")
    code, out, _ = status(stack_file)
    assert code == 1
    found = problems(out)
    assert ("node-b", "container qwen35-ray-worker is exited") in [(n, w.split(" (")[0]) for n, w in found], (
        found
    )
    assert json.loads(out)["nodes"]["node-b"]["containers"].startswith("qwen35-ray-worker exited")
