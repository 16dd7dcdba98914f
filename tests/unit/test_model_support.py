"""The model-support check's provider without a node: the command it runs, how the proof program is
shipped (run here for real with `python3 -`), what it makes of each report, and that diff, check and
read never touch a node."""

from __future__ import annotations

import base64
import json
import os
import re
import struct
import subprocess
import sys
from pathlib import Path

import pulumi
import pytest
from pulumi.runtime.rpc import UNKNOWN

from components import model_support, nodes
from components.model_support import (
    CONTAINER_REPO,
    ModelSupportCheckProvider,
    ModelSupportError,
    checkpoint_mount,
    execute,
    proof_argv,
    proof_payload,
    proof_source,
)
from components.model_support.errors import MemoryFitError
from components.model_support.memory_fit import GB
from components.remote import LocalTransport, Result

IMAGE_ID = "sha256:" + "ab" * 32
PIN = "sha256:" + "cd" * 32
NODE = {"name": "spark-1", "host": "10.1.230.180", "port": 22, "user": "aurora", "known_hosts": "/k"}
MEMORY = {
    "nodes": [
        {"name": "spark-1", "memory_gb": 128.0, "gpus": 1},
        {"name": "spark-2", "memory_gb": 128.0, "gpus": 1},
    ],
    "tensor_parallel_size": 2,
    "pipeline_parallel_size": 1,
    "gpu_memory_utilization": 0.85,
}
PASS_REPORT = {
    "verdict": "pass",
    "failed_stage": None,
    "error": "",
    "where": "",
    "vllm": "0.17.1",
    "transformers": "4.57.6",
    "torch": "2.9.1",
    "architecture": "Qwen3_5MoeForConditionalGeneration",
    "model_type": "qwen3_5_moe",
    "quantization": {"quant_method": "fp8", "weight_block_size": [128, 128]},
    "checks": [],
}
ARGS_PASS = {"verdict": "pass", "failed_stage": None, "flag": None, "error": "", "vllm": "0.17.1"}
CONSTRUCT_FAIL = {
    **PASS_REPORT,
    "verdict": "fail",
    "failed_stage": "construct",
    "error": "AttributeError: 'Qwen3_5MoeForConditionalGeneration' object has no attribute "
    "'_mark_tower_model'",
    "where": "vllm/model_executor/models/qwen3_5.py:412",
    "vllm": "0.14.0",
    "transformers": "4.57.6",
}


def props(**changes) -> dict:
    base = {
        "node": NODE,
        "image": "vllm-node:latest",
        "image_id": IMAGE_ID,
        "memory": MEMORY,
        "mode": "enforce",
        "checkpoint_digest": None,
        "snapshot_path": None,
        "container_prefix": "qwen35",
        "deadline_s": 900,
    }
    return {**base, **changes}


# ---- the stand-in proof program (a double of patches/prove_model.py's contract, for these tests) ------

STANDIN_PROGRAM = """
import json, os, sys, time
here = os.path.dirname(os.path.abspath(__file__))
args = sys.argv[1:]
if "--sleep" in args:
    time.sleep(30)
fixtures = sorted(os.listdir(os.path.join(here, "proof_configs")))
verdict = os.environ.get("STANDIN_VERDICT", "pass")
print("some log line before the report")
print(json.dumps({"verdict": verdict, "failed_stage": None if verdict == "pass" else "config",
                  "error": "", "argv": args, "fixtures": fixtures, "program": os.path.basename(__file__)}))
sys.exit(0 if verdict == "pass" else 1)
"""


@pytest.fixture
def proof_dir(tmp_path) -> Path:
    (tmp_path / "prove_model.py").write_text(STANDIN_PROGRAM)
    (tmp_path / "prove_args.py").write_text("raise SystemExit('scripted by FakeHead in these tests')")
    (tmp_path / "proof_configs").mkdir()
    (tmp_path / "proof_configs" / "qwen3_5_moe.json").write_text("{}")
    (tmp_path / "proof_configs" / "qwen3_5.json").write_text("{}")
    return tmp_path


def run_shipped(source: bytes, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """What the container does with its stdin: `python3 - ARGS`, here on this machine."""
    return subprocess.run(
        [sys.executable, "-", *args],
        input=source,
        capture_output=True,
        timeout=60,
        env={**os.environ, **(env or {})},
        cwd="/",
    )


def test_the_shipped_program_runs_with_its_configs_and_arguments(proof_dir):
    done = run_shipped(proof_source(proof_payload(proof_dir), 60), "--checkpoint", "/x/snapshots/abc")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.decode().strip().splitlines()[-1])
    assert report["argv"] == ["--checkpoint", "/x/snapshots/abc"]
    assert report["fixtures"] == ["qwen3_5.json", "qwen3_5_moe.json"]
    assert report["program"] == "prove_model.py"
    assert b"Warning" not in done.stderr


def test_the_shipped_programs_exit_status_is_the_containers(proof_dir):
    done = run_shipped(proof_source(proof_payload(proof_dir), 60), env={"STANDIN_VERDICT": "fail"})
    assert done.returncode == 1
    assert json.loads(done.stdout.decode().strip().splitlines()[-1])["verdict"] == "fail"


def test_the_bootstrap_stops_a_proof_past_its_deadline(proof_dir):
    done = run_shipped(proof_source(proof_payload(proof_dir), 1), "--sleep")
    assert done.returncode == model_support.ProofExit.DEADLINE


def test_payload_is_stable_and_a_missing_program_is_named(proof_dir, tmp_path):
    assert proof_payload(proof_dir) == proof_payload(proof_dir)
    # No time in the gzip header (bytes 4-8), or two calls a second apart differ.
    assert base64.b64decode(proof_payload(proof_dir))[4:8] == bytes(4)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ModelSupportError, match="prove_model.py is missing"):
        proof_payload(empty)


# ---- the command -------------------------------------------------------------------------------------


def test_proof_runs_offline_without_network_in_a_throwaway_container():
    argv = proof_argv(props(), "qwen35-model-support-1234")
    assert argv[:4] == ["docker", "run", "--rm", "-i"]
    assert argv[argv.index("--network") + 1] == "none"
    envs = [argv[i + 1] for i, a in enumerate(argv) if a == "--env"]
    assert "HF_HUB_OFFLINE=1" in envs
    assert argv[argv.index("--entrypoint") + 1] == "python3"
    # The image by ID, the program on stdin, no checkpoint: the fixture configs.
    assert argv[-2:] == [IMAGE_ID, "-"]
    assert "--volume" not in argv
    assert not any("token" in a.lower() for a in argv)


def test_the_checkpoints_repo_folder_is_mounted_read_only():
    snapshot = "/home/aurora/.cache/huggingface/hub/models--Qwen--Qwen3.5-122B-A10B-FP8/snapshots/0123abc"
    argv = proof_argv(props(snapshot_path=snapshot), "x")
    volume = argv[argv.index("--volume") + 1]
    assert (
        volume
        == f"/home/aurora/.cache/huggingface/hub/models--Qwen--Qwen3.5-122B-A10B-FP8:{CONTAINER_REPO}:ro"
    )
    assert argv[-4:] == [IMAGE_ID, "-", "--checkpoint", f"{CONTAINER_REPO}/snapshots/0123abc"]
    # The behaviour proof also reads every shard's header; the argument proof's argv has no such flag.
    shards = proof_argv(props(snapshot_path=snapshot), "x", shards=True)
    assert shards[-5:] == [IMAGE_ID, "-", "--checkpoint", f"{CONTAINER_REPO}/snapshots/0123abc", "--shards"]


@pytest.mark.parametrize(
    ("snapshot", "host", "inside"),
    [
        ("/c/hub/models--a--b/snapshots/s1", "/c/hub/models--a--b", f"{CONTAINER_REPO}/snapshots/s1"),
        ("/models/qwen", "/models/qwen", CONTAINER_REPO),  # a plain folder of files
        ("/c/snapshots/s1", "/c/snapshots/s1", CONTAINER_REPO),  # not a HF repo folder
    ],
)
def test_checkpoint_mount(snapshot, host, inside):
    assert checkpoint_mount(snapshot) == (host, inside)


# ---- the head, scripted ------------------------------------------------------------------------------


class FakeHead:
    """The head: `python3 -` programs really run here (LocalTransport); docker answers are scripted."""

    def __init__(
        self,
        run_result: Result | None = None,
        repo_digests: list[str] | None = None,
        args_result: Result | None = None,
    ):
        self.calls: list[list[str]] = []
        self.run_result = run_result or Result((), 0, (json.dumps(PASS_REPORT) + "\n").encode())
        self.args_result = args_result or Result((), 0, (json.dumps(ARGS_PASS) + "\n").encode())
        self.repo_digests = repo_digests or []
        self.name = "spark-1"

    def __call__(self, _target):
        return self

    def run(self, argv, stdin=None, timeout=None) -> Result:
        self.calls.append(list(argv))
        if argv[:2] == ["python3", "-"]:
            local = LocalTransport("spark-1").run([sys.executable, *argv[1:]], stdin=stdin, timeout=timeout)
            return Result(tuple(argv), local.returncode, local.stdout, local.stderr, "spark-1")
        if argv[:3] == ["docker", "image", "inspect"]:
            return Result(tuple(argv), 0, json.dumps(self.repo_digests).encode(), b"", "spark-1")
        if argv[:2] == ["docker", "run"]:
            # The argument proof's run carries the server's argv after `--`, each headless rank's
            # before it (`--rank NODE ARGV_JSON`): their reports go under `ranks`.
            if "--" not in argv:
                scripted = self.run_result
                return Result(tuple(argv), scripted.returncode, scripted.stdout, scripted.stderr, "spark-1")
            return self.args_run(argv)
        raise AssertionError(f"unexpected command {argv}")

    def args_run(self, argv) -> Result:
        scripted = self.args_result
        ranks = {argv[i + 1]: json.loads(argv[i + 2]) for i, word in enumerate(argv) if word == "--rank"}
        lines = scripted.stdout.decode().splitlines()
        if not ranks or not lines or not lines[-1].startswith("{"):
            return Result(tuple(argv), scripted.returncode, scripted.stdout, scripted.stderr, "spark-1")
        report = {
            **json.loads(lines[-1]),
            "ranks": {node: self.rank_report(rank) for node, rank in ranks.items()},
        }
        verdicts = [report["verdict"], *(r["verdict"] for r in report["ranks"].values())]
        code = 0 if all(v == "pass" for v in verdicts) else 1
        stdout = "\n".join([*lines[:-1], json.dumps(report)]).encode() + b"\n"
        return Result(tuple(argv), code, stdout, scripted.stderr, "spark-1")

    def rank_report(self, _argv) -> dict:
        return ARGS_PASS

    def docker_runs(self) -> int:
        return sum(1 for call in self.calls if call[:2] == ["docker", "run"])


def head(monkeypatch, **kwargs) -> FakeHead:
    fake = FakeHead(**kwargs)
    monkeypatch.setattr(nodes, "SshTransport", fake)
    return fake


def report_result(report: dict, code: int) -> Result:
    return Result((), code, (f"loading...\n{json.dumps(report)}\n").encode(), b"some stderr")


def test_a_passing_proof_gives_the_report_fields(monkeypatch, proof_dir):
    fake = head(monkeypatch)
    outs = execute.ensure(props(), proof_dir=proof_dir)
    assert outs["verdict"] == "pass" and outs["vllm"] == "0.17.1"
    assert (
        outs["architecture"] == "Qwen3_5MoeForConditionalGeneration" and outs["model_type"] == "qwen3_5_moe"
    )
    assert outs["quantization"]["quant_method"] == "fp8"
    # No checkpoint declared: no memory fit, no facts read, only the proof.
    assert outs["memory_fit"] is None
    assert fake.docker_runs() == 1 and len(fake.calls) == 1


def test_a_failed_proof_stops_up_naming_stage_error_image_and_vllm(monkeypatch, proof_dir):
    fake = head(monkeypatch, run_result=report_result(CONSTRUCT_FAIL, 1))
    with pytest.raises(ModelSupportError) as info:
        execute.ensure(props(), proof_dir=proof_dir)
    message = str(info.value)
    for part in (
        "spark-1",
        "stage 'construct'",
        "_mark_tower_model",
        "qwen3_5.py:412",
        "vllm-node:latest",
        IMAGE_ID[:19],
        "vLLM 0.14.0",
        "next: ",
        "prebuilt",
    ):
        assert part in message, f"{part!r} not in:\n{message}"
    assert fake.docker_runs() == 1


def failed(stage, error, vllm="0.17.1", transformers="4.57.6", **more) -> dict:
    return {**PASS_REPORT, "verdict": "fail", "failed_stage": stage, "error": error, "vllm": vllm,
            "transformers": transformers, **more}  # fmt: skip


# The next step follows from what failed: the image's vLLM, its transformers, the checkpoint, the stack
# config, or the check's own call. Each row: the report, what the hint says, what it must not say.
NEXT_STEPS = [
    pytest.param(
        failed("environment", "ModuleNotFoundError: No module named 'vllm'", vllm=None),
        ["has no vLLM", ">= 0.17", "image.prebuilt"],
        [],
        id="environment-no-vllm",
    ),
    pytest.param(
        failed("environment", "ModuleNotFoundError: No module named 'torch'", vllm="0.14.0"),
        ["vLLM 0.14.0", ">= 0.17"],
        [],
        id="environment-old-vllm",
    ),
    pytest.param(
        failed("environment", "ImportError: libcudart.so.13: cannot open shared object file"),
        ["vLLM 0.17.1", "does not import", "image"],
        [">= 0.17"],
        id="environment-new-vllm-broken-packages",
    ),
    pytest.param(
        failed("config", "TypeError: unsupported operand type(s) for |: 'list' and 'set'", "0.14.0", "5.2.0"),
        ["vLLM 0.14.0", ">= 0.17"],
        [],
        id="config-old-vllm",
    ),
    pytest.param(
        failed("config", "TypeError: unsupported operand type(s) for |: 'list' and 'set'", "0.17.1", "5.2.0"),
        ["transformers 5.2.0", "vLLM 0.17.1", "pin transformers"],
        [">= 0.17"],
        id="config-new-vllm-newer-transformers",
    ),
    pytest.param(
        failed("config", "JSONDecodeError: Expecting value: line 1 column 1 (char 0)"),
        ["vLLM 0.17.1", "checkpoint", "model.revision", "pulumi up --refresh"],
        [">= 0.17"],
        id="config-new-vllm-bad-checkpoint",
    ),
    pytest.param(
        failed(
            "config",
            "ValueError: unknown architecture 'LlamaForCausalLM': this proof derives tiny models for …",
            architecture="LlamaForCausalLM",
            model_type="llama",
        ),
        ["qwen35-spark:model.repo", "LlamaForCausalLM", "Qwen3.5"],
        [">= 0.17"],
        id="config-another-model-in-the-stack",
    ),
    pytest.param(
        CONSTRUCT_FAIL,
        ["vLLM 0.14.0", ">= 0.17", "image.strategy: prebuilt"],
        [],
        id="construct-old-vllm",
    ),
    pytest.param(
        failed("construct", "RuntimeError: FP8 block size 64 is not supported"),
        ["vLLM 0.17.1", "checkpoint", "qwen35-spark:model.repo"],
        [">= 0.17"],
        id="construct-new-vllm",
    ),
    pytest.param(
        failed("load", "KeyError: 2 parameter(s) not filled: model.layers.0.mlp.gate.weight, …"),
        ["vLLM 0.17.1", "checkpoint", "model.revision", "pulumi up --refresh"],
        [">= 0.17"],
        id="load-new-vllm-checkpoint-at-fault",
    ),
    pytest.param(
        failed("load", "KeyError: 2 parameter(s) not filled", vllm="0.16.0"),
        ["vLLM 0.16.0", ">= 0.17"],
        [],
        id="load-old-vllm",
    ),
    pytest.param(
        failed(None, "UsageError: --checkpoint /model/snap: model.safetensors.index.json has no weight_map"),
        ["checkpoint", "pulumi up --refresh", "model.revision"],
        ["stage 'unknown'", ">= 0.17"],
        id="usage-checkpoint",
    ),
    pytest.param(
        failed(
            None, "UsageError: --stages: load needs construct (the weights are loaded into the built model)"
        ),
        ["proof_argv", "report"],
        ["stage 'unknown'", ">= 0.17"],
        id="usage-call",
    ),
]


@pytest.mark.parametrize(("report", "says", "never"), NEXT_STEPS)
def test_the_next_step_names_what_failed(report, says, never):
    message = model_support.failure_message(props(), report)
    next_line = message.split("next: ", 1)[1]
    for part in says:
        assert part in next_line, f"{part!r} not in:\n{message}"
    for part in never:
        assert part not in message, f"{part!r} in:\n{message}"


def test_a_usage_error_is_named_as_one():
    report = failed(None, "UsageError: --fixtures /proof: no <name>/config.json under it")
    first = model_support.failure_message(props(), report).splitlines()[0]
    assert first.startswith("spark-1: the model-support check's proof refused its inputs (a usage error)")


def test_report_mode_records_the_failure_and_goes_on(monkeypatch, proof_dir):
    head(monkeypatch, run_result=report_result({**CONSTRUCT_FAIL, "failed_stage": "environment"}, 1))
    outs = execute.ensure(props(mode="report"), proof_dir=proof_dir)
    assert outs["verdict"] == "fail" and outs["failed_stage"] == "environment"


@pytest.mark.parametrize(
    ("code", "stdout", "expected"),
    [
        (125, b"", "docker could not start"),
        (127, b"", "no runnable python3"),
        (1, b"Traceback (most recent call last):\n  boom\n", "without a report (exit 1)"),
        (124, b"", "deadline"),
        (0, b'{"verdict": "fail"}\n', "exited 0 but reported 'fail'"),
        (0, b'{"something": 1}\n', "no verdict"),
    ],
)
def test_a_proof_without_a_sound_report_is_an_error(monkeypatch, proof_dir, code, stdout, expected):
    head(monkeypatch, run_result=Result((), code, stdout, b"docker: Error response from daemon"))
    with pytest.raises(ModelSupportError, match=re.escape(expected)):
        execute.ensure(props(mode="report"), proof_dir=proof_dir)


def hf_snapshot(root: Path, total_size: int | None, shard_bytes: list[int], layers: int = 48) -> Path:
    """A Hugging Face cache repo folder: blobs, a snapshot of relative links, an index and a config."""
    repo = root / "hub" / "models--Qwen--Qwen3.5-122B-A10B-FP8"
    blobs, snapshot = repo / "blobs", repo / "snapshots" / ("ab" * 20)
    blobs.mkdir(parents=True)
    snapshot.mkdir(parents=True)

    def put(name: str, data: bytes) -> None:
        blob = blobs / f"{abs(hash(name)):064x}"[:64]
        blob.write_bytes(data)
        (snapshot / name).symlink_to(os.path.relpath(blob, snapshot))

    config = {"architectures": ["Qwen3_5MoeForConditionalGeneration"], "model_type": "qwen3_5_moe"}
    config["text_config"] = {"num_hidden_layers": layers}
    put("config.json", json.dumps(config).encode())
    names = [f"model-{i:05d}-of-{len(shard_bytes):05d}.safetensors" for i in range(1, len(shard_bytes) + 1)]
    for name, size in zip(names, shard_bytes, strict=True):
        put(name, b"\0" * size)
    if total_size is not None:
        index = {
            "metadata": {"total_size": total_size},
            "weight_map": {f"w{i}": n for i, n in enumerate(names)},
        }
        put("model.safetensors.index.json", json.dumps(index).encode())
    return snapshot


def test_the_memory_fit_runs_before_any_container_and_stops_a_model_that_cannot_fit(
    monkeypatch, proof_dir, tmp_path
):
    fake = head(monkeypatch)
    snapshot = hf_snapshot(tmp_path, total_size=126 * GB, shard_bytes=[10, 20])
    one_node = {**MEMORY, "nodes": MEMORY["nodes"][:1], "tensor_parallel_size": 1}
    with pytest.raises(MemoryFitError) as info:
        execute.ensure(
            props(snapshot_path=str(snapshot), memory=one_node, checkpoint_digest="sha256:1"),
            proof_dir=proof_dir,
        )
    assert "126.0 GB of weights" in str(info.value) and "spark-1: needs 132.0 GB per GPU" in str(info.value)
    assert fake.docker_runs() == 0


def test_a_model_that_fits_reports_the_numbers(monkeypatch, proof_dir, tmp_path):
    fake = head(monkeypatch)
    snapshot = hf_snapshot(tmp_path, total_size=126 * GB, shard_bytes=[10, 20])
    outs = execute.ensure(
        props(snapshot_path=str(snapshot), checkpoint_digest="sha256:1"), proof_dir=proof_dir
    )
    fit = outs["memory_fit"]
    assert fit["fits"] is True and fit["weights_gb"] == 126.0 and fit["weights_from"] == "index"
    assert fit["layers"] == 48 and fit["per_rank"]["spark-2"]["weights_gb"] == 63.0
    assert fake.docker_runs() == 1


def test_without_an_index_the_shard_sizes_count(monkeypatch, proof_dir, tmp_path):
    head(monkeypatch)
    snapshot = hf_snapshot(tmp_path, total_size=None, shard_bytes=[1000, 2345])
    outs = execute.ensure(
        props(snapshot_path=str(snapshot), checkpoint_digest="sha256:1"), proof_dir=proof_dir
    )
    assert outs["memory_fit"]["weights_from"] == "shards"
    assert outs["memory_fit"]["weights_gb"] == round(3345 / GB, 1)


def test_a_snapshot_without_weights_is_named(monkeypatch, proof_dir, tmp_path):
    fake = head(monkeypatch)
    with pytest.raises(ModelSupportError, match="does-not-exist is not a directory"):
        execute.ensure(
            props(snapshot_path=str(tmp_path / "does-not-exist"), checkpoint_digest="x"), proof_dir=proof_dir
        )
    assert fake.docker_runs() == 0


def test_a_pinned_reference_must_match_the_heads_repo_digest(monkeypatch, proof_dir):
    pinned = f"nvcr.io/nvidia/vllm:26.03-py3@{PIN}"
    fake = head(monkeypatch, repo_digests=["nvcr.io/nvidia/vllm@sha256:" + "00" * 32])
    with pytest.raises(ModelSupportError) as info:
        execute.ensure(props(image=pinned), proof_dir=proof_dir)
    assert PIN in str(info.value) and "docker pull nvcr.io/nvidia/vllm@" in str(info.value)
    assert fake.docker_runs() == 0
    fake = head(monkeypatch, repo_digests=[f"nvcr.io/nvidia/vllm@{PIN}"])
    assert execute.ensure(props(image=pinned), proof_dir=proof_dir)["verdict"] == "pass"


# ---- diff, check, read, update: no I/O ----------------------------------------------------------------


@pytest.fixture
def no_io(monkeypatch):
    def refuse(*_args, **_kwargs):
        raise AssertionError("the provider touched a node")

    monkeypatch.setattr(nodes, "SshTransport", refuse)
    monkeypatch.setattr(execute, "proof_payload", refuse)


RECORDED = {
    **props(checkpoint_digest="sha256:aaa", snapshot_path="/c/models--a--b/snapshots/s"),
    **PASS_REPORT,
}

DIFF_TABLE = [
    # (case, changes, replaced keys)
    ("nothing changed", {}, []),
    ("new image ID", {"image_id": "sha256:" + "ff" * 32}, ["image_id"]),
    ("new checkpoint", {"checkpoint_digest": "sha256:bbb"}, ["checkpoint_digest"]),
    ("node memory", {"memory": {**MEMORY, "gpu_memory_utilization": 0.5}}, ["memory"]),
    ("parallelism", {"memory": {**MEMORY, "tensor_parallel_size": 1}}, ["memory"]),
    ("the head reached another way", {"node": {**NODE, "host": "10.0.0.9"}}, []),
    ("same image under another name", {"image": "vllm-node:other"}, []),
    ("mode", {"mode": "report"}, []),
]


@pytest.mark.parametrize(("case", "changes", "replaces"), DIFF_TABLE, ids=[d[0] for d in DIFF_TABLE])
def test_diff_runs_again_only_for_image_checkpoint_or_memory(no_io, case, changes, replaces):
    news = {**props(checkpoint_digest="sha256:aaa", snapshot_path="/c/models--a--b/snapshots/s"), **changes}
    result = ModelSupportCheckProvider().diff("id", RECORDED, news)
    assert result.replaces == replaces
    assert result.changes is bool(changes)


def test_check_names_bad_fields_without_io(no_io):
    result = ModelSupportCheckProvider().check(
        {}, props(image="Bad Ref", image_id="latest", snapshot_path="/a b", mode="maybe")
    )
    assert {f.property for f in result.failures} == {"image", "image_id", "snapshot_path", "mode"}
    unknown = UNKNOWN
    assert (
        ModelSupportCheckProvider().check({}, props(image_id=unknown, snapshot_path=unknown)).failures == []
    )


def test_check_passes_the_unknowns_the_engine_sends_during_preview(no_io):
    # The real engine's preview hands `check` an Unknown for the head's image ID and snapshot path.
    engine_unknown = pulumi.output.Unknown()
    news = props(image_id=engine_unknown, snapshot_path=engine_unknown)
    assert ModelSupportCheckProvider().check({}, news).failures == []


def test_read_returns_the_recorded_proof_without_io(no_io):
    result = ModelSupportCheckProvider().read("spark-1-abab", RECORDED)
    assert result.id == "spark-1-abab" and result.outs == RECORDED


def test_update_keeps_the_proof_and_enforcing_a_recorded_failure_refuses(no_io):
    news = props(checkpoint_digest="sha256:aaa", node={**NODE, "host": "10.0.0.9"})
    updated = ModelSupportCheckProvider().update("id", RECORDED, news)
    assert updated.outs["verdict"] == "pass" and updated.outs["node"]["host"] == "10.0.0.9"
    failed = {**RECORDED, **CONSTRUCT_FAIL, "mode": "report"}
    with pytest.raises(ModelSupportError, match="stage 'construct'"):
        ModelSupportCheckProvider().update("id", failed, {**news, "mode": "enforce"})


def test_create_id_names_the_head_image_and_checkpoint(monkeypatch, proof_dir):
    head(monkeypatch)
    monkeypatch.setattr(execute, "PATCH_DIR", proof_dir)
    created = ModelSupportCheckProvider().create(props(checkpoint_digest="sha256:0123456789abcdef"))
    assert created.id == "spark-1-abababababab-0123456789ab"
    assert created.outs["verdict"] == "pass" and created.outs["image_id"] == IMAGE_ID


@pytest.mark.parametrize("image_id", [None, "", "vllm-node:latest"])
def test_create_needs_the_heads_image_id(no_io, image_id):
    with pytest.raises(ModelSupportError, match="image_id"):
        execute.ensure(props(image_id=image_id))


def safetensors_header(tensors: dict[str, int]) -> bytes:
    """A shard's header (its data is left out: the facts program reads headers only)."""
    entries, offset = {}, 0
    for name, size in tensors.items():
        entries[name] = {"dtype": "F8_E4M3", "shape": [size], "data_offsets": [offset, offset + size]}
        offset += size
    body = json.dumps(entries).encode()
    return struct.pack("<Q", len(body)) + body


def recipe_snapshot(root: Path, config: dict, mtp_bytes: int, vision_bytes: int) -> Path:
    """A 126 GB-index snapshot with the given config.json and one shard holding MTP and vision tensors."""
    snapshot = hf_snapshot(root, total_size=126 * GB, shard_bytes=[10])
    (snapshot / "config.json").unlink()
    (snapshot / "config.json").write_text(json.dumps(config))
    shard = "model-00002-of-00002.safetensors"
    tensors = {"mtp.fc.weight": mtp_bytes, "model.visual.blocks.0.attn.qkv.weight": vision_bytes, "x": 5}
    (snapshot / shard).write_bytes(safetensors_header(tensors))
    index_path = snapshot / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    index["weight_map"].update(dict.fromkeys(tensors, shard))
    index_path.unlink()
    index_path.write_text(json.dumps(index))
    return snapshot


def test_the_fit_sizes_the_kv_cache_from_the_checkpoint_config(monkeypatch, proof_dir, tmp_path):
    head(monkeypatch)
    config = json.loads(
        (model_support.PATCH_DIR / "proof_configs" / "qwen3_5_moe-fp8" / "config.json").read_text()
    )
    snapshot = recipe_snapshot(tmp_path, config, mtp_bytes=3 * GB, vision_bytes=GB)
    memory = {**MEMORY, "max_model_len": 32768, "kv_cache_dtype": "fp8", "speculative_tokens": 1}
    memory["language_model_only"] = True
    outs = execute.ensure(
        props(snapshot_path=str(snapshot), memory=memory, checkpoint_digest="sha256:1"), proof_dir=proof_dir
    )
    fit = outs["memory_fit"]
    # The MTP head is loaded (speculative decoding on), the vision encoder is not (language model only).
    assert fit["loaded_weights_gb"] == 125.0 and fit["kv_sizing"] == "config.json"
    assert fit["kv_bytes_per_token"] == 13 * 2 * 256 and fit["max_model_len"] == 32768
    assert fit["max_concurrency"] > 100


def test_one_max_model_len_request_that_does_not_fit_stops_before_any_container(
    monkeypatch, proof_dir, tmp_path
):
    fake = head(monkeypatch)
    dense = {"num_hidden_layers": 64, "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 128}
    snapshot = recipe_snapshot(tmp_path, {"text_config": dense}, mtp_bytes=0, vision_bytes=0)
    # 63 GB per rank at 0.55: 70.4 - 63 - 4 = 3.4 GB left, over the old 2 GB floor; one 131072-token
    # request of BF16 KV (64 layers × 2 × 4 heads per rank × 128 × 2 bytes = 128 KiB a token) is 17 GB.
    memory = {**MEMORY, "gpu_memory_utilization": 0.55, "max_model_len": 131072}
    with pytest.raises(MemoryFitError) as info:
        execute.ensure(
            props(snapshot_path=str(snapshot), memory=memory, checkpoint_digest="sha256:1"),
            proof_dir=proof_dir,
        )
    message = str(info.value)
    assert "one request of max_model_len 131072 tokens: 17.18 GB" in message
    assert "serve.kv_cache_dtype: fp8" in message and "smaller serve.max_model_len" in message
    assert fake.docker_runs() == 0


# ---- the argument proof: the image's vLLM parses the server's exact command line ----------------------

SERVE_ARGV = ["vllm", "serve", "Qwen/Qwen3.5-122B-A10B-FP8", "--speculative-config", '{"method":"mtp"}']
MISSPELLED = {
    "verdict": "fail",
    "failed_stage": "parse",
    "flag": "--kv-cahce-dtype",
    "error": "unrecognized arguments: --kv-cahce-dtype fp8",
    "vllm": "0.17.1",
}


def test_the_server_argv_is_proved_in_its_own_container_after_the_argument_list(monkeypatch, proof_dir):
    fake = head(monkeypatch)
    outs = execute.ensure(
        props(serve_argv=SERVE_ARGV, snapshot_path="/c/hub/models--a--b/snapshots/s1", memory=None),
        proof_dir=proof_dir,
    )
    assert outs["serve_args"]["verdict"] == "pass" and outs["verdict"] == "pass"
    assert fake.docker_runs() == 2
    args_run = next(call for call in fake.calls if "--" in call)
    # Offline, by image ID, the checkpoint mounted read-only; JSON passes as one argv element.
    assert args_run[args_run.index("--") + 1 :] == SERVE_ARGV
    assert args_run[args_run.index("--network") : args_run.index("--network") + 2] == ["--network", "none"]
    assert IMAGE_ID in args_run and "--checkpoint" in args_run


def test_a_refused_flag_stops_up_before_the_model_proof_quoting_vllm(monkeypatch, proof_dir):
    fake = head(monkeypatch, args_result=report_result(MISSPELLED, 1))
    with pytest.raises(ModelSupportError) as info:
        execute.ensure(props(serve_argv=SERVE_ARGV), proof_dir=proof_dir)
    message = str(info.value)
    assert "at 'parse' (--kv-cahce-dtype)" in message
    assert "vLLM says: unrecognized arguments: --kv-cahce-dtype fp8" in message
    assert "vLLM 0.17.1" in message and "next: " in message
    assert fake.docker_runs() == 1  # the model proof never ran


def test_report_mode_records_a_refused_flag(monkeypatch, proof_dir):
    head(monkeypatch, args_result=report_result(MISSPELLED, 1))
    outs = execute.ensure(props(serve_argv=SERVE_ARGV, mode="report"), proof_dir=proof_dir)
    assert outs["serve_args"]["flag"] == "--kv-cahce-dtype" and outs["verdict"] == "pass"


def test_an_argument_proof_without_a_report_is_an_error(monkeypatch, proof_dir):
    head(monkeypatch, args_result=Result((), 139, b"", b"Segmentation fault"))
    with pytest.raises(ModelSupportError, match="argument proof ended without a report"):
        execute.ensure(props(serve_argv=SERVE_ARGV, mode="report"), proof_dir=proof_dir)


def test_a_changed_command_line_is_proven_again_in_place_and_only_it(monkeypatch, proof_dir):
    """A serving flag changed by `up`: the image and the checkpoint are the ones proven, so the update
    runs the argument proof on the new argv alone and keeps the recorded behaviour proof."""
    provider = model_support.ModelSupportCheckProvider()
    old = {**props(serve_argv=SERVE_ARGV), **PASS_REPORT, "memory_fit": {"fits": 1}}
    new = props(serve_argv=[*SERVE_ARGV, "--max-num-seqs", "8"])
    diff = provider.diff("x", old, new)
    assert diff.changes and diff.replaces == [], diff.replaces
    fake = head(monkeypatch)
    monkeypatch.setattr(execute, "PATCH_DIR", proof_dir)
    updated = provider.update("x", old, new).outs
    proved = [call[call.index("--") + 1 :] for call in fake.calls if "--" in call]
    assert proved == [new["serve_argv"]] and fake.docker_runs() == 1, fake.calls
    assert updated["serve_args"]["verdict"] == "pass" and updated["serve_argv"] == new["serve_argv"]
    # What the behaviour proof and the fit recorded stays, unread and unrun.
    assert (updated["verdict"], updated["vllm"], updated["memory_fit"]) == ("pass", "0.17.1", {"fits": 1})


def test_a_new_command_line_vllm_refuses_fails_the_update_and_keeps_the_record(monkeypatch, proof_dir):
    old = {**props(serve_argv=SERVE_ARGV), **PASS_REPORT}
    new = props(serve_argv=[*SERVE_ARGV, "--nnodes", "3"])
    head(monkeypatch, args_result=report_result(LAYOUT_REFUSED, 1))
    monkeypatch.setattr(execute, "PATCH_DIR", proof_dir)
    with pytest.raises(ModelSupportError, match="at 'parallel'"):
        model_support.ModelSupportCheckProvider().update("x", old, new)


def test_an_update_of_how_the_head_is_reached_runs_nothing(no_io):
    old = {**props(serve_argv=SERVE_ARGV), **PASS_REPORT}
    new = props(serve_argv=SERVE_ARGV, node={**NODE, "host": "10.0.0.9"}, deadline_s=60)
    updated = model_support.ModelSupportCheckProvider().update("x", old, new).outs
    assert updated["verdict"] == "pass" and updated["node"]["host"] == "10.0.0.9"


def test_the_bootstrap_runs_the_named_program(tmp_path):
    from components.model_support import proof_payload
    from components.model_support.programs import serve_args_source
    from components.model_support.serve_args import ARGS_PROGRAM

    (tmp_path / "prove_args.py").write_text("import sys, json; print(json.dumps({'argv': sys.argv[1:]}))")
    payload = proof_payload(tmp_path, ARGS_PROGRAM, configs=False)
    done = run_shipped(serve_args_source(payload, 60), "--", "vllm", "serve", '{"a": 1}')
    assert json.loads(done.stdout.decode().splitlines()[-1]) == {"argv": ["--", "vllm", "serve", '{"a": 1}']}


# ---- executor mp: every rank's own command line --------------------------------------------------------

HEADLESS_ARGV = [*SERVE_ARGV, "--nnodes", "2", "--node-rank", "1", "--headless"]
LAYOUT_REFUSED = {
    "verdict": "fail",
    "failed_stage": "parallel",
    "flag": None,
    "error": "ValueError: node_rank=2 must be less than nnodes=2.",
    "vllm": "0.17.1",
}


class RankScripted(FakeHead):
    """The argument proof answers by the argv it was given: a headless one (`--headless`) gets
    `headless`, the head's passes."""

    def __init__(self, headless: dict):
        super().__init__()
        self.headless = headless

    def rank_report(self, argv) -> dict:
        return self.headless if "--headless" in argv else ARGS_PASS


def ranked(call: list[str]) -> dict[str, list[str]]:
    """The command lines one argument proof's run was given: the head's (after `--`) and each rank's."""
    ranks = {call[i + 1]: json.loads(call[i + 2]) for i, word in enumerate(call) if word == "--rank"}
    return {"head": call[call.index("--") + 1 :], **ranks}


def test_every_rank_s_argv_is_proved_in_one_run_each_on_its_own(monkeypatch, proof_dir):
    fake = head(monkeypatch)
    outs = execute.ensure(
        props(serve_argv=SERVE_ARGV, rank_argvs={"spark-2": HEADLESS_ARGV}), proof_dir=proof_dir
    )
    runs = [ranked(call) for call in fake.calls if "--" in call]
    # One container for every command line: vLLM is imported once, however many nodes.
    assert runs == [{"head": SERVE_ARGV, "spark-2": HEADLESS_ARGV}]
    assert outs["serve_args"]["ranks"] == {
        "spark-1": {"verdict": "pass", "failed_stage": None},
        "spark-2": {"verdict": "pass", "failed_stage": None},
    }


def test_a_rank_the_proof_gave_no_report_for_is_an_error_naming_it(monkeypatch, proof_dir):
    head(monkeypatch)  # the head's report alone: a run that says nothing of spark-2
    monkeypatch.setattr(FakeHead, "args_run", lambda self, argv: self.args_result)
    with pytest.raises(ModelSupportError, match="argument proof ended without a report"):
        execute.ensure(
            props(serve_argv=SERVE_ARGV, rank_argvs={"spark-2": HEADLESS_ARGV}), proof_dir=proof_dir
        )


def test_a_headless_argv_vllm_refuses_stops_up_naming_the_rank(monkeypatch, proof_dir):
    fake = RankScripted(LAYOUT_REFUSED)
    monkeypatch.setattr(nodes, "SshTransport", fake)
    with pytest.raises(ModelSupportError) as info:
        execute.ensure(
            props(serve_argv=SERVE_ARGV, rank_argvs={"spark-2": HEADLESS_ARGV}), proof_dir=proof_dir
        )
    message = str(info.value)
    assert "refuses spark-2's headless rank's command line at 'parallel'" in message, message
    assert "vLLM says: ValueError: node_rank=2 must be less than nnodes=2." in message, message
    assert "multi-node layout" in message, message
    assert fake.docker_runs() == 1  # one run proved both lines; the model proof never ran


def test_report_mode_records_the_refused_rank(monkeypatch, proof_dir):
    monkeypatch.setattr(nodes, "SshTransport", RankScripted(LAYOUT_REFUSED))
    outs = execute.ensure(
        props(serve_argv=SERVE_ARGV, rank_argvs={"spark-2": HEADLESS_ARGV}, mode="report"),
        proof_dir=proof_dir,
    )
    recorded = outs["serve_args"]
    assert recorded["node"] == "spark-2" and recorded["failed_stage"] == "parallel", recorded
    assert recorded["ranks"]["spark-1"]["verdict"] == "pass", recorded


def test_a_changed_rank_argv_is_proven_again_with_the_head_s(monkeypatch, proof_dir):
    provider = model_support.ModelSupportCheckProvider()
    old = {**props(serve_argv=SERVE_ARGV, rank_argvs={"spark-2": HEADLESS_ARGV}), **PASS_REPORT}
    rank = [*HEADLESS_ARGV[:-1], "--max-num-seqs", "8"]
    new = props(serve_argv=SERVE_ARGV, rank_argvs={"spark-2": rank})
    diff = provider.diff("x", old, new)
    assert diff.changes and diff.replaces == [], diff.replaces
    fake = head(monkeypatch)
    monkeypatch.setattr(execute, "PATCH_DIR", proof_dir)
    updated = provider.update("x", old, new).outs
    runs = [ranked(call) for call in fake.calls if "--" in call]
    assert runs == [{"head": SERVE_ARGV, "spark-2": rank}] and fake.docker_runs() == 1, fake.calls
    assert set(updated["serve_args"]["ranks"]) == {"spark-1", "spark-2"}


def test_the_mp_graph_gives_the_check_every_headless_rank_s_argv(monkeypatch):
    from tests.support.program import mp_stack_config, stack_config
    from tests.unit.test_deployment import run_graph

    inputs = run_graph(monkeypatch, mp_stack_config(3)).run.named("qwen35-model-support").inputs
    ranks = inputs["rank_argvs"]
    assert sorted(ranks) == ["spark-2", "spark-3"]
    for rank, node in enumerate(sorted(ranks), start=1):
        argv = ranks[node]
        assert argv[argv.index("--node-rank") + 1] == str(rank) and "--headless" in argv
        assert argv[-2] == "--revision" and argv[-1] == inputs["serve_argv"][-1]
    assert "--headless" not in inputs["serve_argv"]
    ray = run_graph(monkeypatch, stack_config("dev")).run.named("qwen35-model-support").inputs
    assert ray.get("rank_argvs") is None
