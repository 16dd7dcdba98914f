"""The node proof's program (components/node_programs/node_proof.py) under a real torch (vLLM
0.17.1's venv, as a prebuilt image holds it), two and three ranks on loopback over gloo as the lab
runs it: the group forms and measures, a peer that never joins ends within the bound, and a GPU step
asked for where there is none fails at the GPU, naming it, without joining."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from components.node_programs import program_stdin
from components.node_programs.node_proof import Exit
from components.node_proof import failed_steps
from components.provider_kit.reports import last_json_object
from tests.support.ports import free_port


def spec(rank: int, world: int, port: int, gpu: bool = False, deadline_s: float = 60.0) -> str:
    return json.dumps({
        "node": f"node-{rank}", "rank": rank, "world": world, "master_addr": "127.0.0.1", "port": port,
        "gpu": gpu, "bytes": 4 << 20, "iterations": 3, "deadline_s": deadline_s,
    })  # fmt: skip


def start(python: Path, text: str) -> subprocess.Popen:
    """The program started on its stdin (all ranks start before any is waited for)."""
    proc = subprocess.Popen(
        [str(python), "-", text],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env={"GLOO_SOCKET_IFNAME": "lo", "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    proc.stdin.write(program_stdin("node_proof"))
    proc.stdin.close()
    proc.stdin = None  # communicate() then only reads
    return proc


def finish(proc: subprocess.Popen, timeout: float) -> tuple[int, dict]:
    out, _ = proc.communicate(timeout=timeout)
    report = last_json_object(out.decode(errors="replace"))
    assert report is not None, out[-2000:]
    return proc.returncode, report


@pytest.mark.parametrize("world", [2, 3])
def test_the_ranks_form_the_group_and_measure_its_bus_bandwidth(prebuilt, world):
    port = free_port()
    procs = [start(prebuilt, spec(rank, world, port)) for rank in range(world)]
    done = [finish(proc, 180) for proc in procs]
    for rank, (code, report) in enumerate(done):
        assert code == Exit.OK and failed_steps(report) == [], report
        assert report["steps"]["join"]["backend"] == "gloo" and report["rank"] == rank
        sized = report["steps"]["sized_all_reduce"]
        assert sized["busbw_gbs"] > 0
        # nccl-tests' bus bandwidth: the algorithm bandwidth times 2(n-1)/n (1 at two ranks, 4/3 at three).
        assert sized["busbw_gbs"] == pytest.approx(sized["algbw_gbs"] * 2 * (world - 1) / world)
        assert report["torch"].startswith("2.")


def test_a_peer_that_never_joins_ends_within_the_bound_naming_the_join(prebuilt):
    started = time.monotonic()
    code, report = finish(start(prebuilt, spec(0, 2, free_port(), deadline_s=10)), 120)
    assert code == Exit.FAILED and [step for step, _ in failed_steps(report)] == ["join"], report
    assert time.monotonic() - started < 10 + 60  # the deadline, torch's import and the exit


def test_a_gpu_step_without_a_gpu_fails_there_and_joins_nothing(prebuilt):
    code, report = finish(start(prebuilt, spec(0, 1, free_port(), gpu=True)), 120)
    assert code == Exit.FAILED, report
    assert failed_steps(report)[0][0] == "gpu" and "sees no CUDA device" in failed_steps(report)[0][1]
    assert report["steps"]["join"] == {"ok": False, "error": "not joined: NCCL needs the GPU this node lacks"}


def test_one_node_forms_no_group_and_listens_on_no_port(prebuilt):
    code, report = finish(start(prebuilt, spec(0, 1, free_port())), 120)
    assert code == Exit.OK and failed_steps(report) == [], report
    assert report["steps"]["join"] == {"ok": True, "backend": "gloo", "world": 1, "skipped": "one node"}
