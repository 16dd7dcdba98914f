"""The serving path against vLLM itself: the real CLI deploys engine/real_vllm.yaml (vLLM's CPU build,
a tiny real Qwen3.5-MoE, two ranks under executor mp on node-a and node-b) and every promise that
the stand-in server used to stand for is checked on what vLLM does: the model-support check in
`enforce` runs the image's real vLLM; the readiness gate passes on a completion vLLM generated and
fails `up` on one vLLM cannot generate, naming vLLM's own error; Prometheus scrapes vLLM's own
`/metrics` from `scrape_targets`; `status` shows each rank; a rank stopped by hand is drift that `up`
undoes, and the world serves again."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

import lab
from engine.lab_stack import real_engine_config, write_config
from tests.engine.conftest import (
    CONTAINER,
    NODE_IMAGE,
    RealStack,
    changed_steps,
    changes,
    errors,
    exported,
    finished,
    real_stack_up,
)
from tests.engine.conftest import up_or_fail as up

pytestmark = pytest.mark.engine

NS = "qwen35-spark"
HEAD, RANK1 = "qwen35-vllm", "qwen35-vllm-rank1"
R_RANK1 = "qwen35-vllm-headless-node-b"


@pytest.fixture(scope="module")
def real_stack(engine, lab_nodes, real_image, real_hub, real_reference, secrets) -> Iterator[RealStack]:
    try:
        with real_stack_up(engine, "engine-real", real_image, real_hub, secrets, real_reference) as made:
            yield made
    finally:  # the upgrade's tag (its layer is a few bytes), once the stack that used it is destroyed
        for node in lab_nodes.values():
            for tag in lab.docker(node, "images", "--format", "{{.Repository}}:{{.Tag}}").out.split():
                if tag.startswith(f"{real_image.rpartition(':')[0]}:{UPGRADE}"):
                    lab.docker(node, "image", "rm", tag, check=False)


# The tag of the upgrade's image: the real image plus one new top layer (test_an_upgrade_…).
UPGRADE = "upgrade-"


def served_image(real_stack: RealStack) -> str:
    """The image the stack's config names now: the real image until the upgrade test moves it on, so
    the tests after it change only what they mean to."""
    return yaml.safe_load(real_stack.stack.config.read_text())["config"][f"{NS}:image"]["prebuilt"]


def request(url: str, api_key: str, body: dict | None = None, timeout: float = 60) -> tuple[int, dict]:
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Authorization": f"Bearer {api_key}", "Content-Type": "application/json"}
    call = urllib.request.Request(url, data=data, headers=headers)
    with urllib.request.urlopen(call, timeout=timeout) as answer:
        return answer.status, json.loads(answer.read())


def completion(real_stack, max_tokens: int = 8) -> dict:
    outputs = real_stack.stack.run("stack", "output", "--json").json()
    body = {"model": outputs["served_model"], "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": max_tokens, "temperature": 0}  # fmt: skip
    status, reply = request(f"{outputs['endpoint']}/chat/completions", real_stack.api_key, body)
    assert status == 200, reply
    return reply


def running(node: lab.LabNode, name: str) -> bool:
    found = lab.docker(node, "inspect", "--format", "{{.State.Running}}", name, check=False)
    return found.out.strip() == "true"


def test_the_first_up_serves_a_completion_vllm_generated_with_one_rank_on_each_node(real_stack, lab_nodes):
    created = [n for t, n, op in finished(real_stack.first_up) if op == "create" and t == CONTAINER]
    assert created.index(R_RANK1) < created.index(HEAD), created
    assert running(lab_nodes["node-a"], HEAD) and running(lab_nodes["node-b"], RANK1)
    reply = completion(real_stack)
    # vLLM's own fields, which no stand-in writes: the stop reason and the prompt log-probabilities.
    assert "stop_reason" in reply["choices"][0] and "prompt_logprobs" in reply, reply
    assert reply["usage"]["completion_tokens"] >= 1, reply
    outputs = real_stack.stack.run("stack", "output", "--json").json()
    status, models = request(f"{outputs['endpoint']}/models", real_stack.api_key)
    (model,) = models["data"]
    assert model["owned_by"] == "vllm" and model["max_model_len"] == 512, model
    # The headless rank is vLLM's own: its log says it joined as node rank 1 of 2.
    log = lab.docker(lab_nodes["node-b"], "logs", RANK1, check=False)
    assert "vllm" in (log.out + log.err).lower(), (log.out + log.err)[-2000:]


def test_the_model_support_check_ran_the_image_s_vllm_in_enforce_and_passed(real_stack):
    outputs = real_stack.stack.run("stack", "output", "--json").json()
    check = outputs["model_support"]
    assert check["verdict"] == "pass", check
    assert (
        check["vllm"].startswith("0.32.0") and check["architecture"] == "Qwen3_5MoeForConditionalGeneration"
    ), check
    # The tiny checkpoint is BF16 and fits: the memory fit read its index on the head. (The lab tier
    # proves the refusals; this pass is the one the real stack needs, so it is proven here alone.)
    assert check["quantization"] is None and check["memory_fit"]["fits"] is True, check
    # Each rank's own command line was proven by the image's vLLM: the head's and node-b's headless one.
    ranks = check["serve_args"]["ranks"]
    assert {node: r["verdict"] for node, r in ranks.items()} == {"node-a": "pass", "node-b": "pass"}, check


def test_the_node_proof_ran_the_image_s_torch_on_both_nodes_before_any_serving_container(real_stack):
    done = finished(real_stack.first_up)
    names = [n for _, n, _ in done]
    first_container = min(i for i, (t, _, op) in enumerate(done) if t == CONTAINER and op == "create")
    assert names.index("qwen35-node-proof") < first_container, done
    proof = real_stack.stack.run("stack", "output", "fabric", "--json").json()["proof"]
    # The lab's exact verdict: no GPU step (containers.gpu_runtime false), gloo over loopback.
    assert (proof["mode"], proof["verdict"], proof["backend"], proof["problems"]) == (
        "enforce", "passed", "gloo", []
    ), proof  # fmt: skip
    assert set(proof["results"]) == {"node-a", "node-b"} and proof["busbw_gbs"] > 0, proof
    for name, result in proof["results"].items():
        # (the engine keeps no null output: `gpu` is absent where no GPU step ran)
        assert (result["network"], result.get("gpu"), result["failed"]) == ("gloo", None, []), (name, result)
        assert result["torch"].startswith("2."), (name, result)


def test_the_gate_recorded_what_the_serving_ranks_said_about_their_transport(real_stack):
    """The serving ranks' own group, read from each rank's log by the gate: the CPU build has no NCCL,
    so each node's ranks said gloo, and that passes under enforce."""
    serving = real_stack.stack.run("stack", "output", "fabric", "--json").json()["serving"]
    assert set(serving) == {"node-a", "node-b"}, serving
    for name, record in serving.items():
        assert (record["backend"], record["said"], record["verdict"]) == (
            "gloo", "gloo, no NCCL lines", "pass"
        ), (name, record)  # fmt: skip


def test_the_bench_measured_vllm_s_own_speed_after_the_gate(real_stack):
    bench = real_stack.stack.run("stack", "output", "serve_bench", "--json").json()
    figures = bench["figures"]
    assert bench["error"] is None and figures["counted"] == "usage", bench
    for key in ("decode_tps", "ttft_s", "prefill_tps", "aggregate_tps"):
        assert figures[key] > 0, (key, bench)
    assert figures["concurrency"] == 2 and 200 <= figures["prompt_tokens"] <= 300, bench
    print(f"real engine bench: {json.dumps(figures)}")


def answers_output(real_stack) -> dict:
    return real_stack.stack.run("stack", "output", "answers", "--json").json()


def test_the_answer_check_held_vllm_s_answers_to_transformers_on_the_same_checkpoint(real_stack):
    """Two vLLM ranks (BF16, tensor-parallel over gloo) against one transformers process (float32)
    on the same checkpoint files, by teacher forcing, under enforce: the first `up` passed it."""
    names = [n for _, n, _ in finished(real_stack.first_up)]
    assert names.index("qwen35-ready") < names.index("qwen35-answers") < names.index("qwen35-bench"), names
    answers = answers_output(real_stack)
    assert (answers["mode"], answers["verdict"], answers["problems"]) == ("enforce", "pass", []), answers
    assert answers["judged_against"][:1] == ["reference"] and "self" in answers["judged_against"], answers
    assert len(answers["receipts"]) == 9 and all(r["generated"] for r in answers["receipts"]), answers
    # Every position of the reference's continuations was scored by the served model.
    findings = answers.get("findings") or []
    assert all(f["kind"] == "tie" for f in findings), findings
    # A model of noise knows no answer: the scoring ran, and says so.
    assert (answers["known_answers"]["correct"], answers["known_answers"]["of"]) == (0, 5), answers
    said = f"{answers['judged_against']}, {len(findings)} near-tie(s), {answers['elapsed_s']}s"
    print(f"real engine answers: {said}")


def started_at(node: lab.LabNode, name: str) -> str:
    return lab.docker(node, "inspect", "--format", "{{.State.StartedAt}}", name).out.strip()


def test_the_gate_recorded_the_start_s_cold_start_from_vllm_s_own_log(real_stack, lab_nodes):
    from components.node_programs.cold_start import parse_stamp

    record = real_stack.stack.run("stack", "output", "cold_start", "--json").json()
    assert record["missing"] == [] and "error" not in record, record
    assert record["started_at"] == round(parse_stamp(started_at(lab_nodes["node-a"], HEAD)), 3), record
    # vLLM's order: the weights, then the engine (KV cache, warm-up), then the API; the gate waited
    # from before the API was ready, so its completion is the start's first.
    figures = [record[k] for k in ("weights_loaded_s", "engine_ready_s", "api_ready_s", "first_completion_s")]
    assert 0 < figures[0] <= figures[1] <= figures[2] <= figures[3], record
    assert record["vllm"]["load_weights_s"] >= 0 and record["vllm"]["init_engine_s"] > 0, record
    print(f"real engine cold start: {json.dumps(record)}")


def test_a_no_op_up_changes_nothing_and_measures_nothing(real_stack):
    before = real_stack.stack.run("stack", "output", "serve_bench", "--json").json()
    run = up(real_stack.stack)
    assert changed_steps(run) == [], changed_steps(run)
    assert real_stack.stack.run("stack", "output", "serve_bench", "--json").json() == before


def test_refresh_after_the_first_up_is_clean(real_stack):
    clean = real_stack.stack.run(
        "refresh", "--yes", "--skip-preview", "--expect-no-changes", "--json", check=False
    )
    assert clean.returncode == 0, changes(clean.events())


def test_prometheus_scrapes_vllm_s_own_metrics_from_scrape_targets(real_stack, tmp_path):
    binary = shutil.which("prometheus")
    assert binary, "prometheus is not installed: `make setup` (LAB_DEBS) installs Debian's package"
    from tests.support.ports import free_port

    targets = real_stack.stack.run("stack", "output", "scrape_targets", "--json").json()
    (tmp_path / "targets.json").write_text(json.dumps(targets))
    (tmp_path / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s, scrape_timeout: 1s}\nscrape_configs:\n  - job_name: qwen35\n"
        f"    file_sd_configs: [{{files: ['{tmp_path / 'targets.json'}'], refresh_interval: 1s}}]\n"
    )
    port = free_port("127.0.0.1")
    with open(tmp_path / "prometheus.log", "w") as log:
        prometheus = subprocess.Popen(
            [binary, f"--config.file={tmp_path / 'prometheus.yml'}",
             f"--storage.tsdb.path={tmp_path / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
            stdout=subprocess.DEVNULL, stderr=log,
        )  # fmt: skip
    try:
        completion(real_stack)
        query = f"http://127.0.0.1:{port}/api/v1/query?query="
        deadline, found = time.monotonic() + 60, []
        while time.monotonic() < deadline and not found:
            time.sleep(1)
            try:
                _, body = request(query + "vllm:generation_tokens_total", real_stack.api_key, timeout=5)
                found = body["data"]["result"]
            except OSError:
                continue
        assert found, (tmp_path / "prometheus.log").read_text()[-2000:]
        assert sum(float(sample["value"][1]) for sample in found) >= 1, found
    finally:
        prometheus.terminate()
        prometheus.wait(timeout=10)


def test_status_shows_each_rank_and_the_serving_engine(real_stack):
    argv = [sys.executable, "-m", "status", "--file", str(real_stack.stack.config), "--connect-timeout", "5"]
    env = {**real_stack.stack.engine.env(), "QWEN35_API_KEY": real_stack.api_key}
    # The operator's `pulumi` on PATH: status reads the stack outputs (`serve_bench`, `cold_start`) with it.
    env["PATH"] = f"{real_stack.stack.engine.pulumi.parent}{os.pathsep}{env.get('PATH', os.environ['PATH'])}"
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=180, env=env, cwd=root)
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-2000:])
    table = done.stdout
    for line in ("0 (serves the API)", "1 (headless)", HEAD, RANK1):
        assert line in table, table[-3000:]
    # The engine answered what status asks of it: /health, the model list and a completion.
    assert "completion" in table and "executor mp" in table, table[-3000:]
    # The gate's cold start of this server, from vLLM's own lines, and the bench's figures.
    assert "measured by the readiness gate of `pulumi up`" in table and "first completion" in table, table
    assert "measured by `pulumi up`" in table and "decode" in table, table
    assert "passed over gloo: node-a gloo, node-b gloo; " in table, table
    assert "node-a gloo, no NCCL lines; node-b gloo, no NCCL lines (their logs" in table, table
    assert "pass: 9 prompts against reference and self" in table, table
    report = json.loads(subprocess.run([*argv, "--json"], capture_output=True, text=True, timeout=180,
                                       env=env, cwd=root).stdout)  # fmt: skip
    assert HEAD in json.dumps(report) and RANK1 in json.dumps(report)


def test_a_rank_stopped_by_hand_is_drift_and_up_brings_the_world_back(real_stack, lab_nodes):
    outputs = real_stack.stack.run("stack", "output", "--json").json()
    hello = [{"role": "user", "content": "hi"}]
    body = {"model": outputs["served_model"], "messages": hello, "max_tokens": 1}
    lab.docker(lab_nodes["node-b"], "stop", RANK1)
    # vLLM's head exits once its peer is gone (its process group broke) and a request finds its engine
    # dead, as a client's would (the test does not count on the watchdog's probes to be that request).
    deadline = time.monotonic() + 120
    while running(lab_nodes["node-a"], HEAD) and time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError):
            request(f"{outputs['endpoint']}/chat/completions", real_stack.api_key, body, timeout=10)
        time.sleep(1)
    assert not running(lab_nodes["node-a"], HEAD), "the head still runs 120 s after its peer was stopped"
    refreshed = real_stack.stack.run("refresh", "--yes", "--skip-preview", "--json", check=False, timeout=900)
    assert refreshed.returncode == 0, refreshed.err[-3000:]
    assert changes(refreshed.events()).get(R_RANK1) == "update", changes(refreshed.events())
    up(real_stack.stack)
    assert running(lab_nodes["node-b"], RANK1) and running(lab_nodes["node-a"], HEAD)
    completion(real_stack)


# ---- the watchdog against vLLM itself (health.mode enforce from here on) ---------------------------

# Real starts take one to three minutes on one core each; a completion of 4 tokens well under a second.
HEALTH = {
    "mode": "enforce",
    "interval_s": 2,
    "deadline_s": 1,
    "completion_every": 1,
    "completion_deadline_s": 15,
    "failures": 2,
    "startup_s": 400,
    "ready_s": 400,
    "memory_wait_s": 10,
    "max_restarts": 6,
    "window_s": 3600,
}


def state_url(real_stack) -> str:
    return real_stack.stack.run("stack", "output", "--json").json()["health"]["state_url"]


def state_of(real_stack, url: str | None = None) -> dict:
    with urllib.request.urlopen(url or state_url(real_stack), timeout=5) as answer:
        return json.loads(answer.read())


def wait_state(real_stack, ok, timeout: float, what: str) -> dict:
    """The watchdog's state once `ok` holds, read every second from its URL (asked of the CLI once)."""
    last: dict = {}
    url = state_url(real_stack)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            last = state_of(real_stack, url)
            if ok(last):
                return last
        except (OSError, ValueError) as exc:
            last = {"error": str(exc)}
        time.sleep(1)
    pytest.fail(f"the watchdog did not reach {what} in {timeout:g} s: {last}", pytrace=False)


def health_status(real_stack) -> int:
    endpoint = real_stack.stack.run("stack", "output", "--json").json()["endpoint"]
    with urllib.request.urlopen(endpoint.removesuffix("/v1") + "/health", timeout=2) as answer:
        return answer.status


def engine_pids(node: lab.LabNode, container: str, name: str) -> list[int]:
    """Host pids of `container`'s processes named `name` (the lab's nodes share this machine's kernel)."""
    top = lab.docker(node, "top", container, "-eo", "pid,comm").out.splitlines()[1:]
    return [int(line.split()[0]) for line in top if line.split()[1:] and line.split()[1].startswith(name)]


def test_the_watchdog_takes_over_without_touching_the_serving_containers(
    real_stack, real_hub, real_reference
):
    stack = real_stack.stack
    config = real_engine_config(served_image(real_stack), real_hub.endpoint, real_reference, health=HEALTH)
    write_config(stack.config, config)
    run = up(stack)
    touched = {n for t, n, op in finished(run) if t == CONTAINER and op not in ("same", "read", "refresh")}
    assert touched and not touched & {HEAD, R_RANK1}, touched
    wait_state(
        real_stack, lambda s: s.get("state") == "healthy" and s.get("mode") == "enforce", 120, "healthy"
    )


def test_a_hung_engine_behind_a_healthy_health_endpoint_is_found_and_the_world_restarted(
    real_stack, lab_nodes
):
    before = state_of(real_stack)
    bound = before["hang_bound_s"]
    (worker,) = engine_pids(lab_nodes["node-a"], HEAD, "VLLM::Worker")
    os.kill(worker, signal.SIGSTOP)
    stopped = time.time()  # the watchdog stamps its records with this machine's clock
    try:
        # What the review found and vLLM shows: /health still answers while the engine cannot.
        assert [health_status(real_stack) for _ in range(3)] == [200, 200, 200]
        found = wait_state(
            real_stack, lambda s: len(s["restarts"]) > len(before["restarts"]), bound + 30, "a recovery"
        )
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(worker, signal.SIGCONT)
    record = found["restarts"][-1]
    assert record["reason"] in ("hang", "stall", "error"), record
    # Found when it was diagnosed; the restart is recorded once the world's containers have stopped.
    detected = found["last_diagnosis"]["at"] - stopped
    assert detected <= bound + 2 * HEALTH["interval_s"] + 5, (detected, bound)
    print(f"real engine: hang behind /health 200 detected in {detected:.1f} s (bound {bound:.0f} s)")
    wait_state(real_stack, lambda s: s["state"] == "healthy", 600, "healthy after the world restart")
    completion(real_stack)


def test_a_killed_headless_rank_is_recovered_as_a_world(real_stack, lab_nodes):
    before = state_of(real_stack)
    head_id = lab.docker(lab_nodes["node-a"], "inspect", "--format", "{{.State.StartedAt}}", HEAD).out
    lab.docker(lab_nodes["node-b"], "kill", RANK1)
    found = wait_state(real_stack, lambda s: len(s["restarts"]) > len(before["restarts"]), 120, "a recovery")
    # Before it started the world again, it asked each node's image for vLLM's start-up figures
    # (issue 41 item 4): node-b through the deployed agent, node-a itself. The lab's torch (a CUDA
    # build) finds no GPU: recorded, not held.
    rules = found["memory_rule"]
    assert set(rules) == {"node-a", "node-b"}, rules
    for node, rule in rules.items():
        assert rule["checked"] is False and "sees no CUDA device" in rule["why"], (node, rule)
    wait_state(real_stack, lambda s: s["state"] == "healthy", 600, "healthy after the world restart")
    completion(real_stack)
    # The world, not the rank alone: the head was restarted too.
    after = lab.docker(lab_nodes["node-a"], "inspect", "--format", "{{.State.StartedAt}}", HEAD).out
    assert after != head_id, (found["restarts"][-1], head_id, after)
    # A start `up` never saw: the watchdog read its milestones from vLLM's log once it answered.
    from components.node_programs.cold_start import parse_stamp

    started = round(parse_stamp(after.strip()), 3)
    seen = wait_state(
        real_stack,
        lambda s: (s.get("cold_start") or {}).get("started_at") == started,
        60,
        "the restart's start",
    )["cold_start"]
    assert seen["missing"] == [] and 0 < seen["weights_loaded_s"] <= seen["api_ready_s"], seen
    metrics = urllib.request.urlopen(state_url(real_stack).replace("/state", "/metrics"), timeout=10).read()
    assert b'qwen35_health_server_start_seconds{milestone="engine_ready"}' in metrics, metrics[-2000:]
    print(f"real engine: the watchdog's record of a world restart: {json.dumps(seen)}")


def test_an_upgrade_by_up_spends_no_budget_and_is_judged_against_the_last_receipt(
    real_stack, lab_nodes, real_image, real_hub, real_reference
):
    """An upgrade as operators do it: the image plus a new top layer (built on the head), with a
    serving setting changed in the same `up`. NodeImage sends node-b the new layer alone, every rank
    is replaced, the watchdog spends none of its budget on containers `up` replaced, and the answer
    check runs again (the image IDs and the server's argv changed) and is judged against the receipt
    the last accepted run recorded, as well as transformers' reference: the new layer changes no
    answer, so it passes."""
    from bench.engine import build_image

    stack = real_stack.stack
    before = state_of(real_stack)
    earlier = answers_output(real_stack)
    nonce = os.urandom(4).hex()
    tag = f"{real_image.rpartition(':')[0]}:{UPGRADE}{nonce}"
    build_image(lab_nodes["node-a"], real_image, tag, f"echo {nonce} > /qwen35-upgrade")
    config = real_engine_config(tag, real_hub.endpoint, real_reference, health=HEALTH)
    config[f"{NS}:serve"] = {**config[f"{NS}:serve"], "max_num_seqs": 3}
    write_config(stack.config, config)
    run = up(stack)
    replaced = {n for t, n, op in finished(run) if t == CONTAINER and op == "create-replacement"}
    assert {HEAD, R_RANK1} <= replaced, replaced
    sent = [outs for name, outs in exported(stack, NODE_IMAGE).items() if name.endswith("node-b")]
    assert [(o["layers_sent"], o["layers_left_out"]) for o in sent] == [(1, len(sent[0]["layers"]) - 1)], sent
    completion(real_stack)
    time.sleep(3 * HEALTH["interval_s"])
    after = wait_state(real_stack, lambda s: s["state"] == "healthy", 120, "healthy after the up")
    assert after["restarts"] == before["restarts"] and after["budget_left"] == before["budget_left"], after
    answers = answers_output(real_stack)
    assert answers["verdict"] == "pass" and answers["checked_at"] != earlier["checked_at"], answers
    assert {"reference", "receipt"} <= set(answers["judged_against"]), answers
    print(f"real engine: the upgrade's answers judged against {answers['judged_against']}")


def test_known_answers_below_answers_min_correct_fail_up_under_enforce(real_stack, real_hub, real_reference):
    """The tiny model answers noise: `min_correct: 1` refuses it, which shows the scoring runs. Only
    the check runs again: no container is touched."""
    stack = real_stack.stack
    config = real_engine_config(served_image(real_stack), real_hub.endpoint, real_reference, health=HEALTH)
    config[f"{NS}:serve"] = {**config[f"{NS}:serve"], "max_num_seqs": 3}
    config[f"{NS}:answers"] = {**config[f"{NS}:answers"], "min_correct": 1}
    write_config(stack.config, config)
    failed = stack.run("up", "--yes", "--skip-preview", "--json", check=False, timeout=1800)
    assert failed.returncode != 0, "up passed although the noise model knows none of the answers"
    message = "\n".join(errors(failed.events()))
    assert "known answers: 0 of 5 right, below answers.min_correct 1" in message, message[-3000:]
    touched = [(n, op) for t, n, op in changed_steps(failed.events()) if t == CONTAINER]
    assert touched == [], touched


def test_a_speed_below_a_floor_fails_up_under_enforce_naming_the_figure(real_stack, real_hub, real_reference):
    stack = real_stack.stack
    config = real_engine_config(served_image(real_stack), real_hub.endpoint, real_reference, health=HEALTH)
    config[f"{NS}:serve"] = {**config[f"{NS}:serve"], "max_num_seqs": 3}
    config[f"{NS}:bench"] = {**config[f"{NS}:bench"], "mode": "enforce", "min_decode_tps": 100000}
    write_config(stack.config, config)
    failed = stack.run("up", "--yes", "--skip-preview", "--json", check=False, timeout=1800)
    assert failed.returncode != 0, "up passed with a decode floor no CPU reaches"
    message = "\n".join(errors(failed.events()))
    assert "below bench.min_decode_tps 100000" in message, message[-3000:]


def test_a_checkpoint_with_one_expert_changed_is_refused_naming_the_first_divergent_token(
    real_stack, real_hub, real_reference, tmp_path
):
    """A new revision of the checkpoint, one expert's tensor drawn anew (a wrong shard would do as
    much): Checkpoint accepts its hashes, vLLM loads and serves it, the gate passes, and the answer
    check refuses it against transformers' reference, naming the prompt, the token and the gap."""
    from lab import tiny_qwen35
    from lab.standin_hub import load_repo

    changed = load_repo(tiny_qwen35.REPO_ID, tiny_qwen35.write(tmp_path / "changed", changed=True))
    old = real_hub.push(changed)
    try:
        stack = real_stack.stack
        config = real_engine_config(
            served_image(real_stack), real_hub.endpoint, real_reference, health=HEALTH
        )
        config[f"{NS}:serve"] = {**config[f"{NS}:serve"], "max_num_seqs": 3}
        config[f"{NS}:model"] = {**config[f"{NS}:model"], "revision": changed.sha}
        write_config(stack.config, config)
        failed = stack.run("up", "--yes", "--skip-preview", "--json", check=False, timeout=1800)
    finally:  # the next test serves the original checkpoint again
        real_hub.repos[tiny_qwen35.REPO_ID] = old
        real_hub.earlier.pop(tiny_qwen35.REPO_ID, None)
    assert failed.returncode != 0, "up passed a server that loads a changed expert"
    message = "\n".join(errors(failed.events()))
    assert "answer check on node-a" in message and "judged against reference" in message, message[-4000:]
    # The first divergent token of a prompt, with both tokens and the gap.
    assert "expected token" in message and "served token" in message, message[-4000:]
    assert "beyond answers.tie_logprob" in message or "a drift of" in message, message[-4000:]
    steps = finished(failed.events())
    assert any(n == "qwen35-ready" and op != "same" for _, n, op in steps), steps


def test_flags_vllm_cannot_serve_with_fail_up_at_the_gate_naming_vllm_s_error(
    real_stack, real_hub, real_reference
):
    """The recipe's fp8 KV cache, MTP and prefix caching on the CPU build: /health answers, the first
    completion fails inside vLLM, and `up` fails at the gate with vLLM's own error line. Last in the
    module: the stack is destroyed after it."""
    stack = real_stack.stack
    recipe = real_engine_config(served_image(real_stack), real_hub.endpoint, real_reference)
    recipe[f"{NS}:serve"] = {
        **recipe[f"{NS}:serve"],
        "kv_cache_dtype": "fp8",
        "speculative": {"method": "mtp", "num_speculative_tokens": 1},
        "prefix_caching": True,
    }
    write_config(stack.config, recipe)
    failed = stack.run("up", "--yes", "--skip-preview", "--json", check=False, timeout=1800)
    assert failed.returncode != 0, "up passed with flags vLLM cannot complete with"
    message = "\n".join(errors(failed.events()))
    assert "qwen35-ready" in message or "readiness" in message.lower(), message[-4000:]
    # vLLM's own words from the server's log: its engine failed on the completion.
    assert "EngineCore" in message or "Traceback" in message, message[-4000:]
