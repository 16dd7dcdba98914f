"""The lab's stand-in `vllm` and its image: the pure parts (flags, cluster check, answers, build context)."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from components.vllm_server import serve_argv
from lab.layout import LabError
from lab.ray_image import IMAGE_NAME, build_context, check_host_python, dockerfile, image_tag
from lab.standin_vllm import (
    STANDIN_NOTE,
    bearer_ok,
    cluster_summary,
    completion_response,
    models_response,
    parse_serve_args,
    prompt_text,
)
from tests.support.program import stack_config


def lab_serve_argv() -> list[str]:
    from components.config import parse_stack_config

    raw = {key.split(":", 1)[1]: value for key, value in stack_config("lab").items()}
    return serve_argv(parse_stack_config(raw).serve)


def test_the_program_s_own_serve_command_parses():
    argv = lab_serve_argv()
    assert argv[:2] == ["vllm", "serve"]
    args = parse_serve_args(argv[1:], env={"VLLM_API_KEY": "k"})
    assert args.world_size == 2
    assert args.served_names == ("qwen3.5-lab",)
    assert (args.host, args.port, args.backend, args.api_key) == ("127.0.0.2", 18000, "ray", "k")
    assert args.ignored == ()


def test_flags_it_does_not_model_are_kept_and_reported():
    args = parse_serve_args(["serve", "m", "-tp", "4", "-pp", "2", "--enable-prefix-caching"], env={})
    assert args.world_size == 8 and args.ignored == ("--enable-prefix-caching",) and args.api_key is None


def test_multi_gpu_needs_the_ray_backend():
    with pytest.raises(SystemExit, match="ray"):
        parse_serve_args(["serve", "m", "-tp", "2", "--distributed-executor-backend", "mp"], env={})


def test_cluster_summary_counts_alive_nodes_and_their_gpus():
    nodes = [
        {"Alive": True, "NodeManagerAddress": "10.0.0.1", "Resources": {"GPU": 1.0, "CPU": 20}},
        {"Alive": False, "NodeManagerAddress": "10.0.0.2", "Resources": {"GPU": 1.0}},
        {"Alive": True, "NodeManagerAddress": "10.0.0.3", "Resources": {"CPU": 20}},
    ]
    assert cluster_summary(nodes) == (2, 1.0, "10.0.0.1: 1 GPU, 10.0.0.3: 0 GPU")
    assert cluster_summary([]) == (0, 0.0, "none")


@pytest.mark.parametrize(
    ("header", "key", "ok"),
    [(None, None, True), ("Bearer k", "k", True), ("Bearer x", "k", False), (None, "k", False)],
)
def test_api_key_rule_is_vllms(header, key, ok):
    assert bearer_ok(header, key) is ok


def test_answers_say_they_come_from_a_stand_in():
    args = parse_serve_args(["serve", "org/model", "--served-model-name", "a", "b"], env={})
    models = models_response(args, 0)
    assert [m["id"] for m in models["data"]] == ["a", "b"] and models["standin"] == STANDIN_NOTE
    answer = completion_response("a", "hi there", ["rank 0@10.0.0.1 read 2 words"], None)
    assert STANDIN_NOTE in answer["choices"][0]["message"]["content"]
    assert answer["usage"]["completion_tokens"] > 0 and answer["standin"] == STANDIN_NOTE
    short = completion_response("a", "hi", ["x"], 3)
    assert short["usage"]["completion_tokens"] == 3


def test_prompt_is_the_last_user_message_in_either_content_form():
    messages = [
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": [{"type": "text", "text": "second"}]},
    ]
    assert prompt_text(messages) == "second"
    assert prompt_text([]) == ""


def test_build_context_is_byte_identical_for_identical_inputs(tmp_path: Path):
    (tmp_path / "ray-1.0-py3-none-any.whl").write_bytes(b"wheel")
    first = build_context(tmp_path, b"print('standin')\n")
    assert first == build_context(tmp_path, b"print('standin')\n")
    with tarfile.open(fileobj=io.BytesIO(first)) as tar:
        names = tar.getnames()
    assert names == [
        "Dockerfile",
        "standin/standin_vllm.py",
        "standin/vllm",
        "wheels/ray-1.0-py3-none-any.whl",
    ]
    tag = image_tag(first, "rootfs:1")
    assert tag.startswith(f"{IMAGE_NAME}:") and tag != image_tag(first, "rootfs:2")
    assert tag != image_tag(build_context(tmp_path, b"changed\n"), "rootfs:1")


def test_build_installs_offline_and_keeps_wheels_out_of_the_image():
    text = dockerfile()
    assert "--no-index" in text and "--find-links /wheels" in text
    final_stage = text.split("\nFROM ", 2)[-1]
    assert "/wheels" not in final_stage and "vllm serve --help" in final_stage


def test_host_python_must_match_the_image_s():
    check_host_python((3, 11), (2, 36))
    with pytest.raises(LabError, match="3.12"):
        check_host_python((3, 12), (2, 36))
    with pytest.raises(LabError, match="glibc"):
        check_host_python((3, 11), (2, 39))
