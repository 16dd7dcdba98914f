"""create() carried out on the head over SSH, the package's only I/O: the head's reads (the
checkpoint's facts, the image's repo digests), then the proofs (`programs.py`) in the order
`plan.plan_steps` gives, each report parsed by `facts.py` and judged by `plan.py`. A failed step
stops `up` (mode enforce) or is recorded in the outputs with a warning (mode report).

There is no `observe`: a proof about an image ID and a checkpoint digest does not drift (those are
its inputs, and their own resources are refreshed), so refresh keeps the recorded outputs (the SDK's
read); and no release: the proofs' containers were `--rm`, nothing is left on the head.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from components.model_support import programs
from components.model_support.errors import ModelSupportError, ServeArgsError
from components.model_support.facts import (
    parse_checkpoint_facts,
    parse_cluster,
    parse_proof,
    parse_repo_digests,
)
from components.model_support.plan import (
    CLUSTER_FIELDS,
    REPORT_FIELDS,
    check_fit,
    cluster_failure,
    cluster_not_run,
    create_problems,
    enforced,
    expected_refusal,
    expected_summary,
    failure_message,
    image_label,
    pin_mismatch,
    plan_steps,
    recorded_outputs,
    recorded_refusal,
)
from components.model_support.programs import (
    CLUSTER_PROGRAM,
    PATCH_DIR,
    cluster_argv,
    container_name,
    proof_argv,
    proof_payload,
    proof_source,
    serve_args_argv,
    serve_args_source,
)
from components.model_support.serve_args import ARGS_PROGRAM
from components.model_support.serve_args import failure_message as args_failure_message
from components.model_support.serve_args import parse_report as parse_args_report
from components.nodes import transport_to
from components.provider_kit.reports import read_report
from components.remote import Result, SshTransport

# Beyond the proof's own deadline: SSH, `docker run` start-up and removal.
TRANSPORT_SLACK_S = 60
FACTS_TIMEOUT_S = 120


def checkpoint_facts(transport: SshTransport, snapshot_path: str) -> dict[str, Any]:
    """Size, source of that size and layer count of the snapshot, read on the head."""
    result = transport.run(
        programs.model_facts_argv(snapshot_path),
        stdin=programs.model_facts_source(),
        timeout=FACTS_TIMEOUT_S,
    )
    return parse_checkpoint_facts(transport.name, snapshot_path, result)


def image_repo_digests(transport: SshTransport, image_id: str) -> list[str]:
    """The repo digests the head's Docker records for the image NodeImage placed there."""
    result = transport.run(programs.repo_digests_argv(image_id), timeout=FACTS_TIMEOUT_S)
    result.check("the image NodeImage placed on the head must still be there: `pulumi up --refresh`")
    return parse_repo_digests(result.out)


def refuse_or_record(
    props: Mapping[str, Any],
    message: str,
    proof: str | None = None,
    report: Mapping[str, Any] | None = None,
    expected: dict[str, str] | None = None,
) -> None:
    """A step said no: stop `up` (mode enforce), or warn and go on (mode report). A refusal the stack
    expects (image.model_check_expects) is only collected in `expected`: ensure says them once."""
    if enforced(props):
        raise ModelSupportError(message)
    if expected is not None and proof and report is not None and expected_refusal(props, proof, report):
        expected[proof] = str(report["failed_stage"])
        return
    import pulumi  # here, not at the top: importing the package, as `status` does, loads no Pulumi

    # The provider process's log goes to stderr (pulumi/pulumi#6065): the outputs carry it too.
    pulumi.log.warn(f"{message}\n  (image.model_check: report: continuing)")


def verify_pin(transport: SshTransport, props: Mapping[str, Any]) -> None:
    """A `…@sha256:` reference: the head's image must carry that repo digest."""
    problem = pin_mismatch(transport.name, props, image_repo_digests(transport, str(props["image_id"])))
    if problem:
        raise ModelSupportError(problem)


def check_cluster_layer(
    transport: SshTransport, props: Mapping[str, Any], deadline: float, expected: dict[str, str] | None = None
) -> dict[str, Any]:
    """Run prove_cluster.py in a throwaway container of the image; refuse (enforce) or record it."""
    source = proof_source(proof_payload(PATCH_DIR, CLUSTER_PROGRAM, configs=False), deadline, CLUSTER_PROGRAM)
    result = transport.run(
        cluster_argv(props, container_name(props, "cluster-check")),
        stdin=source,
        timeout=deadline + TRANSPORT_SLACK_S,
    )
    report = parse_cluster(props, result)
    if report["verdict"] != "pass":
        refuse_or_record(props, cluster_failure(props, report), "cluster_layer", report, expected)
    return {key: report.get(key) for key in CLUSTER_FIELDS}


def prove_serve_args(
    transport: SshTransport,
    props: Mapping[str, Any],
    payload: str,
    deadline: float,
    expected: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The image's vLLM takes the server's exact argv, and under executor mp each headless rank's
    (`rank_argvs`: its own node rank and `--headless`), all in one throwaway container (vLLM imported
    once); a refusal stops `up` (mode enforce), the head's first. The head's report, or the first
    refused rank's (`node` names it), with every rank's verdict."""
    head = props["node"]["name"]
    result = transport.run(
        serve_args_argv(props, container_name(props, "model-args")),
        stdin=serve_args_source(payload, deadline),
        timeout=deadline + TRANSPORT_SLACK_S,
    )
    raw = read_report(result)
    ranks = (raw or {}).get("ranks") or {}
    proofs = [(head, "the server's", raw)]
    proofs += [
        (node, f"{node}'s headless rank's", ranks.get(node)) for node in sorted(props.get("rank_argvs") or {})
    ]
    reports = {node: _judge_argv(props, result, whose, report, expected) for node, whose, report in proofs}
    refused = [node for node, report in reports.items() if report["verdict"] != "pass"]
    chosen = dict(reports[refused[0] if refused else head])
    if len(reports) > 1:
        chosen["node"] = refused[0] if refused else head
        chosen["ranks"] = {
            node: {"verdict": r["verdict"], "failed_stage": r["failed_stage"]} for node, r in reports.items()
        }
    return chosen


def _judge_argv(
    props: Mapping[str, Any],
    result: Result,
    whose: str,
    raw: Mapping[str, Any] | None,
    expected: dict[str, str] | None,
) -> dict[str, Any]:
    """One command line's report from the argument proof's run, refused or recorded when it failed."""
    node = props["node"]["name"]
    try:
        report = parse_args_report(node, result, raw)
    except ServeArgsError as exc:
        raise ModelSupportError(str(exc)) from None
    if report["verdict"] != "pass":
        message = args_failure_message(node, image_label(props, report), report, whose)
        refuse_or_record(props, message, "serve_args", report, expected)
    return report


def prove_model(
    transport: SshTransport,
    props: Mapping[str, Any],
    payload: str,
    deadline: float,
    expected: dict[str, str] | None = None,
) -> dict:
    """The behaviour proof (prove_model.py) in a throwaway container; the report fields it records."""
    result = transport.run(
        proof_argv(props, container_name(props, "model-support"), shards=True),
        stdin=proof_source(payload, deadline),
        timeout=deadline + TRANSPORT_SLACK_S,
    )
    report = parse_proof(props, result)
    if report["verdict"] != "pass":
        refuse_or_record(props, failure_message(props, report), "behaviour", report, expected)
    return {key: report.get(key) for key in REPORT_FIELDS}


def ensure(
    props: Mapping[str, Any], olds: Mapping[str, Any] | None = None, *, proof_dir: Path | None = None
) -> dict[str, Any]:
    """create(): the whole check on the head; update (`olds`, nothing that replaces changed): the
    argument proof again when a command line changed, the recorded proofs kept for the rest, and
    refused at once when enforce meets a recorded failure. The inputs with the check's outputs over
    them; ModelSupportError when it fails (mode enforce) or cannot run."""
    refusal = recorded_refusal(olds, props) if olds is not None else None
    if refusal:
        raise ModelSupportError(refusal)
    return {**props, **_checked(props, olds, proof_dir)}


def _checked(
    props: Mapping[str, Any], olds: Mapping[str, Any] | None, proof_dir: Path | None
) -> dict[str, Any]:
    """The check's outputs (`ensure`'s work)."""
    problems = create_problems(props)
    if problems:
        raise ModelSupportError("model-support check: " + "; ".join(problems))
    steps = plan_steps(props, olds)
    if olds is not None and not steps.runs:
        return recorded_outputs(olds)
    transport = transport_to("model-support check node", props["node"], ModelSupportError)
    # Before any I/O: a missing program fails at once.
    payload = proof_payload(proof_dir or PATCH_DIR) if steps.behaviour else ""
    args = proof_payload(proof_dir or PATCH_DIR, ARGS_PROGRAM, configs=False) if steps.serve_args else ""
    outs: dict[str, Any] = (
        recorded_outputs(olds)
        if olds is not None
        else {"memory_fit": None, "serve_args": None, "cluster_layer": cluster_not_run(props)}
    )
    if steps.fit:
        outs["memory_fit"] = check_fit(props, checkpoint_facts(transport, props["snapshot_path"]))
    if steps.pin:
        verify_pin(transport, props)
    expected: dict[str, str] = {}
    if steps.cluster:
        outs["cluster_layer"] = check_cluster_layer(transport, props, steps.deadline_s, expected)
    if steps.serve_args:
        outs["serve_args"] = prove_serve_args(transport, props, args, steps.deadline_s, expected)
    if steps.behaviour:
        outs.update(prove_model(transport, props, payload, steps.deadline_s, expected))
    if expected:
        import pulumi  # here, not at the top: see `refuse_or_record`

        # Not news (the stack declared them): one line, where a refusal would show three warnings.
        pulumi.log.info(expected_summary(props, expected))
    return outs
