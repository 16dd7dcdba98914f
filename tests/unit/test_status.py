"""`status` without a node: the node program's checkpoint and progress facts on a temporary cache,
the verdict on gathered facts (tables of facts in, cells and problems out), and the rendering."""

from __future__ import annotations

import copy
import json
import os
import time
from pathlib import Path

import pytest

from components.config import parse_stack_config
from components.node_programs import node_status
from status import gather, render, serving
from status.problem import Problem, duration
from status.verdict import judge
from tests.support.program import stack_config

URL = "http://127.0.0.2:18000"
LAYERS = ["sha256:" + c * 64 for c in "abc"]
IMAGE_ID = "sha256:" + "1" * 64
DIGEST = "d" * 64
RAY_OK = "Active:\n 1 node_a\n 1 node_b\nResources\nUsage:\n 0.0/2.0 GPU\n"
RAY_ONE = "Active:\n 1 node_a\nResources\nUsage:\n 0.0/1.0 GPU\n"
NODES_JSON = json.dumps(
    [{"node_ip": "127.0.0.2", "state": "ALIVE"}, {"node_ip": "127.0.0.3", "state": "ALIVE"}]
)
NODES_JSON_ONE = json.dumps([{"node_ip": "127.0.0.2", "state": "ALIVE"}])
# `ray list nodes` as Ray 2.x prints it: the GCS node table, with each node's resources.
NODES_JSON_GPUS = json.dumps(
    [{"node_ip": ip, "state": "ALIVE", "resources_total": {"CPU": 2.0, "GPU": gpus, f"node:{ip}": 1.0}}
     for ip, gpus in (("127.0.0.2", 1.0), ("127.0.0.3", 1.0))]
)  # fmt: skip


@pytest.fixture(scope="module")
def config():
    raw = {k.split(":", 1)[1]: v for k, v in stack_config("lab").items()}
    return parse_stack_config(raw)


def running(image=IMAGE_ID):
    return {
        "present": True,
        "state": "running",
        "restarts": 0,
        "exit_code": 0,
        "uptime_s": 75,
        "image": image,
    }


def node_report(containers, ray=None):
    report = {
        "reachable": True,
        "docker": {"ok": True, "version": "20.10.24", "store": "classic", "driver": "overlay2"},
        "image": {"ref": "lab-vllm-qwen35:h-x", "present": True, "id": IMAGE_ID, "layers": list(LAYERS)},
        "containers": {name: running() for name in containers},
        "gpus": {"tool": False, "count": 0, "names": []},
        "checkpoint": {"path": "/c", "present": True, "revision": "r" * 40, "files": 3, "bytes": 10,
                       "missing": [], "missing_count": 0, "digest": DIGEST},
        "progress": [],
    }  # fmt: skip
    if ray is not None:
        report["ray"] = ray
    return report


# The head's watchdog /state when all is well (Pulumi.lab.yaml: report mode).
WATCHDOG_HEALTHY = {
    "state": "healthy",
    "mode": "report",
    "step": None,
    "budget_left": 3,
    "restarts": [],
    "spent": None,
    "held": None,
    "would": None,
    "next_step": "nothing to do",
}


def healthy():
    head = node_report(
        ["qwen35-ray-head", "qwen35-vllm", "qwen35-watchdog"],
        ray={"status": RAY_OK, "nodes_json": NODES_JSON, "error": ""},
    )
    head["watchdog"] = {"state": dict(WATCHDOG_HEALTHY)}
    head["now"] = 1_800_000_000.0
    return {
        "nodes": {
            "node-a": head,
            "node-b": node_report(["qwen35-ray-worker", "qwen35-health-agent"]),
        },
        "server": {
            "url": URL,
            "health": {"ok": True},
            "models": {"ok": True},
            "completion": {"tried": True, "ok": True, "latency_s": 0.25, "tokens": 5, "tokens_per_s": 20.0},
        },
    }


def broken(change):
    gathered = healthy()
    change(gathered)
    return gathered


def _set(path, value):
    def change(gathered):
        target = gathered
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return change


B = ("nodes", "node-b")
A = ("nodes", "node-a")

# (case, change to the healthy facts, expected problems as (node, fragment of `what`, fragment of `next`))
CASES = [
    ("healthy", lambda g: None, []),
    (
        "worker unreachable",
        _set(("nodes", "node-b"), {"reachable": False, "error": "port 2222: Connection refused"}),
        [("node-b", "not reachable over SSH: port 2222: Connection refused", "jump host")],
    ),
    (
        "worker's Ray container stopped",
        _set((*B, "containers", "qwen35-ray-worker"),
             {**running(), "state": "exited", "exit_code": 137, "uptime_s": None}),
        [("node-b", "container qwen35-ray-worker is exited (exit code 137", "docker logs qwen35-ray-worker")],
    ),
    (
        "worker's Ray container removed",
        _set((*B, "containers", "qwen35-ray-worker"), {"present": False}),
        [("node-b", "container qwen35-ray-worker does not exist", "`--replace` the server's URN")],
    ),
    (
        "image missing on the worker",
        _set((*B, "image"), {"ref": "lab-vllm-qwen35:h-x", "present": False, "error": ""}),
        [("node-b", "the deployment image lab-vllm-qwen35:h-x is missing", "copies it back")],
    ),
    (
        "image differs on the worker",
        _set((*B, "image", "layers"), [*LAYERS[:2], "sha256:" + "e" * 64]),
        [("node-b", "differs from the head's (1 of 3 layers differ)", "pulumi up --refresh")],
    ),
    (
        "container runs another image",
        _set((*B, "containers", "qwen35-ray-worker"), running("sha256:" + "9" * 64)),
        [("node-b", "runs image 999999999999, not the deployment image (111111111111)", "replaces it")],
    ),
    (
        "checkpoint file missing on the worker",
        _set((*B, "checkpoint"), {"path": "/c", "present": False, "revision": "r" * 40, "files": 3,
                                  "bytes": 5, "missing": ["m-1.safetensors"], "missing_count": 1,
                                  "digest": "e" * 64}),
        [("node-b", "1 checkpoint file(s) missing in /c: m-1.safetensors", "sends the missing files")],
    ),
    (
        "checkpoint differs from the head's",
        _set((*B, "checkpoint", "digest"), "e" * 64),
        [("node-b", "the checkpoint differs from the head's (digest eeeeeeeeeeee vs dddddddddddd", "copies")],
    ),
    (
        "checkpoint absent",
        _set((*B, "checkpoint"), {"path": "/c", "present": False, "error": "no snapshot for 'main' in /c"}),
        [("node-b", "not in the Hugging Face cache (no snapshot for 'main' in /c)", "fetch it")],
    ),
    (
        "docker down on the worker",
        _set((*B, "docker"), {"ok": False, "error": "Cannot connect to the Docker daemon"}),
        [("node-b", "Docker does not answer: Cannot connect to the Docker daemon", "systemctl status")],
    ),
    (
        "store differs from the declaration",
        _set((*B, "docker", "store"), "containerd"),
        [("node-b", "containerd image store, but the stack declares classic", "nodes[].image_store")],
    ),
    (
        "worker not in Ray",
        _set((*A, "ray"), {"status": RAY_ONE, "nodes_json": NODES_JSON_ONE, "error": ""}),
        [("node-b", "has not joined the Ray cluster (no ALIVE Ray node at 127.0.0.3)", "socket_ifname")],
    ),
    (
        "one GPU short in Ray",
        _set((*A, "ray", "status"), RAY_OK.replace("0.0/2.0 GPU", "0.0/1.0 GPU")),
        [("cluster", "Ray reports 2/2 nodes and 1/2 GPUs", "gpus")],
    ),
    (
        # `ray status` prints the autoscaler's snapshot, rewritten every 5 s; the node table is live.
        "Ray's status snapshot behind its node table: settling, not a problem",
        _set((*A, "ray"), {"status": RAY_ONE, "nodes_json": NODES_JSON_GPUS, "error": ""}),
        [],
    ),
    (
        "one GPU short in Ray's node table",
        _set((*A, "ray"), {"status": RAY_OK, "error": "",
                           "nodes_json": NODES_JSON_GPUS.replace('"GPU": 1.0', '"GPU": 0.0', 1)}),
        [("cluster", "Ray reports 2/2 nodes and 1/2 GPUs", "gpus")],
    ),
    (
        "server container removed",
        _set((*A, "containers", "qwen35-vllm"), {"present": False}),
        [("node-a", "container qwen35-vllm does not exist", "creates it again")],
    ),
    (
        "Ray head container stopped: Ray is not asked again",
        lambda g: g["nodes"]["node-a"]["containers"]["qwen35-ray-head"].update(state="exited", exit_code=1),
        [("node-a", "container qwen35-ray-head is exited (exit code 1", "docker logs qwen35-ray-head")],
    ),
    (
        "server down",
        _set(("server", "health"), {"ok": False, "error": f"{URL}/health: Connection refused"}),
        [("cluster", f"{URL}/health failed: Connection refused", "docker logs qwen35-vllm")],
    ),
    (
        "completion fails",
        _set(("server", "completion"), {"tried": True, "ok": False, "error": "answered 500"}),
        [("cluster", "one chat completion failed: answered 500", "docker logs qwen35-vllm")],
    ),
    (
        "no API key: completion not tried, not a problem",
        lambda g: g["server"].update(models={"ok": False, "rejected": True},
                                     completion={"tried": False, "why": "no API key"}),
        [],
    ),
    (
        "wrong API key",
        lambda g: g["server"].update(models={"ok": False, "rejected": True},
                                     completion={"tried": True, "ok": False, "rejected": True}),
        [("cluster", "/v1/models rejected the API key", "qwen35-spark:api_key")],
    ),
]  # fmt: skip


@pytest.mark.parametrize(("case", "change", "expected"), CASES, ids=[c[0] for c in CASES])
def test_verdict(config, case, change, expected):
    verdict = judge(config, broken(change))
    assert verdict.ok == (not expected)
    assert len(verdict.problems) == len(expected), [p.line() for p in verdict.problems]
    for problem, (node, what, next_step) in zip(verdict.problems, expected, strict=True):
        assert problem.node == node
        assert what in problem.what, problem.what
        assert next_step in problem.next, problem.next


def with_strategy(config, strategy: str):
    from components.config import ImageStrategy

    image = config.image.model_copy(update={"strategy": ImageStrategy(strategy)})
    return config.model_copy(update={"image": image})


def image_gone(*nodes):
    def change(gathered):
        for node in nodes:
            gathered["nodes"][node]["image"] = {"ref": "vllm-node:latest", "present": False, "error": ""}

    return change


# The image missing: the next step fits where it comes from. A prebuilt image is the operator's to
# put on the head (`pulumi up` stops with "source … is not there"); a hybrid one `pulumi up` builds.
# A worker's copy comes from the head: while the head has none, the head's step comes first.
IMAGE_MISSING = [
    ("prebuilt, head", "prebuilt", ["node-a"],
     [("node-a", "docker pull vllm-node:latest", "copies it back")]),
    ("hybrid, head", "hybrid", ["node-a"], [("node-a", "`pulumi up` builds it", "docker pull")]),
    ("prebuilt, worker", "prebuilt", ["node-b"], [("node-b", "copies it back", "docker pull")]),
    ("prebuilt, nothing deployed", "prebuilt", ["node-a", "node-b"],
     [("node-a", "docker pull vllm-node:latest", "copies it back"),
      ("node-b", "once the head has it", "docker pull")]),
    ("hybrid, nothing deployed", "hybrid", ["node-a", "node-b"],
     [("node-a", "`pulumi up` builds it", "copies it back"),
      ("node-b", "once the head has it", "docker pull")]),
]  # fmt: skip


@pytest.mark.parametrize(
    ("case", "strategy", "gone", "expected"), IMAGE_MISSING, ids=[c[0] for c in IMAGE_MISSING]
)
def test_a_missing_image_gets_the_step_of_its_strategy(config, case, strategy, gone, expected):
    verdict = judge(with_strategy(config, strategy), broken(image_gone(*gone)))
    image_problems = [p for p in verdict.problems if "deployment image" in p.what]
    assert len(image_problems) == len(expected), [p.line() for p in verdict.problems]
    for problem, (node, says, never) in zip(image_problems, expected, strict=True):
        assert problem.node == node and says in problem.next and never not in problem.next, problem.line()


def test_ray_settling_is_shown_in_the_cell(config):
    gathered = broken(_set((*A, "ray"), {"status": RAY_ONE, "nodes_json": NODES_JSON_GPUS, "error": ""}))
    cell = judge(config, gathered).cluster["ray"]
    assert cell.startswith("2/2 nodes, 2/2 GPUs") and "settling" in cell and "1/2 nodes" in cell, cell


def test_healthy_cells(config):
    verdict = judge(config, healthy())
    assert verdict.nodes["node-b"] == {
        "role": "worker",
        "ssh": "ok",
        "docker": "20.10.24 classic",
        "image": "111111111111 = head",
        "containers": "qwen35-ray-worker running 1m15s; qwen35-health-agent running 1m15s",
        "gpus": "no nvidia-smi",
        "checkpoint": "dddddddddddd (3 files) = head",
    }
    assert verdict.cluster == {
        "ray": "2/2 nodes, 2/2 GPUs",
        "health": "ok",
        "models": "ok",
        "completion": "0.25 s, 5 tokens, 20.0 tokens/s",
        # The lab's stand-in checkpoint has no attention sizes in its config.json.
        "concurrency": "expected: unknown",
        "watchdog": "healthy (mode report, budget 3/3 left)",
    }


def test_concurrency_expected_from_the_head_s_config_beside_what_vllm_logged():
    from tests.support.program import config_from

    dev = config_from()
    fixture = Path(__file__).resolve().parents[2] / "patches" / "proof_configs" / "qwen3_5_moe-fp8"
    sizing = {"config": json.loads((fixture / "config.json").read_text()), "weight_bytes": 126 * 10**9}
    head = {
        "reachable": True,
        "sizing": sizing,
        "server_concurrency": {"max_model_len": 32768, "max_concurrency": 150.2},
    }
    verdict = judge(dev, {"nodes": {"spark-1": head}, "server": {}})
    # The model-support check's own figure for the recipe on two Sparks (model_support/memory_fit.py).
    expected = serving.expected_concurrency(dev, sizing)
    assert expected[0] == 32768 and 150 < expected[1] < 200
    assert verdict.cluster["concurrency"] == (
        f"expected {expected[1]:.2f}x at 32768 tokens; vLLM logged 150.20x at 32768 tokens"
    )


def test_gpus_are_required_where_the_gpu_runtime_is(config):
    gpu_config = config.model_copy(
        update={"containers": config.containers.model_copy(update={"gpu_runtime": True})}
    )
    gathered = healthy()
    gathered["nodes"]["node-a"]["gpus"] = {"tool": True, "count": 1, "names": ["NVIDIA GB10"]}
    verdict = judge(gpu_config, gathered)
    assert verdict.nodes["node-a"]["gpus"] == "1/1"
    assert [(p.node, p.what) for p in verdict.problems] == [
        ("node-b", "no `nvidia-smi` on the node; the stack declares 1 GPU(s)")
    ]


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [(None, "?"), (0, "0s"), (59, "59s"), (60, "1m00s"), (3599, "59m59s"), (3600, "1h00m"), (90061, "1d01h")],
)
def test_duration(seconds, shown):
    assert duration(seconds) == shown


@pytest.mark.parametrize(
    ("header", "rows", "text"),
    [
        (("a", "bb"), [], "a  bb\n-  --"),
        (("node", "ssh"), [("node-a", "ok"), ("b", "unreachable")],
         "node    ssh\n------  -----------\nnode-a  ok\nb       unreachable"),
    ],
)  # fmt: skip
def test_table(header, rows, text):
    assert render.table(header, rows) == text


def test_text_of_a_healthy_cluster(config):
    out = render.text(judge(config, healthy()), "lab")
    assert out.startswith("stack lab\n\nnode    role    ssh  docker")
    assert "node-b  worker  ok   20.10.24 classic  111111111111 = head" in out
    assert "completion   0.25 s, 5 tokens, 20.0 tokens/s" in out
    assert "concurrency  expected: unknown" in out
    assert out.endswith("everything is as declared\n")


def test_text_lists_each_problem_with_its_next_step(config):
    gathered = broken(_set(("nodes", "node-b"), {"reachable": False, "error": "Connection refused"}))
    out = render.text(judge(config, gathered), "lab")
    assert "node-b  worker  unreachable  -" in out
    assert (
        "1 problem(s):\nnode-b: not reachable over SSH: Connection refused\n  next: the node or its jump"
        in out
    )


@pytest.mark.parametrize(
    ("operation", "row"),
    [
        ({"operation": "image-copy", "on": "node-a", "peer": "node-b", "stage": "send", "bytes_done": 5e8,
          "bytes_total": 2e9, "rate_bps": 2.5e8, "eta_s": 6.0, "alive": True, "stale": False},
         ["image-copy", "node-a -> node-b", "send", "500.0/2000.0 MB 250.0 MB/s eta 6 s", "running"]),
        ({"operation": "readiness", "on": "node-a", "stage": "waiting at 'ray'", "alive": True, "stale": True,
          "age_s": 300.0},
         ["readiness", "node-a", "waiting at 'ray'", "", "no update for 300.0 s"]),
        ({"operation": "checkpoint-fetch", "on": "node-a", "stage": "fetch", "alive": False, "stale": True},
         ["checkpoint-fetch", "node-a", "fetch", "", "ended (writer gone)"]),
    ],
)  # fmt: skip
def test_operation_rows(operation, row):
    assert render._operation(operation) == row


def test_json_carries_verdict_and_facts_without_secrets(config):
    gathered = healthy()
    document = json.loads(render.as_json(judge(config, gathered), "lab", gathered))
    assert document["ok"] is True and document["problems"] == []
    assert document["facts"]["nodes"]["node-b"]["image"]["layers"] == LAYERS
    gathered = broken(_set((*B, "containers", "qwen35-ray-worker"), {"present": False}))
    document = json.loads(render.as_json(judge(config, gathered), "lab", gathered))
    assert document["problems"][0]["node"] == "node-b"


def test_node_requests_name_the_declared_things_and_no_secret(config):
    requests = gather.node_requests(config)
    assert requests["node-a"]["containers"] == ["qwen35-ray-head", "qwen35-vllm", "qwen35-watchdog"]
    assert requests["node-a"]["ray_container"] == "qwen35-ray-head"
    # The head reads its watchdog's /state on the address it listens on (the fabric's).
    assert requests["node-a"]["watchdog_url"] == "http://127.0.0.2:29592/state"
    assert requests["node-b"] == {
        "image": gather.deployment_image(config),
        "containers": ["qwen35-ray-worker", "qwen35-health-agent"],
        "hf_cache": "/run/qwen35-lab/node-b/hf-cache",  # model.cache_dirs: its own
        "model": "lab/standin-qwen35",
        "revision": "main",
        "ray_container": None,
        "progress_dir": "~/.qwen35/progress",
        "sizing": False,
        "server_container": None,
        "watchdog_url": None,
    }
    assert gather.deployment_image(config).startswith("lab-vllm-qwen35:h-")


def test_api_key_from_the_cli_where_it_exists_else_the_environment(tmp_path):
    # QWEN35_CACHE: where no CLI was built (else `make engine`'s would be asked).
    env = {"QWEN35_API_KEY": "sk-env", "QWEN35_CACHE": str(tmp_path)}
    assert gather.api_key("lab", env={"QWEN35_CACHE": str(tmp_path)}, which=lambda _: None) == (None, "")
    assert gather.api_key("lab", env=env, which=lambda _: None) == ("sk-env", "$QWEN35_API_KEY")
    cli = tmp_path / "pulumi"
    # argv: config get --show-secrets KEY --stack STACK
    cli.write_text('#!/bin/sh\n[ "$4" = qwen35-spark:api_key ] && [ "$6" = lab ] && echo sk-cli\n')
    cli.chmod(0o755)
    assert gather.api_key("lab", env=env, which=lambda _: str(cli)) == ("sk-cli", "pulumi config")
    # A stack without the secret: the CLI prints nothing; the environment still counts.
    assert gather.api_key("dev", env=env, which=lambda _: str(cli)) == ("sk-env", "$QWEN35_API_KEY")


def test_problem_line():
    assert Problem("node-b", "x", "y").line() == "node-b: x\n  next: y"


# ---- the node program, run here on a temporary Hugging Face cache ----------------------------------


def make_cache(root, files, commit="c" * 40):
    """A Hub cache layout: blobs named by hash, snapshot links ../../blobs/<hash>, refs/main."""
    repo = root / "hub" / "models--org--model"
    (repo / "blobs").mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    snapshot = repo / "snapshots" / commit
    for rel, content in files.items():
        blob = f"{abs(hash(content)):x}".rjust(40, "0")
        (repo / "blobs" / blob).write_bytes(content)
        link = snapshot / rel
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(repo / "blobs" / blob, link.parent))
    return repo


FILES = {"config.json": b"{}", "model-00001.safetensors": b"x" * 100, "sub/tokenizer.json": b"t"}


def test_checkpoint_facts_of_a_complete_cache(tmp_path):
    repo = make_cache(tmp_path, FILES)
    found = node_status.checkpoint_facts(str(tmp_path), "org/model")
    assert found["present"] and found["missing_count"] == 0
    assert (found["path"], found["revision"], found["files"], found["bytes"]) == (str(repo), "c" * 40, 3, 103)
    # The same files in another cache: the same digest.
    other = tmp_path / "other"
    make_cache(other, FILES)
    assert node_status.checkpoint_facts(str(other), "org/model")["digest"] == found["digest"]


def test_checkpoint_facts_name_a_missing_file_and_change_the_digest(tmp_path):
    repo = make_cache(tmp_path, FILES)
    whole = node_status.checkpoint_facts(str(tmp_path), "org/model")["digest"]
    target = (repo / "snapshots" / ("c" * 40) / "model-00001.safetensors").resolve()
    target.unlink()
    found = node_status.checkpoint_facts(str(tmp_path), "org/model")
    assert not found["present"]
    assert (found["missing"], found["missing_count"]) == (["model-00001.safetensors"], 1)
    assert found["digest"] != whole


def test_checkpoint_facts_without_the_model(tmp_path):
    found = node_status.checkpoint_facts(str(tmp_path), "org/model")
    assert not found["present"] and "no snapshot for 'main'" in found["error"]


def test_manifest_digest_is_order_free():
    pairs = [("b", "2"), ("a", "1")]
    assert node_status.manifest_digest(pairs) == node_status.manifest_digest(reversed(pairs))
    assert node_status.manifest_digest(pairs) != node_status.manifest_digest([("a", "1"), ("b", "3")])


def test_progress_facts(tmp_path):
    now = time.time()
    records = {
        "image-copy.json": {"operation": "image-copy", "pid": os.getpid(), "updated_at": now - 1},
        "old.json": {"operation": "checkpoint-fetch", "pid": 2**22 + 12345, "updated_at": now - 999},
    }
    for name, record in records.items():
        (tmp_path / name).write_text(json.dumps(record))
    (tmp_path / "torn.json").write_text("{")
    found = {r["operation"]: r for r in node_status.progress_facts(str(tmp_path), now)}
    assert set(found) == {"image-copy", "checkpoint-fetch"}
    assert (found["image-copy"]["alive"], found["image-copy"]["stale"]) == (True, False)
    assert (found["checkpoint-fetch"]["alive"], found["checkpoint-fetch"]["stale"]) == (False, True)
    assert node_status.progress_facts(str(tmp_path / "none"), now) == []


def test_node_program_runs_as_shipped_and_reports_without_docker(tmp_path):
    import subprocess

    make_cache(tmp_path, FILES)
    request = {"image": "x:y", "containers": ["c"], "hf_cache": str(tmp_path), "model": "org/model",
               "progress_dir": str(tmp_path / "p")}  # fmt: skip
    env = {"PATH": str(tmp_path / "bin"), "HOME": str(tmp_path)}  # no docker, no nvidia-smi here
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "python3").symlink_to(os.path.realpath("/usr/bin/python3"))
    done = subprocess.run(
        gather.NODE_PROGRAM_ARGV,
        input=json.dumps(request).encode(),
        capture_output=True,
        env=env,
        check=True,
    )
    report = json.loads(done.stdout)
    assert report["docker"] == {"ok": False, "error": "docker: not installed"}
    assert report["checkpoint"]["present"] and report["gpus"]["tool"] is False
    assert "image" not in report and report["progress"] == []


def test_container_uptime_parses_dockers_time():
    now = 1_700_000_100.0
    assert node_status._seconds_since("2023-11-14T22:13:20.123456789Z", now) == 100
    assert node_status._seconds_since("0001-01-01T00:00:00Z", now) is None


def test_copy_of_healthy_facts_is_independent():
    assert copy.deepcopy(healthy()) == healthy()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (None, "cannot be read"),
        ("config: [", "not YAML"),
        ("config:\n  qwen35-spark:nodes: [{name: Bad_Name, host: h, fabric_ip: 1.2.3.4}]\n"
         "  qwen35-spark:ssh: {known_hosts: /k}\n", "nodes.0.name: 'Bad_Name'"),
    ],
    ids=["missing", "not-yaml", "invalid"],
)  # fmt: skip
def test_a_bad_stack_file_exits_2_naming_the_problem(tmp_path, capsys, text, message):
    from status.__main__ import main

    path = tmp_path / "Pulumi.x.yaml"
    if text is not None:
        path.write_text(text)
    assert main(["--file", str(path)]) == 2
    assert message in capsys.readouterr().err


def test_a_node_that_never_answers_costs_its_connect_timeout(tmp_path):
    """A listener that accepts and says nothing (a hung node): ssh gives up at ConnectTimeout."""
    import socket

    from components.remote import SshTarget, SshTransport

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    try:
        target = SshTarget("127.0.0.1", "root", str(tmp_path / "kh"), port=listener.getsockname()[1],
                           connect_timeout=1)  # fmt: skip
        report = gather.ask_node(SshTransport(target), {"image": "x"}, timeout=30)
    finally:
        listener.close()
    assert report["reachable"] is False
    # ssh's own reason (its ConnectTimeout), not the transport's 30 s deadline ("timed out after 30 s").
    assert "Connection timed out" in report["error"], report


def test_the_head_reports_what_vllm_logged_about_its_kv_cache(monkeypatch):
    logs = (
        "INFO 12-01 [kv_cache_utils.py:1291] GPU KV cache size: 1,234,567 tokens\n"
        "INFO 12-01 [kv_cache_utils.py:1296] Maximum concurrency for 32,768 tokens per request: 37.68x\n"
    )
    monkeypatch.setattr(node_status, "run", lambda argv, timeout=0: (0, "", logs))
    assert node_status.server_concurrency("qwen35-vllm") == {"max_model_len": 32768, "max_concurrency": 37.68}
    monkeypatch.setattr(node_status, "run", lambda argv, timeout=0: (0, "starting\n", ""))
    assert node_status.server_concurrency("qwen35-vllm") == {}


def test_the_head_sends_its_snapshot_s_config_and_weight_total(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"text_config": {"num_hidden_layers": 48}}))
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": 7}}))
    assert node_status.sizing_facts(str(tmp_path)) == {
        "config": {"text_config": {"num_hidden_layers": 48}},
        "weight_bytes": 7,
    }
    assert "error" in node_status.sizing_facts(str(tmp_path / "missing"))


def test_previous_images_are_the_kept_records_of_the_image_s_repository(tmp_path):
    """image.keep_previous: a node's kept images are NodeImage's tag records marked retained, of the
    deployment image's repository, newest first; held tags and other repositories are not."""
    records = {
        "app:1": {"ref": "app:1", "holders": [], "retained_at": 10.0},
        "app:2": {"ref": "app:2", "holders": [], "retained_at": 20.0},
        "app:3": {"ref": "app:3", "holders": ["c3"]},
        "other:1": {"ref": "other:1", "holders": [], "retained_at": 30.0},
    }
    for ref, record in records.items():
        (tmp_path / f"{ref.replace(':', '%3A')}.json").write_text(json.dumps(record))
    assert node_status.previous_images("app:3", str(tmp_path)) == ["app:2", "app:1"]
    assert node_status.previous_images("app:3", str(tmp_path / "none")) == []


def test_status_shows_keep_previous_and_what_each_node_keeps(config):
    facts_ = healthy()
    facts_["nodes"]["node-b"]["image"]["previous"] = ["app:0"]
    verdict = judge(config, facts_)
    assert verdict.retention == {"keep_previous": 1, "previous": {"node-a": [], "node-b": ["app:0"]}}
    assert verdict.as_dict()["retention"] == verdict.retention
    text = render.text(verdict, "lab")
    assert "previous images kept (image.keep_previous 1): node-a -; node-b app:0" in text


def lab_mp_config():
    """The lab stack under cluster.executor mp (its Ray settings removed)."""
    raw = {k.split(":", 1)[1]: v for k, v in stack_config("lab").items()}
    raw.pop("ray")
    for node in raw["nodes"]:
        node.pop("ray_ports")
    raw["cluster"] = {"executor": "mp"}
    return parse_stack_config(raw)


def test_under_executor_mp_status_asks_for_each_node_s_rank_and_no_ray():
    cfg = lab_mp_config()
    requests = gather.node_requests(cfg)
    assert requests["node-a"]["containers"] == ["qwen35-vllm", "qwen35-watchdog"]
    assert requests["node-a"]["ray_container"] is None
    assert requests["node-b"]["containers"] == ["qwen35-vllm-rank1", "qwen35-health-agent"]
    gathered = healthy()
    head = node_report(["qwen35-vllm", "qwen35-watchdog"])
    head["watchdog"] = {"state": dict(WATCHDOG_HEALTHY)}
    gathered["nodes"] = {"node-a": head, "node-b": node_report(["qwen35-vllm-rank1", "qwen35-health-agent"])}
    verdict = judge(cfg, gathered)
    assert verdict.cluster["ray"].startswith("none (cluster.executor mp")
    assert not verdict.problems, verdict.problems
    gathered["nodes"]["node-b"]["containers"]["qwen35-vllm-rank1"] = {"present": False}
    assert [p.node for p in judge(cfg, gathered).problems] == ["node-b"]


def test_under_executor_mp_status_shows_each_node_s_rank_as_its_container_runs_it():
    cfg = lab_mp_config()
    gathered = healthy()
    head = node_report(["qwen35-vllm", "qwen35-watchdog"])
    head["watchdog"] = {"state": dict(WATCHDOG_HEALTHY)}
    gathered["nodes"] = {"node-a": head, "node-b": node_report(["qwen35-vllm-rank1", "qwen35-health-agent"])}
    gathered["nodes"]["node-a"]["containers"]["qwen35-vllm"]["node_rank"] = "0"
    gathered["nodes"]["node-b"]["containers"]["qwen35-vllm-rank1"]["node_rank"] = "1"
    verdict = judge(cfg, gathered)
    assert verdict.nodes["node-a"]["rank"] == "0 (serves the API)"
    assert verdict.nodes["node-b"]["rank"] == "1 (headless)"
    text = render.text(verdict, "lab")
    header = text.splitlines()[2]
    assert header.split()[-1] == "rank", header
    assert "qwen35-vllm-rank1 running 1m15s; qwen35-health-agent running 1m15s  1 (headless)" in text, text
    # A container that runs another rank than the stack gives its node: the world cannot form.
    gathered["nodes"]["node-b"]["containers"]["qwen35-vllm-rank1"]["node_rank"] = "2"
    verdict = judge(cfg, gathered)
    assert verdict.nodes["node-b"]["rank"] == "2 (declared 1)"
    (problem,) = verdict.problems
    assert problem.node == "node-b" and "runs --node-rank 2" in problem.what and "rank 1" in problem.what
    assert "pulumi up --refresh" in problem.next


def test_a_ray_stack_has_no_rank_column(config):
    verdict = judge(config, healthy())
    assert all("rank" not in cells for cells in verdict.nodes.values())
    assert "rank" not in render.text(verdict, "lab").splitlines()[2].split()


@pytest.mark.parametrize(
    "args, rank",
    [
        (["serve", "m", "--nnodes", "2", "--node-rank", "1", "--headless"], "1"),
        (["serve", "m", "--node-rank=3"], "3"),
        (["start", "--head", "--block"], None),
        (["serve", "m", "--node-rank"], None),
        (None, None),
    ],
)
def test_the_node_program_reads_the_rank_from_the_container_s_args(args, rank):
    assert node_status.node_rank(args) == rank


def test_under_the_cpu_platform_concurrency_says_what_sizes_the_kv_cache():
    from engine.lab_stack import real_engine_config

    raw = real_engine_config("lab-vllm-cpu:t", "http://127.0.0.1:1")
    lab = parse_stack_config({k.split(":", 1)[1]: v for k, v in raw.items()})
    fixture = Path(__file__).resolve().parents[2] / "patches" / "proof_configs" / "qwen3_5_moe-fp8"
    sizing = {"config": json.loads((fixture / "config.json").read_text()), "weight_bytes": 10**9}
    # The memory fit does give a figure here (the lab's `566974.07x at 512 tokens`): one that means
    # nothing, as VLLM_CPU_KVCACHE_SPACE, not a share of the nodes' memory, sizes the CPU KV cache.
    assert serving.expected_concurrency(lab, sizing) is not None
    head = {
        "reachable": True,
        "sizing": sizing,
        "server_concurrency": {"max_model_len": 512, "max_concurrency": 2048.0},
    }
    verdict = judge(lab, {"nodes": {"node-a": head}, "server": {}})
    assert verdict.cluster["concurrency"] == (
        f"expected: as the KV cache serve.cpu.kvcache_space_gb gives ({lab.serve.cpu.kvcache_space_gb} GiB "
        "per rank; the memory fit does not apply); vLLM logged 2048.00x at 512 tokens"
    )
