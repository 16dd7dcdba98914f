"""Progress for the operator during `pulumi up`: the lines, and a running transfer saying them."""

from __future__ import annotations

import io
import sys

import pytest

from components.provider_kit import progress
from components.transfer import watch


@pytest.mark.parametrize(
    ("done", "total", "elapsed", "line"),
    [
        (1_200_000_000, 20_000_000_000, 2.0,
         "image-copy node-a -> node-b: 1200 of 20000 MB (6%), 600 MB/s, ETA 31 s"),
        (5_000_000, 0, 1.0, "image-copy node-a -> node-b: 5 MB, 5 MB/s"),
        (0, 10_000_000, 30.0, "image-copy node-a -> node-b: 0 of 10 MB (0%), 0 MB/s"),
        (10_000_000, 10_000_000, 1.0, "image-copy node-a -> node-b: 10 of 10 MB (100%), 10 MB/s"),
    ],
    ids=["midway", "no-total", "nothing-yet", "done"],
)  # fmt: skip
def test_transfer_line(done, total, elapsed, line):
    assert progress.transfer_line("image-copy", "node-a", "node-b", done, total, elapsed) == line


def test_tell_operator_writes_one_flushed_prefixed_line():
    out = io.StringIO()
    progress.tell_operator("readiness on spark-1: waiting", out)
    assert out.getvalue() == "qwen35: readiness on spark-1: waiting\n"


def watched_python(source: str, stdin: bytes | None = None) -> tuple[watch.Watched, list[tuple]]:
    """`source` run by `run_watched`, and every (bytes done, elapsed, total) it said."""
    said: list[tuple] = []
    outcome = watch.run_watched(
        [sys.executable, "-c", source],
        60,
        30,
        margin_s=5,
        say=lambda done, elapsed, total: said.append((done, elapsed, total)),
        stdin=stdin,
    )
    return outcome, said


def test_a_running_transfer_says_its_latest_byte_count(monkeypatch):
    monkeypatch.setattr(watch, "SAY_EVERY_S", 0.3)
    source = (
        "import sys, time\n"
        "for n in range(1, 9):\n"
        "    sys.stderr.write('qwen35-progress %d\\n' % (n * 1000)); sys.stderr.flush(); time.sleep(0.15)\n"
    )
    outcome, said = watched_python(source)
    assert outcome.returncode == 0 and not outcome.killed
    # Said while it ran (about every 0.3 s of a 1.2 s run), each time the latest count so far.
    assert 2 <= len(said) <= 5, said
    counts = [done for done, _, _ in said]
    assert counts == sorted(counts) and counts[0] >= 1000 and counts[-1] <= 8000
    assert all(elapsed >= 0.3 for _, elapsed, _ in said)
    assert all(total == 0 for _, _, total in said)  # these lines carry no total


def test_a_watched_program_gets_its_stdin_and_says_totals_its_lines_carry(monkeypatch):
    """The Hub fetch's way: a secret on stdin (never an argument), `qwen35-progress <done> <total>`."""
    monkeypatch.setattr(watch, "SAY_EVERY_S", 0.2)
    source = (
        "import sys, time\n"
        "token = sys.stdin.readline().strip()\n"
        "for n in range(1, 7):\n"
        "    sys.stderr.write('qwen35-progress %d 6000\\n' % (n * 1000))\n"
        "    sys.stderr.flush(); time.sleep(0.12)\n"
        "print('{\"got\": %d}' % len(token))\n"
    )
    outcome, said = watched_python(source, stdin=b"hf_secret_token\n")
    assert outcome.returncode == 0 and outcome.stdout.strip() == '{"got": 15}', outcome
    assert said and all(total == 6000 for _, _, total in said) and said[-1][0] <= 6000


def test_operator_progress_names_the_operation_and_both_nodes(capsys):
    from components.remote import SshTarget
    from components.transfer import Endpoint, Stage, Transfer

    job = Transfer("image-copy", (Stage("save", ["true"]),), Stage("load", ["true"]), bytes_total=4_000_000)
    a = Endpoint("node-a", SshTarget("h", "u", "/k"), "10.0.0.1")
    b = Endpoint("node-b", SshTarget("h2", "u", "/k"), "10.0.0.2")
    watch.operator_progress(job, a, b)(1_000_000, 1.0)
    assert (
        capsys.readouterr().err == "qwen35: image-copy node-a -> node-b: 1 of 4 MB (25%), 1 MB/s, ETA 3 s\n"
    )


def test_the_interval_can_be_set_per_call():
    """`copy.progress_interval_s` reaches `watch` as `say_every_s` (the module default is 30 s)."""
    source = (
        "import sys, time\n"
        "for n in range(1, 9):\n"
        "    sys.stderr.write('qwen35-progress %d\\n' % (n * 1000)); sys.stderr.flush(); time.sleep(0.15)\n"
    )
    said = []
    outcome = watch.run_watched(
        [sys.executable, "-c", source],
        60,
        30,
        margin_s=5,
        say=lambda done, elapsed, total: said.append(done),
        say_every_s=0.3,
    )
    assert outcome.returncode == 0 and 2 <= len(said) <= 5, said
