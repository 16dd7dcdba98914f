"""The ServeBench resource as the Pulumi program declares it (type `qwen35:ServeBench`)."""

from __future__ import annotations

from typing import Any

import pulumi
import pulumi.dynamic as dynamic

from components.serve_bench.plan import OUTPUT_KEYS
from components.serve_bench.provider import ServeBenchProvider


class ServeBench(dynamic.Resource, module="qwen35", name="ServeBench"):
    """After the readiness gate: the served speed measured on the head (decode, prefill, aggregate),
    held to the floors under enforce."""

    figures: pulumi.Output[dict | None]
    nccl_network: pulumi.Output[str | None]
    measured_at: pulumi.Output[float | None]
    elapsed_s: pulumi.Output[float | None]
    verdict: pulumi.Output[str]
    shortfalls: pulumi.Output[list]
    causes: pulumi.Output[list]
    error: pulumi.Output[str | None]

    def __init__(
        self,
        name: str,
        *,
        node: dict[str, Any],
        url: str,
        model: str,
        mode: str,
        settings: dict[str, Any],
        floors: dict[str, float],
        image_ids: dict[str, pulumi.Input[str]],
        server_argv: pulumi.Input[list[str]],
        nodes: list[str],
        log_container: str | None,
        api_key: pulumi.Input[str] | None,
        fabric: pulumi.Input[dict] | None = None,
        nccl_env: dict[str, pulumi.Input[dict[str, str]]] | None = None,
        opts: pulumi.ResourceOptions | None = None,
    ):
        props = {
            "node": node,
            "url": url,
            "model": model,
            "mode": mode,
            # output_tokens, prompt_tokens, concurrency, deadline_s.
            "settings": settings,
            "floors": floors,
            # What is measured: a change to any runs the bench again.
            "image_ids": image_ids,
            "server_argv": server_argv,
            "nodes": nodes,
            "log_container": log_container,
            "api_key": pulumi.Output.secret(api_key) if api_key is not None else None,
            # The stack output `fabric` (each node's MTU, the probe's figure): a miss's likely causes.
            "fabric": fabric,
            # Per node, what picks NCCL's transport in its serving containers (NCCL_IB_HCA, GID
            # index, NCCL_IB_DISABLE, the socket interface): a change measures again.
            "nccl_env": nccl_env,
            **{key: None for key in OUTPUT_KEYS},
        }
        secret = pulumi.ResourceOptions(additional_secret_outputs=["api_key"])
        opts = pulumi.ResourceOptions.merge(opts, secret)
        super().__init__(ServeBenchProvider(), name, props, opts)
