"""The ModelSupportCheck resource as the Pulumi program declares it (type `qwen35:ModelSupportCheck`)."""

from __future__ import annotations

from typing import Any

import pulumi
import pulumi.dynamic as dynamic

from components.config import ModelCheckMode as Mode
from components.model_support.plan import DEFAULT_DEADLINE_S, OUTPUT_KEYS
from components.model_support.provider import ModelSupportCheckProvider


class ModelSupportCheck(dynamic.Resource, module="qwen35", name="ModelSupportCheck"):
    """On the head: this image loads this checkpoint (config, construction, weights) and it fits."""

    verdict: pulumi.Output[str]
    failed_stage: pulumi.Output[str | None]
    vllm: pulumi.Output[str]
    transformers: pulumi.Output[str]
    architecture: pulumi.Output[str]
    model_type: pulumi.Output[str]
    quantization: pulumi.Output[Any]
    memory_fit: pulumi.Output[dict | None]
    serve_args: pulumi.Output[dict | None]
    # The cluster-layer proof's verdict, Ray's version and what was wanted (None: not asked for). Not
    # `cluster`: that is the input (what to prove), and a dynamic provider's diff sees both in one map.
    cluster_layer: pulumi.Output[dict | None]

    def __init__(
        self,
        name: str,
        *,
        node: dict[str, Any],
        image: str,
        image_id: pulumi.Input[str],
        memory: dict[str, Any],
        mode: str = Mode.ENFORCE.value,
        checkpoint_digest: pulumi.Input[str] | None = None,
        snapshot_path: pulumi.Input[str] | None = None,
        container_prefix: str = "qwen35",
        deadline_s: float = DEFAULT_DEADLINE_S,
        serve_argv: list[str] | None = None,
        rank_argvs: dict[str, Any] | None = None,
        cluster: dict[str, Any] | None = None,
        expect: dict[str, Any] | None = None,
        opts: pulumi.ResourceOptions | None = None,
    ):
        props = {
            "node": node,
            "image": image,
            "image_id": image_id,
            "memory": memory,
            "mode": mode,
            "checkpoint_digest": checkpoint_digest,
            "snapshot_path": snapshot_path,
            "container_prefix": container_prefix,
            "deadline_s": deadline_s,
            # The server's final argument list: the image's vLLM must parse it (prove_args.py).
            "serve_argv": serve_argv,
            # Executor mp: each headless rank's argument list, by node (proved as the head's is).
            "rank_argvs": rank_argvs,
            "cluster": cluster,
            # image.model_check_expects: refusals said in one line, not warned (mode report).
            "expect": expect,
            **{key: None for key in OUTPUT_KEYS},
        }
        super().__init__(ModelSupportCheckProvider(), name, props, opts)
