"""`status` and the serve bench: the `bench` row from the stack output `serve_bench` (the last `up`'s
figures, said to be so), a warning per figure below a floor set now, and no row, nothing asked,
under `bench.mode: off`."""

from __future__ import annotations

import pytest

from components.config import parse_stack_config
from status import gather, render
from status.checks import bench_line
from status.verdict import Verdict
from tests.support.program import config_from, dev_raw

FIGURES = {
    "decode_tps": 19.84,
    "ttft_s": 0.412,
    "prefill_tps": 861.7,
    "prompt_tokens": 2048.0,
    "aggregate_tps": 61.2,
    "concurrency": 4.0,
}
SETTINGS = {"output_tokens": 256, "prompt_tokens": 2048, "concurrency": 4, "deadline_s": 600}
# 2026-12-05 10:00 UTC
RECORDED = {
    "mode": "report",
    "settings": SETTINGS,
    "figures": FIGURES,
    "verdict": "measured",
    "measured_at": 1796464800,
}


def test_the_row_says_the_figures_are_the_last_up_s():
    line, warnings = bench_line(config_from(), {"output": RECORDED})
    assert line == (
        "decode 19.8 tok/s (TTFT 0.41 s), prefill 862 tok/s (2048 tokens), 4 streams 61.2 tok/s "
        "(measured by `pulumi up` 2026-12-05 10:00 UTC, not now)"
    )
    assert warnings == []


def test_a_floor_set_now_that_the_recorded_figure_misses_warns():
    config = config_from(bench={"min_decode_tps": 25, "max_ttft_s": 1})
    line, warnings = bench_line(config, {"output": RECORDED})
    assert [w.what for w in warnings] == [
        "serve bench: decode 19.84 tokens/s is below bench.min_decode_tps 25 tokens/s"
    ]
    assert warnings[0].node == "cluster" and "docs/bench.md" in warnings[0].next


FAILED = {
    **RECORDED,
    "figures": None,
    "verdict": "failed",
    "error": "node-a: could not measure (exit 3)\n...",
}
NO_CLI = {"error": "no Pulumi CLI here to read the stack output `serve_bench`"}


@pytest.mark.parametrize(
    ("recorded", "said"),
    [
        (NO_CLI, "last figures unknown (no Pulumi CLI"),
        ({"output": {"mode": "off"}}, "no figures recorded (the last `pulumi up` ran with bench.mode off)"),
        ({"output": FAILED}, "not measured by the last `pulumi up`: node-a: could not measure (exit 3)"),
        ({"output": {**RECORDED, "settings": {**SETTINGS, "concurrency": 8}}}, "bench settings changed"),
    ],
)
def test_what_the_row_says_without_figures_to_trust(recorded, said):
    line, _ = bench_line(config_from(), recorded)
    assert said in line


@pytest.mark.parametrize(("mode", "asked"), [("report", True), ("off", False)])
def test_gather_reads_serve_bench_only_with_the_bench_on(monkeypatch, mode, asked):
    raw = dev_raw()
    raw["bench"] = {"mode": mode}
    config = parse_stack_config(raw)
    seen = []
    monkeypatch.setattr(gather, "stack_bench", lambda stack: seen.append(stack) or {"output": RECORDED})
    monkeypatch.setattr(gather, "stack_fabric", lambda stack: {"output": {}})
    monkeypatch.setattr(gather, "fabric_facts", lambda *a: {})
    monkeypatch.setattr(gather, "ask_node", lambda *a: {"reachable": True})
    monkeypatch.setattr(gather, "server_facts", lambda *a: {})
    gathered = gather.gather(config, None, connect_timeout=1, stack="dev")
    assert seen == (["dev"] if asked else [])
    assert ("bench_output" in gathered) is asked


def test_the_serve_bench_output_is_read_with_the_pulumi_cli(tmp_path):
    cli = tmp_path / "pulumi"
    cli.write_text(
        '#!/bin/sh\n[ "$1 $2 $3 $4 $5 $6" = "stack output serve_bench --json --stack dev" ] '
        '&& echo \'{"mode": "report"}\' && exit 0\nexit 255\n'
    )
    cli.chmod(0o755)
    assert gather.stack_bench("dev", cwd=tmp_path, which=lambda _: str(cli)) == {"output": {"mode": "report"}}


def test_the_bench_row_is_rendered_only_when_judged():
    verdict = Verdict(cluster={"ray": "ok"})
    assert "\nbench " not in render.text(verdict, "dev")
    verdict.cluster["bench"] = "decode 19.8 tok/s"
    assert "\nbench        decode 19.8 tok/s" in render.text(verdict, "dev")
