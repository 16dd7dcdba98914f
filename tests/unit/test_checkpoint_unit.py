"""Checkpoint without nodes: config, the pure copy plan, diff without I/O, command lines, stand-in vLLM."""

from __future__ import annotations

import json

import pytest

from components import remote
from components.checkpoint import programs
from components.checkpoint.errors import CheckpointError
from components.checkpoint.plan import CopyPlan, Manifest, check_space, plan_copy, problems
from components.checkpoint.programs import head_fetch_argv as fetch_argv
from components.checkpoint.provider import CheckpointProvider
from components.config import ConfigError, parse_stack_config
from lab.standin_vllm import local_config

SHA = "a" * 40
FILES = (
    ("config.json", "b" * 40, 100),
    ("model-1.safetensors", "c" * 64, 1000),
    ("model-2.safetensors", "d" * 64, 2000),
)
MANIFEST = Manifest("org/model", SHA, FILES, (("main", SHA),))
BASE = {
    "nodes": [
        {"name": "spark-1", "host": "10.0.0.1", "fabric_ip": "192.168.0.1"},
        {"name": "spark-2", "host": "10.0.0.2", "fabric_ip": "192.168.0.2"},
    ],
    "ssh": {"known_hosts": "/k"},
}


def config(**model):
    return parse_stack_config({**BASE, "model": model})


# ---- config -------------------------------------------------------------------------------------------


def test_model_defaults_follow_serve_model():
    cfg = config()
    assert cfg.hub_repo == "Qwen/Qwen3.5-122B-A10B-FP8"
    assert cfg.model.revision == "main" and cfg.model.refresh == "sizes" and cfg.model.keep_on_destroy
    assert cfg.hf_cache(cfg.nodes[1]) == "~/.cache/huggingface"
    path_model = parse_stack_config({**BASE, "serve": {"model": "/models/q"}})
    assert path_model.hub_repo is None


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        ({"revison": "main"}, "model.revison: unknown key (did you mean 'revision'?)"),
        ({"revision": "../etc"}, "model.revision:"),
        ({"repo": "not a repo"}, "model.repo:"),
        ({"refresh": "deep"}, "model.refresh:"),
        ({"source": "s3"}, "model.source:"),
        ({"cache_dirs": {"spark-3": "/x"}}, "model.cache_dirs.spark-3: not a node of this stack"),
        ({"cache_dirs": {"spark-2": "relative/x"}}, "model.cache_dirs:"),
        ({"endpoint": "https://user:pw@mirror"}, "model.endpoint:"),
        ({"allow_patterns": ["*.safetensors; rm -rf /"]}, "model.allow_patterns:"),
        ({"disk_reserve_bytes": -1}, "model.disk_reserve_bytes:"),
    ],
)
def test_bad_model_config_names_the_field(model, expected):
    with pytest.raises(ConfigError) as failure:
        config(**model)
    assert expected in str(failure.value)


# ---- plan -----------------------------------------------------------------------------------------


def report(blobs: dict[str, str], status: dict[str, str] | None = None, revision=SHA, free=10**12) -> dict:
    by_blob = {b: p for p, b, _s in FILES}
    status = status or {by_blob[b]: ("ok" if s == "ok" else s) for b, s in blobs.items()}
    return {"blobs": blobs, "status": status, "revision": revision, "free_bytes": free, "fs_path": "/data"}


@pytest.mark.parametrize(
    ("blobs", "status", "send", "relink"),
    [
        ({}, {}, ("b" * 40, "c" * 64, "d" * 64), True),
        ({"b" * 40: "ok", "c" * 64: "ok", "d" * 64: "ok"}, None, (), False),
        ({"b" * 40: "ok", "c" * 64: "damaged", "d" * 64: "ok"}, None, ("c" * 64,), True),
        ({"b" * 40: "ok", "c" * 64: "ok", "d" * 64: "truncated"}, None, ("d" * 64,), True),
        (
            {"b" * 40: "ok", "c" * 64: "ok", "d" * 64: "ok"},
            {"config.json": "unlinked", "model-1.safetensors": "ok", "model-2.safetensors": "ok"},
            (),
            True,
        ),
    ],
)
def test_plan_sends_only_what_is_missing_or_damaged(blobs, status, send, relink):
    plan = plan_copy(MANIFEST, report(blobs, status))
    assert plan.blobs == tuple(sorted(send)) and plan.relink == relink
    assert plan.bytes == sum(MANIFEST.blob_sizes[b] for b in send)


def test_preflight_names_node_path_and_both_numbers():
    with pytest.raises(CheckpointError) as failure:
        check_space(
            "spark-2",
            CopyPlan(("c" * 64,), 3 << 30, True),
            {"free_bytes": 1 << 30, "fs_path": "/data"},
            1 << 30,
        )
    message = str(failure.value)
    assert (
        "spark-2" in message and "/data" in message and "1.00 GiB free" in message and "4.00 GiB" in message
    )
    check_space(
        "spark-2", CopyPlan((), 0, True), {"free_bytes": 0, "fs_path": "/data"}, 1 << 30
    )  # nothing to send


def test_problems_lists_every_file_not_intact():
    assert problems(MANIFEST, report({}, {"config.json": "ok", "model-1.safetensors": "damaged"})) == {
        "model-1.safetensors": "damaged",
        "model-2.safetensors": "missing",
    }


def test_digest_depends_on_paths_and_blobs_not_order():
    shuffled = Manifest("org/model", SHA, tuple(reversed(FILES)))
    assert shuffled.digest == MANIFEST.digest
    other = Manifest("org/model", SHA, ((FILES[0][0], "e" * 40, 100), *FILES[1:]))
    assert other.digest != MANIFEST.digest


# ---- diff: no I/O -------------------------------------------------------------------------------------


@pytest.fixture
def no_io(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("diff must not talk to a node")

    monkeypatch.setattr(remote.SshTransport, "run", refuse)
    monkeypatch.setattr(remote.LocalTransport, "run", refuse)


def state(**changes) -> dict:
    base = {
        "node": {"name": "spark-2", "host": "10.0.0.2", "known_hosts": "/k"},
        "repo": "org/model",
        "requested_revision": "main",
        "source_mode": "hub",
        "cache_dir": "/data/hf",
        "manifest_digest": "f" * 64,
        "refresh": "sizes",
        "keep": True,
        "problems": {},
        "revision": SHA,
    }
    return {**base, **changes}


@pytest.mark.parametrize(
    ("news", "olds", "changes", "replaces"),
    [
        ({}, {}, False, []),
        ({"requested_revision": "v2"}, {}, True, ["requested_revision"]),
        ({"repo": "org/other"}, {}, True, ["repo"]),
        ({"manifest_digest": "0" * 64}, {}, True, ["manifest_digest"]),
        ({"cache_dir": "/elsewhere"}, {}, True, ["cache_dir"]),
        ({"refresh": "full"}, {}, True, []),
        # The same node reached at another address: in place, never a replacement.
        ({"node": {"name": "spark-2", "host": "spark-2.lan", "known_hosts": "/k"}}, {}, True, []),
        ({"node": {"name": "spark-3", "host": "10.0.0.2", "known_hosts": "/k"}}, {}, True, ["node"]),
        # A refresh found a damaged shard: `up` repairs it in place.
        ({}, {"problems": {"model-1.safetensors": "damaged"}}, True, []),
    ],
)
def test_diff_is_a_pure_table(no_io, news, olds, changes, replaces):
    result = CheckpointProvider().diff("id", state(**olds), state(**news))
    assert result.changes == changes and list(result.replaces) == replaces


# ---- command lines --------------------------------------------------------------------------------


def test_fetch_in_a_container_of_the_image_keeps_the_token_off_the_command_line():
    props = {
        "node": {"name": "spark-1", "host": "h", "known_hosts": "/k"},
        "repo": "org/model",
        "requested_revision": "main",
        "cache_dir": "/home/u/.cache/huggingface",
        "hf_token": "hf_secret_value",
        "fetch": {
            "image": "sha256:" + "1" * 64,
            "endpoint": "https://mirror.example",
            "progress": "/home/u/.qwen35/progress/f.json",
        },
    }
    argv = fetch_argv(props, (1000, 1000))
    joined = remote.shell_join(argv)
    assert "hf_secret_value" not in joined
    assert argv[:4] == ["docker", "run", "--rm", "-i"] and "--user" in argv and "1000:1000" in argv
    assert "/home/u/.cache/huggingface/hub:/home/u/.cache/huggingface/hub" in argv
    assert "HF_ENDPOINT=https://mirror.example" in argv and "sha256:" + "1" * 64 in argv
    args = json.loads(argv[-1])
    assert args["repo"] == "org/model" and args["revision"] == "main" and args["hub"].endswith("/hub")
    python = fetch_argv({**props, "fetch": {"python": "/opt/hf/bin/python"}}, None)
    assert python[0] == "/opt/hf/bin/python" and "-S" not in python  # the Hub client needs site packages


def test_programs_travel_in_one_line_and_stdlib_ones_run_isolated():
    argv = programs.inventory_argv("python3", "/c", "org/model", "main")
    assert argv[:4] == ["python3", "-I", "-S", "-c"] and "\n" not in argv[4]
    remote.shell_join(argv)


def test_send_and_receive_name_the_same_repo_folder_on_both_nodes():
    send = programs.send_argv("python3", "/a/hf", "org/model", ["c" * 64])
    receive = programs.receive_argv(
        "python3", "/b/hf", "org/model", SHA, MANIFEST.as_state(), {"main": SHA}, (1, 2)
    )
    sent, received = json.loads(send[-1]), json.loads(receive[-1])
    assert send[-2] == "send" and receive[-2] == "receive"
    assert sent == {"hub": "/a/hf/hub", "repo_dir": "models--org--model", "blobs": ["c" * 64]}
    assert received["hub"] == "/b/hf/hub" and received["repo_dir"] == "models--org--model"
    assert received["owner"] == [1, 2] and received["refs"] == {"main": SHA} and received["revision"] == SHA


# ---- the stand-in vLLM reads its node's own cache, offline ----------------------------------------------


def test_standin_vllm_needs_the_checkpoint_in_its_nodes_cache(tmp_path):
    root = tmp_path / "hub" / "models--org--model"
    (root / "snapshots" / SHA).mkdir(parents=True)
    (root / "refs").mkdir()
    (root / "refs" / "main").write_text(SHA)
    env = {"HF_HOME": str(tmp_path), "HF_HUB_OFFLINE": "1"}
    with pytest.raises(SystemExit, match="not in this node's cache"):
        local_config("org/model", SHA, env)
    (root / "snapshots" / SHA / "config.json").write_text('{"model_type": "qwen3_5_moe"}')
    assert local_config("org/model", SHA, env)["model_type"] == "qwen3_5_moe"
    assert local_config("org/model", None, env)["model_type"] == "qwen3_5_moe"  # refs/main
    with pytest.raises(SystemExit, match="HF_HUB_OFFLINE=1 is not set"):
        local_config("org/model", SHA, {"HF_HOME": str(tmp_path)})
