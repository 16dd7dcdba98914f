"""The answer check carried out: shipped to the head over SSH, its progress relayed, its report
judged. The only I/O of the package: `ensure` (create, update) runs it. There is no `observe`: the
check is run by `up` alone, when what it judges changed, so refresh keeps the recorded answers (the
SDK's read); and no release: a check leaves nothing on the node."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

from components.answer_check.errors import CheckFailed, WrongAnswers
from components.answer_check.facts import parse_report, summary_line
from components.answer_check.plan import ENFORCE, against_receipt, forced, judged, last_accepted
from components.answer_check.programs import EXIT_HINTS, answer_argv, answer_program, answer_spec
from components.node_programs.answer_check import ANSWERS_PROGRESS_PREFIX
from components.nodes import checked_target
from components.provider_kit.progress import tell_operator
from components.remote import RemoteError, lines_marked, require_ssh, run_relaying, ssh_argv

# Beyond the check's own deadline: SSH and the program's start.
TRANSPORT_SLACK_S = 60.0


def _run(props: Mapping[str, Any], accepted: list[dict] | None) -> dict[str, Any]:
    """Run the check on the head (scoring the reference's and `accepted`'s continuations too); its
    report, or CheckFailed (with its stderr) when it could not record the answers."""
    target = checked_target("AnswerCheck node", props["node"])
    require_ssh(target.label)
    argv = answer_argv(props)
    result = run_relaying(
        target.label,
        ssh_argv(target, argv, dial_with=sys.executable),
        argv,
        answer_program(props.get("api_key"), answer_spec(props, forced(props, accepted))),
        float(props["settings"]["deadline_s"]) + TRANSPORT_SLACK_S,
        lines_marked(
            ANSWERS_PROGRESS_PREFIX,
            lambda line: tell_operator(f"answer check on {target.label}: {line}"),
            strip=True,
        ),
    )
    if not result.ok:
        hint = EXIT_HINTS.get(result.returncode, "")
        raise CheckFailed(props["node"]["name"], argv, result.returncode, result.stderr, hint)
    return parse_report(result.text)


def ensure(props: Mapping[str, Any], olds: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Record the answers, then judge them: the check's outputs (the inputs, the receipts, the
    verdict). Against the last accepted receipt too when the server changed since (`olds`). Under
    enforce, a check that could not run or a refused answer fails `up`; under report both are
    recorded and `up` goes on."""
    node = props["node"]["name"]
    baseline = against_receipt(olds, props)
    try:
        report = _run(props, baseline)
    except (RemoteError, ValueError) as exc:
        if props.get("mode") == ENFORCE:
            raise
        tell_operator(f"answer check on {node}: not checked (answers.mode report goes on): {exc}")
        return {**props, **judged(props, None, last_accepted(olds), error=str(exc))}
    outs = judged(props, report, baseline if baseline is not None else last_accepted(olds))
    if outs["problems"] and props.get("mode") == ENFORCE:
        raise WrongAnswers(node, outs["problems"], outs["judged_against"])
    tell_operator(f"answer check on {node}: {summary_line(outs)}")
    for problem in outs["problems"]:
        tell_operator(f"answer check on {node}: warning: {problem} (answers.mode report goes on)")
    return {**props, **outs}
