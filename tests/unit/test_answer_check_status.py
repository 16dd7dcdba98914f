"""`status` and the answer check: the `answers` row from the stack output `answers` (the last `up`'s
verdict, said to be so), a warning per problem it recorded, and no row, nothing asked, under
`answers.mode: off`."""

from __future__ import annotations

import pytest

from components.config import parse_stack_config
from status import gather, render
from status.checks import answers_line
from status.verdict import Verdict, judge
from tests.support.program import config_from, dev_raw

SETTINGS = config_from().answers.settings()
# 2026-12-05 10:00 UTC
RECORDED = {
    "mode": "report",
    "settings": SETTINGS,
    "verdict": "pass",
    "problems": [],
    "judged_against": ["reference", "self"],
    "known_answers": {"correct": 5.0, "of": 5.0, "min_correct": 4.0},
    "findings": [{"kind": "tie", "prompt": "story", "position": 3}],
    "receipts": [{"id": f"p{i}"} for i in range(9)],
    "checked_at": 1796464800,
}
PROBLEM = (
    "prompt 'story' token 0: expected token 5, served token 9; the expected token's served logprob is 8.950"
)
FAILED = {**RECORDED, "verdict": "fail", "problems": [PROBLEM], "judged_against": ["receipt", "self"]}
ERROR = {**RECORDED, "verdict": "error", "receipts": None, "error": "spark-1: could not record (exit 3)\n..."}
NO_CLI = {"error": "no Pulumi CLI here to read the stack output `answers`"}


def test_the_row_says_the_verdict_is_the_last_up_s():
    line, warnings = answers_line(config_from(), {"output": RECORDED})
    assert line == (
        "pass: 9 prompts against reference and self; known answers 5 of 5 (answers.min_correct 4); "
        "1 near-tie(s) (checked by `pulumi up` 2026-12-05 10:00 UTC, not now)"
    )
    assert warnings == []


def test_a_refused_answer_warns_naming_the_token():
    line, warnings = answers_line(config_from(), {"output": FAILED})
    assert line.startswith("fail: 9 prompts against receipt and self")
    assert [w.what for w in warnings] == [f"answer check: {PROBLEM}"]
    assert warnings[0].node == "cluster" and "docs/answers.md" in warnings[0].next


@pytest.mark.parametrize(
    ("recorded", "said"),
    [
        (NO_CLI, "last verdict unknown (no Pulumi CLI"),
        ({"output": {"mode": "off"}}, "no answers recorded (the last `pulumi up` ran with answers.mode off)"),
        ({"output": ERROR}, "not checked (spark-1: could not record (exit 3))"),
        (
            {"output": {**RECORDED, "settings": {**SETTINGS, "max_tokens": 8}}},
            "answers settings changed since",
        ),
    ],
)
def test_what_the_row_says_without_a_verdict_to_trust(recorded, said):
    line, _ = answers_line(config_from(), recorded)
    assert said in line


@pytest.mark.parametrize(("mode", "asked"), [("report", True), ("off", False)])
def test_gather_reads_answers_only_with_the_check_on(monkeypatch, mode, asked):
    raw = dev_raw()
    raw["answers"] = {"mode": mode}
    config = parse_stack_config(raw)
    seen = []
    monkeypatch.setattr(gather, "stack_answers", lambda stack: seen.append(stack) or {"output": RECORDED})
    for name in ("stack_bench", "stack_fabric", "stack_cold_start"):
        monkeypatch.setattr(gather, name, lambda stack: {"output": {}})
    monkeypatch.setattr(gather, "fabric_facts", lambda *a: {})
    monkeypatch.setattr(gather, "ask_node", lambda *a: {"reachable": True})
    monkeypatch.setattr(gather, "server_facts", lambda *a: {})
    gathered = gather.gather(config, None, connect_timeout=1, stack="dev")
    assert seen == (["dev"] if asked else [])
    assert ("answers_output" in gathered) is asked
    verdict = judge(config, {"nodes": {}, "answers_output": {"output": RECORDED}})
    assert ("answers" in verdict.cluster) is asked


def test_the_answers_output_is_read_with_the_pulumi_cli(tmp_path):
    cli = tmp_path / "pulumi"
    cli.write_text(
        '#!/bin/sh\n[ "$1 $2 $3 $4 $5 $6" = "stack output answers --json --stack dev" ] '
        '&& echo \'{"mode": "report"}\' && exit 0\nexit 255\n'
    )
    cli.chmod(0o755)
    assert gather.stack_answers("dev", cwd=tmp_path, which=lambda _: str(cli)) == {
        "output": {"mode": "report"}
    }


def test_the_answers_row_comes_before_the_bench_s_and_only_when_judged():
    verdict = Verdict(cluster={"ray": "ok", "bench": "decode 19.8 tok/s"})
    assert "\nanswers " not in render.text(verdict, "dev")
    verdict.cluster["answers"] = "pass: 9 prompts"
    text = render.text(verdict, "dev")
    assert "\nanswers      pass: 9 prompts" in text and text.index("\nanswers") < text.index("\nbench")
