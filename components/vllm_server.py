"""The vLLM server: `vllm serve` in its own container on the head, driving the Ray cluster.

A separate container (not `docker exec` into the Ray head) so that changing a serve setting replaces
only the server: the Ray containers, and the model weights they cache, stay up.
"""

from __future__ import annotations

from components.config import ServeConfig, StackConfig
from components.containers import ContainerSpec, ImageId, Mount, NodeFabric, fabric_env, node_container_spec
from components.ray_cluster import RAY_TMP, head_address, ray_tmp_volume_name

# The API key reaches vLLM through this variable, never on the command line (`ps` shows argv).
API_KEY_ENV = "VLLM_API_KEY"


def vllm_container_name(config: StackConfig) -> str:
    return f"{config.containers.name_prefix}-vllm"


def serve_argv(serve: ServeConfig, backend: str = "ray") -> list[str]:
    """`vllm serve …` for the head (`backend` the executor). Secrets never appear here (API_KEY_ENV)."""
    argv = [
        "vllm", "serve", serve.model,
        "--tensor-parallel-size", str(serve.tensor_parallel_size),
        "--pipeline-parallel-size", str(serve.pipeline_parallel_size),
        "--distributed-executor-backend", backend,
        "--host", serve.host,
        "--port", str(serve.port),
        "--gpu-memory-utilization", f"{serve.gpu_memory_utilization:g}",
        "--served-model-name", serve.model_name,
    ]  # fmt: skip
    if serve.max_model_len is not None:
        argv += ["--max-model-len", str(serve.max_model_len)]
    return argv + recipe_flags(serve) + list(serve.extra_args)


def recipe_flags(serve: ServeConfig) -> list[str]:
    """The serving recipe's typed options as flags; a value equal to vLLM's own default adds none."""
    flags: list[str] = []
    if serve.kv_cache_dtype != "auto":
        flags += ["--kv-cache-dtype", serve.kv_cache_dtype]
    if serve.speculative is not None:
        # One argv element holding JSON: it never passes through a shell (Docker's exec form).
        flags += ["--speculative-config", serve.speculative.as_json()]
    if serve.expert_parallel:
        flags.append("--enable-expert-parallel")
    if serve.prefix_caching is not None:
        flags.append("--enable-prefix-caching" if serve.prefix_caching else "--no-enable-prefix-caching")
    if serve.reasoning_parser is not None:
        flags += ["--reasoning-parser", serve.reasoning_parser]
    if serve.tool_call_parser is not None:
        flags += ["--tool-call-parser", serve.tool_call_parser]
    if serve.enable_auto_tool_choice:
        flags.append("--enable-auto-tool-choice")
    if serve.max_num_seqs is not None:
        flags += ["--max-num-seqs", str(serve.max_num_seqs)]
    if serve.max_num_batched_tokens is not None:
        flags += ["--max-num-batched-tokens", str(serve.max_num_batched_tokens)]
    if serve.language_model_only:
        flags.append("--language-model-only")
    if serve.enforce_eager:
        flags.append("--enforce-eager")
    if serve.load_format != "auto":
        flags += ["--load-format", serve.load_format]
    return flags


def local_url(serve: ServeConfig) -> str:
    """The server's base URL as seen from the head itself (where the readiness probe runs)."""
    host = "127.0.0.1" if serve.host in ("0.0.0.0", "::") else serve.host
    return f"http://{host}:{serve.port}"


def endpoint_url(config: StackConfig) -> str:
    """The OpenAI-compatible base URL for clients: the head's address unless the server binds one."""
    serve = config.serve
    host = config.head.host if serve.host in ("0.0.0.0", "::") else serve.host
    return f"http://{host}:{serve.port}/v1"


def vllm_container_spec(
    config: StackConfig, image_id: ImageId, fabric: NodeFabric | None = None
) -> ContainerSpec:
    """The server container on the head, running `image_id` (the head's copy, as the Ray head does);
    `fabric`: the head's FabricCheck outputs."""
    head = config.head
    env = {
        **fabric_env(config, head, fabric),
        # The driver joins the running cluster instead of starting a local one.
        "RAY_ADDRESS": head_address(config),
    }
    return node_container_spec(
        config,
        head,
        name=vllm_container_name(config),
        role="vllm",
        image_id=image_id,
        command=serve_argv(config.serve),
        env=env,
        secret_env={"HF_TOKEN": "hf_token", API_KEY_ENV: "api_key"},
        # The Ray head's session directory: a driver reaches the raylet through its Unix socket.
        extra_mounts=(Mount(ray_tmp_volume_name(config), RAY_TMP, volume=True),),
        # Let vLLM release the GPUs and the Ray placement group before it is killed.
        stop_grace_s=120,
        # A Ray driver finds its node's raylet by scanning local processes (Ray's
        # find_node_ids): in a PID namespace of its own it sees none and gives up after 60 s
        # ("Failed to connect to Ray cluster"). Seen in the lab E2E with Ray 2.60.
        pid_mode="host",
    )
