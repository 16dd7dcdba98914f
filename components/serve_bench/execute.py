"""The bench carried out: shipped to the head over SSH, its progress relayed, its report judged.
The only I/O of the package: `ensure` (create, update) runs it. There is no `observe`: a bench is
run by `up` alone (it costs a minute of the server's time, and a figure read now would not be what
`up` measured), so refresh keeps the recorded figures (the SDK's read); and no release: a bench
leaves nothing on the node."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

from components.node_programs.serve_bench import BENCH_PROGRESS_PREFIX, LOG_SCAN_S
from components.nodes import checked_target
from components.provider_kit.progress import tell_operator
from components.remote import RemoteError, lines_marked, require_ssh, run_relaying, ssh_argv
from components.serve_bench.errors import BelowFloor, BenchFailed
from components.serve_bench.facts import figures_line, parse_report
from components.serve_bench.plan import ENFORCE, Action, judged, recorded_report, update_action
from components.serve_bench.programs import EXIT_HINTS, bench_argv, bench_program

# Beyond the bench's own deadline: SSH, the program's start and its read of the server's log.
TRANSPORT_SLACK_S = 60 + LOG_SCAN_S


def _run(props: Mapping[str, Any]) -> dict[str, Any]:
    """Run the bench on the head; its report, or BenchFailed (with its stderr) when it could not measure."""
    target = checked_target("ServeBench node", props["node"])
    require_ssh(target.label)
    argv = bench_argv(props)

    result = run_relaying(
        target.label,
        ssh_argv(target, argv, dial_with=sys.executable),
        argv,
        bench_program(props.get("api_key")),
        float(props["settings"]["deadline_s"]) + TRANSPORT_SLACK_S,
        lines_marked(
            BENCH_PROGRESS_PREFIX,
            lambda line: tell_operator(f"serve bench on {target.label}: {line}"),
            strip=True,
        ),
    )
    if not result.ok:
        hint = EXIT_HINTS.get(result.returncode, "")
        raise BenchFailed(props["node"]["name"], argv, result.returncode, result.stderr, hint)
    return parse_report(result.text)


def ensure(props: Mapping[str, Any], olds: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Measure, then judge against the floors: the bench's outputs (the inputs, the figures, the
    verdict). An update of only the floors or mode (`olds`: the recorded state) judges the recorded
    figures again without measuring. Under enforce, a bench that could not measure or a figure below
    its floor fails `up`; under report both are recorded and `up` goes on."""
    node = props["node"]["name"]
    if olds is not None and update_action(olds, props) is Action.JUDGE:
        report = recorded_report(olds)
        tell_operator(
            f"serve bench on {node}: new floors or mode: the recorded figures judged again, not measured"
        )
    else:
        try:
            report = _run(props)
        except (RemoteError, ValueError) as exc:
            if props.get("mode") == ENFORCE:
                raise
            outs = judged(props, None, error=str(exc))
            tell_operator(f"serve bench on {node}: not measured (bench.mode report goes on): {exc}")
            return {**props, **outs}
    outs = judged(props, report)
    if outs["shortfalls"] and props.get("mode") == ENFORCE:
        raise BelowFloor(node, outs["shortfalls"], outs["causes"])
    tell_operator(f"serve bench on {node}: {figures_line(outs['figures'])}")
    for missed in outs["shortfalls"]:
        tell_operator(f"serve bench on {node}: warning: {missed} (bench.mode report goes on)")
    return {**props, **outs}
