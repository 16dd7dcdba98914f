"""The vLLM server's command line and container, pure."""

from __future__ import annotations

import pytest

from components.config import ConfigError, ServeConfig, parse_stack_config
from components.config.serve import LOAD_FORMATS
from components.containers import Mount
from components.ray_cluster import RAY_TMP
from components.vllm_server import (
    API_KEY_ENV,
    endpoint_url,
    local_url,
    serve_argv,
    vllm_container_spec,
)
from tests.support.program import config_from, dev_raw

IMAGE_ID = "sha256:" + "d" * 64


def test_dev_serve_argv():
    cfg = config_from()
    assert serve_argv(cfg.serve) == [
        "vllm", "serve", "Qwen/Qwen3.5-122B-A10B-FP8",
        "--tensor-parallel-size", "2",
        "--pipeline-parallel-size", "1",
        "--distributed-executor-backend", "ray",
        "--host", "0.0.0.0",
        "--port", "8000",
        "--gpu-memory-utilization", "0.85",
        "--served-model-name", "qwen3.5-122b",
        "--max-model-len", "32768",
        # The recipe's options (docs/model-support.md, Serving), each from a typed field.
        "--kv-cache-dtype", "fp8",
        "--speculative-config", '{"method":"mtp","num_speculative_tokens":1}',
        "--enable-expert-parallel",
        "--enable-prefix-caching",
        "--reasoning-parser", "qwen3",
        "--tool-call-parser", "qwen3_coder",
        "--enable-auto-tool-choice",
        "--max-num-seqs", "4",
        "--max-num-batched-tokens", "8192",
        "--language-model-only",
    ]  # fmt: skip


def test_defaults_and_extra_args():
    serve = ServeConfig(
        tensor_parallel_size=4,
        pipeline_parallel_size=2,
        extra_args=["--mm-processor-kwargs", '{"video_kwargs": {"size": {"longest_edge": 4096}}}'],
    )
    argv = serve_argv(serve)
    assert "--max-model-len" not in argv
    assert argv[argv.index("--served-model-name") + 1] == serve.model
    assert argv[argv.index("--tensor-parallel-size") + 1] == "4"
    assert argv[argv.index("--pipeline-parallel-size") + 1] == "2"
    # JSON stays one argv element, byte for byte: the command never passes through a shell.
    assert argv[-2:] == ["--mm-processor-kwargs", '{"video_kwargs": {"size": {"longest_edge": 4096}}}']


def test_options_at_vllm_s_defaults_add_no_flag():
    serve = ServeConfig(
        kv_cache_dtype="auto",
        speculative=None,
        expert_parallel=False,
        prefix_caching=None,
        reasoning_parser=None,
        tool_call_parser=None,
        enable_auto_tool_choice=False,
        max_num_seqs=None,
        max_num_batched_tokens=None,
        language_model_only=False,
    )
    assert serve_argv(serve)[-2:] == ["--served-model-name", serve.model]
    off = serve.model_copy(update={"prefix_caching": False})
    assert serve_argv(off)[-1] == "--no-enable-prefix-caching"


@pytest.mark.parametrize(
    ("change", "flag", "value"),
    [
        ({"port": 9000}, "--port", "9000"),
        ({"gpu_memory_utilization": 0.9}, "--gpu-memory-utilization", "0.9"),
        ({"max_model_len": 8192}, "--max-model-len", "8192"),
        ({"served_model_name": "q"}, "--served-model-name", "q"),
        ({"kv_cache_dtype": "fp8_e5m2"}, "--kv-cache-dtype", "fp8_e5m2"),
        (
            {"speculative": {"method": "mtp", "num_speculative_tokens": 2}},
            "--speculative-config",
            '{"method":"mtp","num_speculative_tokens":2}',
        ),
        ({"reasoning_parser": "deepseek_r1"}, "--reasoning-parser", "deepseek_r1"),
        ({"tool_call_parser": "hermes"}, "--tool-call-parser", "hermes"),
        ({"max_num_seqs": 16}, "--max-num-seqs", "16"),
        ({"max_num_batched_tokens": 4096}, "--max-num-batched-tokens", "4096"),
        ({"load_format": "fastsafetensors"}, "--load-format", "fastsafetensors"),
        ({"load_format": "instanttensor"}, "--load-format", "instanttensor"),
    ],
)
def test_each_serve_setting_changes_the_command(change, flag, value):
    base = config_from().serve
    changed = ServeConfig.model_validate({**base.model_dump(), **change})
    argv = serve_argv(changed)
    assert argv != serve_argv(base)
    assert argv[argv.index(flag) + 1] == value


def test_api_key_is_never_on_the_command_line():
    cfg = config_from()
    spec = vllm_container_spec(cfg, IMAGE_ID)
    assert not any("api-key" in arg or "sk-" in arg for arg in spec.command)
    assert spec.secret_env == {"HF_TOKEN": "hf_token", API_KEY_ENV: "api_key"}
    assert API_KEY_ENV not in spec.env


def test_server_container_on_the_head():
    cfg = config_from()
    spec = vllm_container_spec(cfg, IMAGE_ID)
    assert spec.name == "qwen35-vllm" and spec.node == "spark-1"
    assert spec.image == IMAGE_ID
    assert spec.command[:3] == ("vllm", "serve", "Qwen/Qwen3.5-122B-A10B-FP8")
    assert spec.env["RAY_ADDRESS"] == "192.168.200.12:6379"
    assert spec.env["VLLM_HOST_IP"] == "192.168.200.12"
    assert Mount("qwen35-ray-tmp", RAY_TMP, volume=True) in spec.mounts
    assert spec.network_mode == "host" and spec.init


@pytest.mark.parametrize(
    ("host", "local", "endpoint"),
    [
        ("0.0.0.0", "http://127.0.0.1:8000", "http://10.1.230.180:8000/v1"),
        ("10.1.230.180", "http://10.1.230.180:8000", "http://10.1.230.180:8000/v1"),
    ],
)
def test_urls(host, local, endpoint):
    cfg = config_from(serve={"host": host})
    assert local_url(cfg.serve) == local
    assert endpoint_url(cfg) == endpoint


def test_load_format_auto_is_vllm_s_default_and_adds_no_flag():
    assert config_from().serve.load_format == "auto"
    assert "--load-format" not in serve_argv(config_from().serve)
    assert "--load-format" not in serve_argv(ServeConfig(load_format="auto"))


def test_load_format_takes_vllm_s_choices_only():
    # vLLM's LoadFormats (model_loader/__init__.py), among them the two fast loaders operators use.
    assert {"fastsafetensors", "instanttensor", "safetensors", "runai_streamer", "dummy"} <= set(LOAD_FORMATS)
    raw = dev_raw()
    raw["serve"] = {**raw["serve"], "load_format": "fastsafetensor"}
    with pytest.raises(ConfigError) as info:
        parse_stack_config(raw)
    assert "serve.load_format:" in str(info.value) and "'fastsafetensors'" in str(info.value)


@pytest.mark.parametrize("extra", [["--load-format", "instanttensor"], ["--load-format=instanttensor"]])
def test_load_format_in_extra_args_is_refused_naming_the_key(extra):
    raw = dev_raw()
    raw["serve"] = {**raw["serve"], "extra_args": extra}
    with pytest.raises(ConfigError) as info:
        parse_stack_config(raw)
    assert "--load-format is a typed option: set serve.load_format" in str(info.value)
