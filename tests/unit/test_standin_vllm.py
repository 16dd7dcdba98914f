"""The lab's stand-in `vllm` and its image: the pure parts (flags, cluster check, answers, build context)."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from components.vllm_server import serve_argv
from lab.layout import LabError
from lab.ray_image import IMAGE_NAME, build_context, check_host_python, dockerfile, image_tag
from lab.standin_vllm import (
    FAULT_PATH,
    JOIN_TIMEOUT_ENV,
    STANDIN_NOTE,
    bearer_ok,
    cluster_summary,
    completion_response,
    judge_join,
    models_response,
    parse_serve_args,
    prompt_text,
)
from tests.support.health_lab import wait_for
from tests.support.ports import free_port
from tests.support.program import stack_config


def lab_serve_argv() -> list[str]:
    from components.config import parse_stack_config

    raw = {key.split(":", 1)[1]: value for key, value in stack_config("lab").items()}
    return serve_argv(parse_stack_config(raw).serve)


def test_the_program_s_own_serve_command_parses():
    argv = lab_serve_argv()
    assert argv[:2] == ["vllm", "serve"]
    args = parse_serve_args(argv[1:], env={"VLLM_API_KEY": "k"})
    assert args.world_size == 2
    assert args.served_names == ("qwen3.5-lab",)
    assert (args.host, args.port, args.backend, args.api_key) == ("127.0.0.2", 18000, "ray", "k")
    assert args.ignored == ()


def test_flags_it_does_not_model_are_kept_and_reported():
    args = parse_serve_args(["serve", "m", "-tp", "4", "-pp", "2", "--enable-prefix-caching"], env={})
    assert args.world_size == 8 and args.ignored == ("--enable-prefix-caching",) and args.api_key is None


def test_multi_gpu_needs_the_ray_backend():
    with pytest.raises(SystemExit, match="ray"):
        parse_serve_args(["serve", "m", "-tp", "2", "--distributed-executor-backend", "mp"], env={})


def test_cluster_summary_counts_alive_nodes_and_their_gpus():
    nodes = [
        {"Alive": True, "NodeManagerAddress": "10.0.0.1", "Resources": {"GPU": 1.0, "CPU": 20}},
        {"Alive": False, "NodeManagerAddress": "10.0.0.2", "Resources": {"GPU": 1.0}},
        {"Alive": True, "NodeManagerAddress": "10.0.0.3", "Resources": {"CPU": 20}},
    ]
    assert cluster_summary(nodes) == (2, 1.0, "10.0.0.1: 1 GPU, 10.0.0.3: 0 GPU")
    assert cluster_summary([]) == (0, 0.0, "none")


@pytest.mark.parametrize(
    ("header", "key", "ok"),
    [(None, None, True), ("Bearer k", "k", True), ("Bearer x", "k", False), (None, "k", False)],
)
def test_api_key_rule_is_vllms(header, key, ok):
    assert bearer_ok(header, key) is ok


def test_answers_say_they_come_from_a_stand_in():
    args = parse_serve_args(["serve", "org/model", "--served-model-name", "a", "b"], env={})
    models = models_response(args, 0)
    assert [m["id"] for m in models["data"]] == ["a", "b"] and models["standin"] == STANDIN_NOTE
    answer = completion_response("a", "hi there", ["rank 0@10.0.0.1 read 2 words"], None)
    assert STANDIN_NOTE in answer["choices"][0]["message"]["content"]
    assert answer["usage"]["completion_tokens"] > 0 and answer["standin"] == STANDIN_NOTE
    short = completion_response("a", "hi", ["x"], 3)
    assert short["usage"]["completion_tokens"] == 3


def test_prompt_is_the_last_user_message_in_either_content_form():
    messages = [
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": [{"type": "text", "text": "second"}]},
    ]
    assert prompt_text(messages) == "second"
    assert prompt_text([]) == ""


def test_build_context_is_byte_identical_for_identical_inputs(tmp_path: Path):
    (tmp_path / "ray-1.0-py3-none-any.whl").write_bytes(b"wheel")
    first = build_context(tmp_path, b"print('standin')\n")
    assert first == build_context(tmp_path, b"print('standin')\n")
    with tarfile.open(fileobj=io.BytesIO(first)) as tar:
        names = tar.getnames()
    assert names == [
        "Dockerfile",
        "standin/standin_vllm.py",
        "standin/vllm",
        "wheels/ray-1.0-py3-none-any.whl",
    ]
    tag = image_tag(first, "rootfs:1")
    assert tag.startswith(f"{IMAGE_NAME}:") and tag != image_tag(first, "rootfs:2")
    assert tag != image_tag(build_context(tmp_path, b"changed\n"), "rootfs:1")


def test_build_installs_offline_and_keeps_wheels_out_of_the_image():
    text = dockerfile()
    assert "--no-index" in text and "--find-links /wheels" in text
    final_stage = text.split("\nFROM ", 2)[-1]
    assert "/wheels" not in final_stage and "vllm serve --help" in final_stage


def test_host_python_must_match_the_image_s():
    check_host_python((3, 11), (2, 36))
    with pytest.raises(LabError, match="3.12"):
        check_host_python((3, 12), (2, 36))
    with pytest.raises(LabError, match="glibc"):
        check_host_python((3, 11), (2, 39))


# ---- multi-node (executor mp): the stand-in as vLLM's own executor, head and headless ranks as processes --

STANDIN = Path(__file__).resolve().parents[2] / "lab" / "standin_vllm.py"
LOOPBACK = "127.0.0.1"


@dataclass
class Group:
    """A multi-node stand-in group on loopback: the head's API port, its master port, the model dir."""

    model: Path
    api_port: int
    master_port: int
    procs: list[subprocess.Popen] = field(default_factory=list)

    def argv(self, nnodes: int, rank: int, tp: int | None = None) -> list[str]:
        argv = [
            sys.executable, str(STANDIN), "serve", str(self.model),
            "--tensor-parallel-size", str(tp or nnodes), "--distributed-executor-backend", "mp",
            "--host", LOOPBACK, "--port", str(self.api_port), "--served-model-name", "m",
            "--nnodes", str(nnodes), "--node-rank", str(rank),
            "--master-addr", LOOPBACK, "--master-port", str(self.master_port),
        ]  # fmt: skip
        return argv + (["--headless"] if rank else [])

    def start(self, nnodes: int, rank: int, tp: int | None = None, timeout_s: float = 20) -> subprocess.Popen:
        env = {**os.environ, JOIN_TIMEOUT_ENV: str(timeout_s)}
        proc = subprocess.Popen(
            self.argv(nnodes, rank, tp), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        self.procs.append(proc)
        return proc

    def get(self, path: str) -> int | None:
        """The HTTP status of GET `path` on the head's API, or None while nothing listens."""
        try:
            with urllib.request.urlopen(f"http://{LOOPBACK}:{self.api_port}{path}", timeout=5) as answer:
                return answer.status
        except urllib.error.HTTPError as exc:
            return exc.code
        except OSError:
            return None

    def wait_serving(self, head: subprocess.Popen, within_s: float = 20) -> None:
        deadline = time.monotonic() + within_s
        while self.get("/health") != 200:
            assert head.poll() is None, f"the head exited {head.returncode}:\n{head.stdout.read()}"
            assert time.monotonic() < deadline, "the head did not serve in time"
            time.sleep(0.2)

    def complete(self) -> str:
        body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hello there"}]}).encode()
        request = urllib.request.Request(
            f"http://{LOOPBACK}:{self.api_port}/v1/chat/completions",
            body,
            {"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10) as answer:
            return json.loads(answer.read())["choices"][0]["message"]["content"]


def exit_of(proc: subprocess.Popen, within_s: float = 20) -> tuple[int, str]:
    """(exit status, output) of a process that must end within `within_s`."""
    try:
        out, _ = proc.communicate(timeout=within_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        raise AssertionError(f"still running after {within_s} s:\n{out}") from None
    return proc.returncode, out


@pytest.fixture
def group(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "qwen3_5_moe"}))
    made = Group(model, free_port(), free_port())
    yield made
    for proc in made.procs:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


def test_two_nodes_serve_a_completion_answered_by_both_and_a_dead_rank_ends_the_head(group):
    rank = group.start(2, 1)  # the deployment creates the headless rank first
    head = group.start(2, 0)
    group.wait_serving(head)
    content = group.complete()
    assert "node rank 0 (ranks 0-0)" in content and "node rank 1 (ranks 1-1)" in content, content
    rank.kill()
    code, out = exit_of(head)
    assert code == 1 and "node rank 1 is gone" in out and "engine dead" in out, out


def test_three_nodes_serve_nothing_before_the_last_rank_joins(group):
    group.start(3, 1)
    head = group.start(3, 0)
    time.sleep(2)  # the head runs with one of two headless ranks joined
    assert head.poll() is None and group.get("/health") is None, "the head served before every rank joined"
    group.start(3, 2)
    group.wait_serving(head)
    assert all(f"node rank {r}" in group.complete() for r in range(3))


def test_a_headless_rank_exits_when_the_head_is_gone(group):
    rank = group.start(2, 1)
    head = group.start(2, 0)
    group.wait_serving(head)
    head.kill()
    code, out = exit_of(rank)
    assert code == 1 and "the head closed the process group" in out, out


@pytest.mark.parametrize(
    ("case", "ranks", "expected"),
    [
        ("wrong world size", [(1, 4)], "node rank 1 joined with world_size=4 over nnodes=2"),
        ("duplicate rank", [(1, None), (1, None)], "node rank 1 joined twice"),
    ],
)
def test_a_bad_join_makes_the_head_exit_with_vllm_s_kind_of_error(group, case, ranks, expected):
    nnodes = 2 if case == "wrong world size" else 3
    head = group.start(nnodes, 0)
    for rank, tp in ranks:
        group.start(nnodes, rank, tp=tp)
    code, out = exit_of(head)
    assert code == 1 and expected in out, f"{case}:\n{out}"
    assert group.get("/health") is None


def test_a_rank_that_never_joins_makes_the_head_exit_at_its_deadline(group):
    head = group.start(3, 0, timeout_s=2)
    group.start(3, 1)
    code, out = exit_of(head)
    assert code == 1 and "node ranks [2] never joined the process group" in out and "within 2 s" in out, out


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--nnodes", "2", "--node-rank", "2", "--headless"], "node_rank=2 must be less than nnodes=2."),
        (["-tp", "3", "--nnodes", "2"], "world_size=3 must be divisible by nnodes=2."),
        (["--nnodes", "2", "--distributed-executor-backend", "ray"], "nnodes > 1 can only be set"),
        (["--nnodes", "2", "--node-rank", "1"], "--headless goes with --node-rank > 0"),
        (["--headless"], "--headless needs --nnodes > 1"),
    ],
)
def test_multi_node_flags_are_checked_as_vllm_checks_them(flags, expected):
    backend = [] if "--distributed-executor-backend" in flags else ["--distributed-executor-backend", "mp"]
    with pytest.raises(SystemExit) as info:
        parse_serve_args(["serve", "m", "-tp", "2", *backend, *flags], env={})
    assert expected in str(info.value)


def test_the_program_s_mp_command_lines_parse_as_head_and_headless_ranks():
    from components.config import parse_stack_config
    from components.mp_executor import mp_serve_argv
    from tests.support.program import mp_raw

    cfg = parse_stack_config(mp_raw(3))
    parsed = [parse_serve_args(mp_serve_argv(cfg, node)[1:], env={}) for node in cfg.nodes]
    assert [(a.node_rank, a.headless, a.nnodes) for a in parsed] == [
        (0, False, 3),
        (1, True, 3),
        (2, True, 3),
    ]
    assert {(a.master_addr, a.master_port, a.world_size) for a in parsed} == {("192.168.200.12", 29501, 3)}


def test_the_head_judges_a_join_by_world_size_rank_and_duplicates():
    head = parse_serve_args(
        ["serve", "m", "-tp", "4", "--distributed-executor-backend", "mp", "-n", "2"], env={}
    )
    good = {"node_rank": 1, "nnodes": 2, "world_size": 4}
    assert judge_join(head, good, set()) is None
    assert "joined twice" in judge_join(head, good, {1})
    assert "world_size=2" in judge_join(head, {**good, "world_size": 2}, set())
    assert "nnodes=3" in judge_join(head, {**good, "nnodes": 3}, set())
    assert "headless ranks are 1..1" in judge_join(head, {**good, "node_rank": 0}, set())


# ---- the health tests' faults: hang, crash, slow ----------------------------------------------------------


def test_the_leak_lowers_memavailable_in_place_and_never_gives_it_back(tmp_path):
    from lab.standin_vllm import LEAK_ENV, MEMINFO_ENV, leak

    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:  1000000 kB\nMemAvailable:   97656250 kB\n")
    inode = meminfo.stat().st_ino
    env = {MEMINFO_ENV: str(meminfo), LEAK_ENV: str(20 * 10**9)}
    assert leak(env) == 78125000 * 1024
    assert leak(env) == 58593750 * 1024 == 60 * 10**9
    assert "MemTotal:  1000000 kB" in meminfo.read_text() and meminfo.stat().st_ino == inode
    assert leak({}) is None


def test_faults_slow_and_unknown():
    from lab.standin_vllm import Faults, metrics_text

    faults = Faults()
    assert faults.apply({"mode": "slow", "delay_s": 2, "health_delay_s": 0.5})[0] == 200
    assert (faults.delay_s, faults.health_delay_s) == (2.0, 0.5)
    assert faults.apply({"mode": "melt"})[0] == 400
    assert faults.apply({"mode": "slow_stop"})[0] == 200 and faults.stop_s == 45.0
    args = parse_serve_args(["serve", "m", "--served-model-name", "q"], env={})
    assert 'vllm_standin_requests_total{model_name="q"} 0' in metrics_text(faults, args)


@pytest.mark.parametrize("stop_s", [0, 2])
def test_sigterm_ends_the_server_at_once_or_after_the_slow_stop_fault_with_its_port_closed(group, stop_s):
    """The lab's slow stop (tests/lab/test_health.py): a vLLM that drains after SIGTERM, its port
    closed, then exits; without the fault SIGTERM ends it at once, as Python's default does."""
    group.start(2, 1)
    head = group.start(2, 0)
    group.wait_serving(head)
    if stop_s:
        body = json.dumps({"mode": "slow_stop", "stop_s": stop_s}).encode()
        request = urllib.request.Request(f"http://{LOOPBACK}:{group.api_port}{FAULT_PATH}", body)
        with urllib.request.urlopen(request, timeout=5) as answer:
            assert answer.status == 200
    sent = time.monotonic()
    head.terminate()
    if not stop_s:
        assert exit_of(head, 10)[0] == -15
        return
    while group.get("/health") is not None:
        assert time.monotonic() - sent < 1.5, "the port stayed open after SIGTERM"
        time.sleep(0.1)
    assert head.poll() is None, "it exited at once"
    code, out = exit_of(head, 10)
    assert code == 0 and time.monotonic() - sent >= stop_s and "(fault slow_stop)" in out, out


def test_the_oom_fault_takes_its_bytes_in_the_server_and_its_engine_core_s_end_ends_the_server(group):
    """The lab's real OOM kill (tests/lab/test_health.py) without a memory limit: the serving process
    holds the bytes and serves on; the child that stands for vLLM's engine core holds them too, and when
    it is killed (there by the OOM killer, here by this test) the server exits 1, as vLLM's does."""
    from lab.standin_vllm import Faults

    faults = Faults()
    assert faults.apply({"mode": "oom", "bytes": 4096})[0] == 200
    wait_for(lambda: len(faults.held) == 4096, 5, "the server never took the bytes")
    group.start(2, 1)
    head = group.start(2, 0)
    group.wait_serving(head)
    body = json.dumps({"mode": "oom", "bytes": 1 << 20, "child": True}).encode()
    request = urllib.request.Request(f"http://{LOOPBACK}:{group.api_port}{FAULT_PATH}", body)
    with urllib.request.urlopen(request, timeout=5) as answer:
        assert answer.status == 200
    children = []

    def core_started() -> bool:  # pgrep: Linux's procps and macOS alike
        children[:] = subprocess.run(
            ["pgrep", "-P", str(head.pid)], capture_output=True, text=True
        ).stdout.split()
        return bool(children)

    wait_for(core_started, 10, "no engine core child")
    assert group.get("/health") == 200  # the child alone holds the memory: the server serves on
    os.kill(int(children[0]), signal.SIGKILL)
    code, out = exit_of(head, 10)
    assert code == 1 and f"engine core (pid {children[0]}) ended with -9" in out, out
