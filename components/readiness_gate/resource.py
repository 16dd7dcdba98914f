"""The ReadinessGate resource as the Pulumi program declares it (type `qwen35:ReadinessGate`)."""

from __future__ import annotations

from typing import Any

import pulumi
import pulumi.dynamic as dynamic

from components.readiness_gate.provider import ReadinessGateProvider


class ReadinessGate(dynamic.Resource, module="qwen35", name="ReadinessGate"):
    """Completes only once the server on the head has answered a real chat completion."""

    ready: pulumi.Output[bool]
    report: pulumi.Output[dict]
    # Per node, what its serving ranks logged about their transport, judged (`facts.ServingTransport`).
    serving_transport: pulumi.Output[dict]

    def __init__(
        self,
        name: str,
        *,
        node: dict[str, Any],
        server_id: pulumi.Input[str],
        url: str,
        model: str,
        expect_nodes: int,
        expect_gpus: float,
        deadline_s: int,
        expect_node_ips: dict[str, str] | None = None,
        container_ids: dict[str, pulumi.Input[str]] | None = None,
        ray_container: str | None,
        log_container: str,
        api_key: pulumi.Input[str] | None,
        deployed: pulumi.Input[dict] | None = None,
        serving_logs: dict[str, dict[str, Any]] | None = None,
        nccl_fabric: pulumi.Input[dict] | None = None,
        transport_mode: str | None = None,
        opts: pulumi.ResourceOptions | None = None,
    ):
        props = {
            "node": node,
            "server_id": server_id,
            "url": url,
            "model": model,
            "expect_nodes": expect_nodes,
            "expect_gpus": expect_gpus,
            "expect_node_ips": expect_node_ips,
            "container_ids": container_ids,
            "deadline_s": deadline_s,
            "ray_container": ray_container,
            "log_container": log_container,
            "api_key": pulumi.Output.secret(api_key) if api_key is not None else None,
            # What this probe deploys (image, revision) and the config line that sets each.
            "deployed": deployed,
            # Node -> {node, container}: where each node's serving ranks log (read after the probe).
            "serving_logs": serving_logs,
            # Node -> {ib_hca, gid_index}: what NCCL was given there; the mode is fabric.node_proof's.
            "nccl_fabric": nccl_fabric,
            "transport_mode": transport_mode,
            "ready": None,
            "report": None,
            "serving_transport": None,
        }
        opts = pulumi.ResourceOptions.merge(
            opts,
            pulumi.ResourceOptions(
                additional_secret_outputs=["api_key"],
                # Registered as the generic dynamic type before it had its own (before 2026-11-30,
                # fe8fcd9): not a replacement. A leftover: remove once every stack made before then
                # has run `pulumi up` since.
                aliases=[pulumi.Alias(type_="pulumi-python:dynamic:Resource")],
            ),
        )
        super().__init__(ReadinessGateProvider(), name, props, opts)
