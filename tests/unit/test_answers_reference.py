"""lab/answers_reference.py: the real stack's answer reference, made in the image by transformers and
cached by everything it depends on (no node here: `docker` is a stand-in that records its calls)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from components.answer_check.prompts import VERSION, prompt_ids
from engine.lab_stack import NAMESPACE, real_answers, real_engine_config
from lab import answers_reference as ref
from lab.layout import LabError, LabNode
from lab.remote import Result

SETTINGS = {"long_prompt_tokens": 384, "max_tokens": 8, "top": 5}


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("QWEN35_CACHE", str(tmp_path / "cache"))


@pytest.fixture
def repo(tmp_path) -> Path:
    folder = tmp_path / "repo"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    return folder


class Docker:
    """`lab.remote.docker` as the reference calls it: inspect gives an ID, run gives the program's output."""

    def __init__(self, out: str, code: int = 0):
        self.out, self.code, self.calls = out, code, []

    def __call__(self, node, *args, input=None, timeout=None, check=True):
        self.calls.append((args, input))
        if args[:2] == ("image", "inspect"):
            return Result(tuple(args), 0, b"sha256:abc\n", b"")
        return Result(tuple(args), self.code, self.out.encode(), b"Traceback: no module named transformers")


NODE = LabNode("node-a", "127.0.0.2", 2222, "root", "/dev/null", "/dev/null", "unix:///x", "20.10", "classic")


def made(prompts: dict) -> str:
    return "reference: long: 384 prompt tokens\n" + json.dumps({"version": VERSION, "prompts": prompts})


def test_the_reference_is_made_once_in_the_image_offline_and_read_from_the_cache_after(repo, monkeypatch):
    docker = Docker(made({"sum": {"tokens": [1], "logprobs": [-0.1]}}))
    monkeypatch.setattr(ref, "docker", docker)
    path = ref.make_reference(NODE, "lab-vllm-cpu:t", repo, SETTINGS)
    assert json.loads(path.read_text())["prompts"]["sum"]["tokens"] == [1]
    (run_args, source) = docker.calls[-1]
    assert run_args[:5] == ("run", "--rm", "-i", "--network", "none")
    assert f"{repo}:/model:ro" in run_args and run_args[-3:] == ("/model", "8", "5")
    # The prompt set arrives in the program's prelude, as the answer check sends it.
    spec = json.loads(json.loads(source.decode().splitlines()[0].split("=", 1)[1]))
    assert spec["version"] == VERSION and [p["id"] for p in spec["prompts"]] == prompt_ids()
    assert [p.get("limit") for p in spec["prompts"] if p["id"] == "long"] == [384]
    calls = len(docker.calls)
    assert ref.make_reference(NODE, "lab-vllm-cpu:t", repo, SETTINGS) == path
    assert len(docker.calls) == calls + 1  # the image's ID is asked; nothing runs


def test_a_changed_checkpoint_image_or_setting_makes_another_reference(repo):
    first = ref.reference_path("sha256:abc", repo, SETTINGS)
    assert ref.reference_path("sha256:abd", repo, SETTINGS) != first
    assert ref.reference_path("sha256:abc", repo, {**SETTINGS, "max_tokens": 9}) != first
    (repo / "config.json").write_text('{"changed": true}')
    assert ref.reference_path("sha256:abc", repo, SETTINGS) != first


def test_a_failed_program_is_named_with_its_last_lines_and_nothing_is_cached(repo, monkeypatch):
    monkeypatch.setattr(ref, "docker", Docker("", code=1))
    said = r"(?s)node-a: the transformers reference failed \(exit 1\).*no module named"
    with pytest.raises(LabError, match=said):
        ref.make_reference(NODE, "lab-vllm-cpu:t", repo, SETTINGS)
    assert not list((Path(ref.cache_dir()) / "answers").glob("*.json"))


def test_the_real_stack_takes_the_reference_it_is_given_and_no_other():
    given = real_engine_config("lab-vllm-cpu:t", "http://127.0.0.1:1", Path("/tmp/reference.json"))
    assert given[f"{NAMESPACE}:answers"]["reference"] == "/tmp/reference.json"
    assert given[f"{NAMESPACE}:answers"]["mode"] == "enforce"
    plain = real_engine_config("lab-vllm-cpu:t", "http://127.0.0.1:1")
    assert "reference" not in plain[f"{NAMESPACE}:answers"]
    # What the reference is made with is what the stack's check reads.
    assert {k: real_answers()[k] for k in SETTINGS} == SETTINGS
