"""The serving path against vLLM itself: the real CLI deploys engine/real_vllm.yaml (vLLM's CPU build,
a tiny real Qwen3.5-MoE, two ranks under executor mp on node-a and node-b) and every promise that
the stand-in server used to stand for is checked on what vLLM does: the model-support check in
`enforce` runs the image's real vLLM; the readiness gate passes on a completion vLLM generated and
fails `up` on one vLLM cannot generate, naming vLLM's own error; Prometheus scrapes vLLM's own
`/metrics` from `scrape_targets`; `status` shows each rank; a rank stopped by hand is drift that `up`
undoes, and the world serves again."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

import lab
from engine.lab_stack import real_engine_config, write_config
from tests.engine.conftest import CONTAINER, RealStack, changes, errors, finished, real_stack_up
from tests.engine.conftest import up_or_fail as up

pytestmark = pytest.mark.engine

NS = "qwen35-spark"
HEAD, RANK1 = "qwen35-vllm", "qwen35-vllm-rank1"
R_RANK1 = "qwen35-vllm-headless-node-b"


@pytest.fixture(scope="module")
def real_stack(engine, lab_nodes, real_image, real_hub, secrets) -> Iterator[RealStack]:
    with real_stack_up(engine, "engine-real", real_image, real_hub, secrets) as made:
        yield made


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
    )


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
    done = subprocess.run(
        [sys.executable, "-m", "status", "--file", str(real_stack.stack.config), "--json",
         "--connect-timeout", "5"],
        capture_output=True, text=True, timeout=180, env=real_stack.stack.engine.env(),
        cwd=Path(__file__).resolve().parents[2],
    )  # fmt: skip
    report = json.loads(done.stdout)
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-2000:])
    text = json.dumps(report)
    assert HEAD in text and RANK1 in text, text[:3000]


def test_a_rank_stopped_by_hand_is_drift_and_up_brings_the_world_back(real_stack, lab_nodes):
    lab.docker(lab_nodes["node-b"], "stop", RANK1)
    # vLLM's head exits once its peer is gone (its process group broke).
    deadline = time.monotonic() + 120
    while running(lab_nodes["node-a"], HEAD) and time.monotonic() < deadline:
        time.sleep(1)
    refreshed = real_stack.stack.run("refresh", "--yes", "--skip-preview", "--json", check=False, timeout=900)
    assert refreshed.returncode == 0, refreshed.err[-3000:]
    assert changes(refreshed.events()).get(R_RANK1) == "update", changes(refreshed.events())
    up(real_stack.stack)
    assert running(lab_nodes["node-b"], RANK1) and running(lab_nodes["node-a"], HEAD)
    completion(real_stack)


def test_flags_vllm_cannot_serve_with_fail_up_at_the_gate_naming_vllm_s_error(
    real_stack, real_image, real_hub
):
    """The recipe's fp8 KV cache, MTP and prefix caching on the CPU build: /health answers, the first
    completion fails inside vLLM, and `up` fails at the gate with vLLM's own error line. Last in the
    module: the stack is destroyed after it."""
    stack = real_stack.stack
    recipe = real_engine_config(real_image, real_hub.endpoint)
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
