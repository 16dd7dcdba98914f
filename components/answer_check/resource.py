"""The AnswerCheck resource as the Pulumi program declares it (type `qwen35:AnswerCheck`)."""

from __future__ import annotations

from typing import Any

import pulumi
import pulumi.dynamic as dynamic

from components.answer_check.plan import OUTPUT_KEYS
from components.answer_check.provider import AnswerCheckProvider


class AnswerCheck(dynamic.Resource, module="qwen35", name="AnswerCheck"):
    """After the readiness gate: the served answers recorded on the head (a receipt per prompt) and
    judged by teacher forcing against the reference, the last accepted receipt and its own generation."""

    receipts: pulumi.Output[list | None]
    verdict: pulumi.Output[str]
    problems: pulumi.Output[list]
    findings: pulumi.Output[list]
    judged_against: pulumi.Output[list]
    known_answers: pulumi.Output[dict | None]
    accepted: pulumi.Output[list | None]
    notes: pulumi.Output[list]
    version: pulumi.Output[str | None]
    checked_at: pulumi.Output[float | None]
    elapsed_s: pulumi.Output[float | None]
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
        prompt_set: dict[str, str],
        reference: dict[str, Any] | None,
        image_ids: dict[str, pulumi.Input[str]],
        server_argv: pulumi.Input[list[str]],
        nodes: list[str],
        fabric: pulumi.Input[dict],
        api_key: pulumi.Input[str] | None,
        opts: pulumi.ResourceOptions | None = None,
    ):
        props = {
            "node": node,
            "url": url,
            "model": model,
            "mode": mode,
            # max_tokens, top, deadlines, tolerances, long_prompt_tokens, min_correct.
            "settings": settings,
            # The prompt set's version and digest, and the reference's content (`answers.reference`).
            "prompt_set": prompt_set,
            "reference": reference,
            # What the server computes with: a change to any checks again, against the last accepted
            # receipt too.
            "image_ids": image_ids,
            "server_argv": server_argv,
            "nodes": nodes,
            "fabric": fabric,
            "api_key": pulumi.Output.secret(api_key) if api_key is not None else None,
            **{key: None for key in OUTPUT_KEYS},
        }
        secret = pulumi.ResourceOptions(additional_secret_outputs=["api_key"])
        opts = pulumi.ResourceOptions.merge(opts, secret)
        super().__init__(AnswerCheckProvider(), name, props, opts)
