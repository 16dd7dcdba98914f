"""`cluster.executor: mp` under the real Pulumi engine: the lab stack with vLLM's own multi-node
executor and no Ray. The headless rank on node-b and the head on node-a are one `vllm serve` each
(the lab's stand-in behaves as vLLM's executor: the head serves only once every rank has joined, and
exits when one dies). The first `up` serves a completion with no Ray container on any node; a refresh
is clean; a stopped headless rank shows on node-b's container and on the head's (the world broke),
and `up` brings both back.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Iterator

import openai
import pytest

import lab
from tests.engine.conftest import CONTAINER, Stack, changes, errors, finished, secret_stack

pytestmark = pytest.mark.engine

NS = "qwen35-spark"
HEAD = "qwen35-vllm"
RANK1 = "qwen35-vllm-rank1"
R_RANK1 = "qwen35-vllm-headless-node-b"
R_GATE = "qwen35-ready"


def mp_config(lab_config) -> dict:
    """The lab stack with `cluster.executor: mp`: no `ray:` section and no Ray ports (both refused)."""
    config = copy.deepcopy(lab_config())
    config.pop(f"{NS}:ray")
    config[f"{NS}:nodes"] = [{k: v for k, v in n.items() if k != "ray_ports"} for n in config[f"{NS}:nodes"]]
    config[f"{NS}:cluster"] = {"executor": "mp", "master_port": 18501}
    return config


@pytest.fixture(scope="module")
def stack(engine, lab_nodes, lab_config, secrets) -> Iterator[Stack]:
    with secret_stack(engine, "engine-mp", mp_config(lab_config), secrets) as made:
        yield made


def up(stack: Stack) -> list[dict]:
    done = stack.run("up", "--yes", "--skip-preview", "--json", check=False, timeout=1800)
    if done.returncode != 0:
        pytest.fail(
            "pulumi up failed:\n" + ("\n".join(errors(done.events())) or done.err[-3000:]), pytrace=False
        )
    return done.events()


@pytest.fixture(scope="module")
def first_up(stack) -> list[dict]:
    return up(stack)


def answers(stack: Stack, api_key: str) -> None:
    outputs = stack.run("stack", "output", "--json").json()
    client = openai.OpenAI(base_url=outputs["endpoint"], api_key=api_key, timeout=30)
    reply = client.chat.completions.create(
        model=outputs["served_model"], messages=[{"role": "user", "content": "hi"}], max_tokens=4
    )
    assert reply.choices[0].message.content


def names_on(node: lab.LabNode) -> list[str]:
    return [
        n
        for n in lab.docker(node, "ps", "-a", "--format", "{{.Names}}").out.split()
        if n.startswith("qwen35-")
    ]


def running(node: lab.LabNode, name: str) -> bool:
    return lab.docker(node, "inspect", "--format", "{{.State.Running}}", name).out.strip() == "true"


def test_the_first_up_serves_with_one_vllm_per_node_and_no_ray(first_up, stack, lab_nodes, secrets):
    created = [(t, n) for t, n, op in finished(first_up) if op == "create" and t == CONTAINER]
    order = [n for _, n in created]
    assert sorted(order) == sorted([HEAD, R_RANK1]), created
    # The headless rank first: the head waits for it to join.
    assert order.index(R_RANK1) < order.index(HEAD), order
    assert names_on(lab_nodes["node-a"]) == [HEAD]
    assert names_on(lab_nodes["node-b"]) == [RANK1]
    # No Ray temp volume: the only volumes are each node's compile cache.
    volumes = sorted(n for t, n, _ in finished(first_up) if "volume" in t.lower())
    assert volumes == ["qwen35-compile-cache-node-a", "qwen35-compile-cache-node-b"], volumes
    outputs = stack.run("stack", "output", "--json").json()
    assert outputs["containers"] == {"node-a": [HEAD], "node-b": [RANK1]}, outputs["containers"]
    command = lab.docker(lab_nodes["node-b"], "inspect", "--format", "{{json .Args}}", RANK1).out
    assert '"--headless"' in command and '"--node-rank","1"' in command.replace(", ", ","), command
    answers(stack, secrets["api_key"])
    clean = stack.run("refresh", "--yes", "--skip-preview", "--expect-no-changes", "--json", check=False)
    assert clean.returncode == 0, changes(clean.events())


def test_a_stopped_headless_rank_flags_its_node_and_the_head_and_up_brings_both_back(
    first_up, stack, lab_nodes, secrets
):
    lab.docker(lab_nodes["node-b"], "stop", RANK1)
    # The head notices the broken process group within its watch interval (0.5 s) and exits.
    deadline = time.monotonic() + 30
    while running(lab_nodes["node-a"], HEAD) and time.monotonic() < deadline:
        time.sleep(0.5)
    refreshed = stack.run("refresh", "--yes", "--skip-preview", "--json", check=False, timeout=900)
    assert refreshed.returncode == 0, refreshed.err[-3000:]
    found = changes(refreshed.events())
    # The world broke: the rank is stopped, and the head exits as NCCL would make it.
    assert found.get(R_RANK1) == "update", found
    assert HEAD in found and set(found) <= {R_RANK1, HEAD, R_GATE}, found
    assert not running(lab_nodes["node-a"], HEAD)
    up(stack)
    assert running(lab_nodes["node-b"], RANK1) and running(lab_nodes["node-a"], HEAD)
    answers(stack, secrets["api_key"])
    clean = stack.run("refresh", "--yes", "--skip-preview", "--expect-no-changes", "--json", check=False)
    assert clean.returncode == 0, changes(clean.events())
