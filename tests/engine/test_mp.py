"""`cluster.executor: mp` under the real Pulumi engine: the lab stack with vLLM's own multi-node
executor and no Ray. The headless rank on node-b and the head on node-a are one `vllm serve` each
(the lab's stand-in behaves as vLLM's executor: the head serves only once every rank has joined, and
exits when one dies). The first `up` serves a completion with no Ray container on any node; a refresh
is clean; a stopped headless rank shows on node-b's container and on the head's (the world broke),
and `up` brings both back. A change that concerns node-b's rank alone (its NCCL environment)
replaces both ranks, the rank first, and the new world serves. Then an upgrade to an image with one
new top layer and the rollback to the previous image, one `up` each: the rank is replaced first
(deleted, then created), then the head; the outage is the longest gap between answered completions
(the Prober's) during the `up`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest

import lab
from bench.engine import Prober, Run, node_images, prebuilt, top_layer_image
from bench.engine import up as engine_up
from components.mp_executor import WORLD_ENV
from engine.lab_stack import mp_lab_config, write_config
from tests.engine.conftest import CONTAINER, Stack, answers, changes, finished, secret_stack, steps
from tests.engine.conftest import up_or_fail as up

pytestmark = pytest.mark.engine

NS = "qwen35-spark"
HEAD = "qwen35-vllm"
RANK1 = "qwen35-vllm-rank1"
R_RANK1 = "qwen35-vllm-headless-node-b"
R_GATE = "qwen35-ready"
WATCHDOG = "qwen35-watchdog"
AGENT = "qwen35-health-agent"
R_AGENT = "qwen35-health-agent-node-b"


def mp_config(lab_config) -> dict:
    """The lab stack with `cluster.executor: mp`."""
    return mp_lab_config(lab_config())


@pytest.fixture(scope="module")
def stack(engine, lab_nodes, lab_config, secrets) -> Iterator[Stack]:
    with secret_stack(engine, "engine-mp", mp_config(lab_config), secrets) as made:
        yield made


@pytest.fixture(scope="module")
def first_up(stack) -> list[dict]:
    return up(stack)


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
    assert sorted(order) == sorted([HEAD, R_RANK1, R_AGENT, WATCHDOG]), created
    # The health stage after the serving containers, the agent before the watchdog.
    assert order.index(HEAD) < order.index(R_AGENT) < order.index(WATCHDOG), order
    # The headless rank first: the head waits for it to join.
    assert order.index(R_RANK1) < order.index(HEAD), order
    assert sorted(names_on(lab_nodes["node-a"])) == sorted([HEAD, WATCHDOG])
    assert sorted(names_on(lab_nodes["node-b"])) == sorted([RANK1, AGENT])
    # No Ray temp volume: the volumes are each node's compile cache and the watchdog's state.
    volumes = sorted(n for t, n, _ in finished(first_up) if "volume" in t.lower())
    assert volumes == ["qwen35-compile-cache-node-a", "qwen35-compile-cache-node-b", "qwen35-health"], volumes
    outputs = stack.run("stack", "output", "--json").json()
    expected = {"node-a": [HEAD, WATCHDOG], "node-b": [RANK1, AGENT]}
    assert outputs["containers"] == expected, outputs["containers"]
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
    assert HEAD in found and set(found) <= {R_RANK1, HEAD, R_GATE}, (found, why_changed(refreshed, lab_nodes))
    assert not running(lab_nodes["node-a"], HEAD)
    up(stack)
    assert running(lab_nodes["node-b"], RANK1) and running(lab_nodes["node-a"], HEAD)
    answers(stack, secrets["api_key"])
    clean = stack.run("refresh", "--yes", "--skip-preview", "--expect-no-changes", "--json", check=False)
    assert clean.returncode == 0, changes(clean.events())


def world_of(node: lab.LabNode, name: str) -> str:
    """The container's world digest (WORLD_ENV in its environment)."""
    env = lab.docker(node, "inspect", "--format", "{{json .Config.Env}}", name).out
    found = [e.split("=", 1)[1] for e in json.loads(env) if e.startswith(f"{WORLD_ENV}=")]
    assert len(found) == 1, f"{name}: no {WORLD_ENV} in its environment"
    return found[0]


def one_worker_config(lab_config) -> dict:
    """The mp stack with node-b's HCAs pinned: node-b's rank's environment changes, the head's not."""
    config = mp_config(lab_config)
    config[f"{NS}:fabric"] = {k: v for k, v in config[f"{NS}:fabric"].items() if k != "ib_hca"}
    nodes = config[f"{NS}:nodes"]
    config[f"{NS}:nodes"] = [{**nodes[0], "ib_hca": []}, {**nodes[1], "ib_hca": ["mlx5_0"]}]
    return config


def test_a_change_to_one_worker_replaces_every_rank_and_the_world_serves(
    first_up, stack, lab_nodes, lab_config, secrets
):
    a, b = lab_nodes["node-a"], lab_nodes["node-b"]
    before = world_of(a, HEAD)
    assert world_of(b, RANK1) == before
    run, prober = timed_up(stack, one_worker_config(lab_config), secrets["api_key"])
    # Only node-b's environment changed, yet the head is replaced too: a lone new rank would find the
    # head still in the world it left.
    assert_rank_then_head(run, prober, "one worker's change")
    env = lab.docker(b, "inspect", "--format", "{{json .Config.Env}}", RANK1).out
    assert "NCCL_IB_HCA=mlx5_0" in json.loads(env), env
    assert world_of(a, HEAD) == world_of(b, RANK1) != before
    assert running(b, RANK1) and running(a, HEAD)
    answers(stack, secrets["api_key"])
    assert prober.answers[-1][1], "the new world does not answer"


def why_changed(refreshed, lab_nodes) -> dict:
    """What refresh saw differ on the health containers, and how Docker holds them (for a failure)."""
    diffs = {
        m["urn"].rsplit("::", 1)[-1]: (m.get("diffs"), m.get("detailedDiff"))
        for m in steps(refreshed.events())
        if "health" in m["urn"] or "watchdog" in m["urn"]
    }
    held = {
        name: lab.docker(node, "inspect", "--format", "{{json .State}}", name, check=False).out.strip()
        for node, name in ((lab_nodes["node-a"], WATCHDOG), (lab_nodes["node-b"], AGENT))
    }
    logs = lab.docker(lab_nodes["node-a"], "logs", "--tail", "15", WATCHDOG, check=False)
    return {"diffs": diffs, "state": held, "watchdog log": (logs.out + logs.err)[-2000:]}


def timed_up(stack: Stack, config: dict, api_key: str) -> tuple[Run, Prober]:
    """`config` written to the stack file, then one `up` with completions sent all along."""
    write_config(stack.config, config)
    outputs = stack.run("stack", "output", "--json").json()
    with Prober(outputs["endpoint"], outputs["served_model"], api_key) as prober:
        time.sleep(1.0)
        run = engine_up(stack.engine, stack.name)
        time.sleep(1.0)
    assert run.returncode == 0, run.err[-4000:]
    return run, prober


@pytest.fixture(scope="module")
def new_image(lab_nodes, lab_image) -> Iterator[str]:
    """The lab image plus one new top layer, on the head only (NodeImage copies it to node-b)."""
    tag = top_layer_image(lab_nodes["node-a"], lab_image)
    yield tag
    for node in lab_nodes.values():
        lab.docker(node, "image", "rm", tag, check=False)


@pytest.fixture(scope="module")
def upgrade(first_up, stack, lab_config, new_image, secrets) -> tuple[Run, Prober]:
    config = {**mp_config(lab_config), f"{NS}:image": prebuilt(new_image)}
    return timed_up(stack, config, secrets["api_key"])


@pytest.fixture(scope="module")
def rollback(upgrade, stack, lab_config, secrets) -> tuple[Run, Prober]:
    return timed_up(stack, mp_config(lab_config), secrets["api_key"])


def replacement_order(run: Run) -> list[tuple[str, str]]:
    """The serving containers' delete and create steps, (name, op), in the order they began (the
    health containers run the new image too; tests/engine/test_health.py follows them)."""
    steps = sorted((s for s in run.of(CONTAINER) if s.began is not None), key=lambda s: s.began)
    serving = (s for s in steps if s.name in (R_RANK1, HEAD))
    return [(s.name, s.op) for s in serving if s.op in ("delete-replaced", "create-replacement")]


def assert_rank_then_head(run: Run, prober: Prober, what: str) -> float:
    """The order of replacement and the outage (seconds) of one `up` that changes the image."""
    # The engine replaces in dependency order, each container deleted before its successor starts;
    # the head depends on the rank only through depends_on (no input), so it is not deleted first: the rank's
    # delete breaks the world (the running head exits), and the head is replaced once the new rank runs.
    assert replacement_order(run) == [
        (R_RANK1, "delete-replaced"),
        (R_RANK1, "create-replacement"),
        (HEAD, "delete-replaced"),
        (HEAD, "create-replacement"),
    ], [(s.name, s.op) for s in run.of(CONTAINER)]
    first_touch = min(s.began for s in run.of(CONTAINER))
    window = prober.outage(after=first_touch)
    assert window is not None, f"{what}: no request failed: the old head cannot have been stopped"
    assert window[1] != float("inf"), f"{what}: the new head never answered"
    assert window[0] >= first_touch - 0.5, f"{what}: the old head went silent before any container changed"
    gap = prober.longest_gap(run.started, run.ended)
    assert window[1] - window[0] <= gap, (window, gap)
    print(f"mp {what}: {replacement_order(run)}, outage {gap:.2f} s, up {run.seconds:.1f} s")
    return gap


def test_an_upgrade_replaces_the_rank_then_the_head(upgrade, stack, lab_nodes):
    run, prober = upgrade
    assert_rank_then_head(run, prober, "upgrade")
    worker = next(o for name, o in node_images(stack.engine, stack.name).items() if name.endswith("node-b"))
    assert worker["layers_sent"] == 1, worker
    assert running(lab_nodes["node-b"], RANK1) and running(lab_nodes["node-a"], HEAD)
    assert prober.answers[-1][1], "the upgraded world does not answer"


def test_a_rollback_is_one_up_in_the_same_order_that_sends_no_image_byte(rollback, stack, lab_image):
    run, prober = rollback
    assert_rank_then_head(run, prober, "rollback")
    outs = node_images(stack.engine, stack.name)
    assert {o["image"] for o in outs.values()} == {lab_image}, outs
    assert all(o["bytes_sent"] == 0 for o in outs.values()), outs
    assert prober.answers[-1][1], "the rolled-back world does not answer"
