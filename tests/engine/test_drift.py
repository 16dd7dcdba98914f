"""Drift, repair, teardown and progress under the real Pulumi engine, on the lab.

One stack for the whole module. The first `up` (plain display, as an operator's terminal or CI shows
it) must show the copies' and the readiness wait's progress. Then each drift an operator or an
accident makes by hand on a node must show on exactly the resource that drifted in `pulumi refresh
--json`, be repaired by the next `up` (sending only what is missing) with the gate passing again, and
leave `pulumi refresh --expect-no-changes` clean. Last, `destroy` must leave the nodes as they were,
the checkpoint kept or removed as `model.keep_on_destroy` says, and a new `up` must work from scratch.

The evidence is the engine's own output and state, and the nodes, never the program's logs.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

import lab
from engine.lab_stack import engine_lab_config, write_config
from lab.layout import lab_dir
from tests.engine.conftest import (
    REPO_ID,
    Stack,
    answers,
    changes,
    clear_caches,
    errors,
    outputs_of,
    secret_stack,
    urn_name,
)
from tests.support.hub_fixture import hub_fixture

pytestmark = pytest.mark.engine

NS = "qwen35-spark"
# Shards large enough that copying them takes a few progress intervals on the lab's loopback.
SHARD_BYTES = 96 << 20
PROGRESS_INTERVAL_S = 0.2
WORKER = "qwen35-ray-worker"
# Resource names (the last part of each URN) as the program registers them for the lab's nodes.
R_WORKER = "qwen35-ray-worker-node-b"
R_IMAGE_B = "qwen35-image-node-b"
R_CHECKPOINT_B = "qwen35-checkpoint-node-b"
R_GATE = "qwen35-ready"
# What a lost Ray worker also changes, truly: vLLM's engine dies with its worker (the lab's stand-in
# exits on the next request, as vLLM does), so the server may be caught restarting, and the gate's
# probe (refresh re-runs it) finds the cluster not ready. Nothing else may show.
R_SERVER = "qwen35-vllm"
CLUSTER_WIDE = {R_GATE, R_SERVER}

# Each node's compile cache (components/ray_cluster.py), kept by destroy as the checkpoint is.
COMPILE_CACHE_VOLUME = "qwen35-compile-cache"


def image_tags(node: lab.LabNode) -> set[str]:
    listed = lab.docker(node, "images", "--format", "{{.Repository}}:{{.Tag}}").out.split()
    return {t for t in listed if not t.endswith(":<none>")}


def node_state(node: lab.LabNode) -> dict[str, set[str]]:
    """What the stack could have left on a node: containers, volumes, networks and image tags."""

    def names(*args: str) -> set[str]:
        return set(lab.docker(node, *args).out.split())

    return {
        "containers": names("ps", "-a", "--format", "{{.Names}}"),
        "volumes": names("volume", "ls", "--format", "{{.Name}}"),
        "networks": names("network", "ls", "--format", "{{.Name}}"),
        "tags": image_tags(node),
    }


def model_dir(node: str) -> Path:
    return lab_dir() / node / "hf-cache" / "hub" / f"models--{REPO_ID.replace('/', '--')}"


big_hub = hub_fixture(REPO_ID, shards=2, shard_bytes=SHARD_BYTES, name="big_hub")


@pytest.fixture(scope="module")
def config_for(lab_image, big_hub):
    """The lab stack's config with model settings changed (`refresh`, `keep_on_destroy`)."""

    def make(**model) -> dict:
        base = engine_lab_config(lab_image, big_hub.endpoint)
        return engine_lab_config(
            lab_image,
            big_hub.endpoint,
            model={**base[f"{NS}:model"], **model},
            copy={"progress_interval_s": PROGRESS_INTERVAL_S},
            # The program's default (Pulumi.lab.yaml says "no"): a server whose engine died with a
            # worker comes back by itself once the worker is back, as on the Sparks.
            containers={**base[f"{NS}:containers"], "restart": "unless-stopped"},
        )

    return make


@pytest.fixture(scope="module")
def before(lab_nodes, lab_image) -> dict[str, dict[str, set[str]]]:
    """The nodes as they were before the stack: node-b without the lab image (so the first `up`
    copies it for real), both HF caches empty (so it fetches and copies the checkpoint)."""
    clear_caches(lab_nodes)
    node_b = lab_nodes["node-b"]
    for name in lab.docker(node_b, "ps", "-a", "--format", "{{.Names}}").out.split():
        if name.startswith("qwen35-"):
            lab.docker(node_b, "rm", "-f", name)
    lab.docker(node_b, "rmi", "-f", lab_image, check=False)
    # An untagged image an earlier module left there (one built on the lab image) would hold its
    # layers, and the copy would have nothing to send.
    lab.docker(node_b, "image", "prune", "--force", check=False)
    lab.busybox_image(node_b)  # the image a drift case re-points the tag to, there before the stack
    for node in lab_nodes.values():  # a compile cache an earlier stack kept (keep_on_destroy)
        lab.docker(node, "volume", "rm", "-f", COMPILE_CACHE_VOLUME, check=False)
    return {name: node_state(node) for name, node in lab_nodes.items()}


@pytest.fixture(scope="module")
def stack(engine, before, config_for, secrets) -> Iterator[Stack]:
    with secret_stack(engine, "engine-drift", config_for(refresh="full"), secrets) as made:
        yield made


@pytest.fixture(scope="module")
def first_up(stack):
    """The first `up` with the engine's own display (no `--json`): what a terminal or CI log shows."""
    return stack.run("up", "--yes", "--skip-preview", timeout=1800)


def refresh(stack: Stack) -> dict[str, str]:
    """`pulumi refresh --yes --json`: what it found changed, by resource name."""
    done = stack.run("refresh", "--yes", "--skip-preview", "--json", check=False, timeout=900)
    assert done.returncode == 0, done.err[-3000:]
    return changes(done.events())


def assert_clean(stack: Stack) -> None:
    done = stack.run(
        "refresh", "--yes", "--skip-preview", "--expect-no-changes", "--json", check=False, timeout=900
    )
    assert done.returncode == 0, (changes(done.events()), done.err[-3000:])
    assert changes(done.events()) == {}


def repair(stack: Stack) -> list[dict]:
    done = stack.run("up", "--yes", "--skip-preview", "--json", check=False, timeout=1800)
    events = done.events()
    if done.returncode != 0:
        pytest.fail("pulumi up failed:\n" + ("\n".join(errors(events)) or done.err[-3000:]), pytrace=False)
    return events


def seen_and_repaired(
    stack: Stack, drifted: str, also: set[str] | frozenset[str] = frozenset()
) -> tuple[dict[str, str], list[dict]]:
    """A drift made by hand shows in `pulumi refresh` on `drifted` (and at most on `also` besides);
    the next `up` repairs it. What that `up` changed (name -> op), and its events."""
    found = refresh(stack)
    if also:
        assert drifted in found and set(found) <= also | {drifted}, found
    else:
        assert set(found) == {drifted}, found
    events = repair(stack)
    return changes(events), events


def serves_and_is_clean(stack: Stack, api_key: str) -> None:
    """After a repair: the endpoint answers, and a refresh finds nothing left to change."""
    answers(stack, api_key)
    assert_clean(stack)


# --- 7. progress the operator can see ------------------------------------------------------------


def test_first_up_shows_copy_progress_and_the_readiness_stage(first_up):
    shown = first_up.out
    rate = r"\d+ of \d+ MB \(\d+%\), \d+ MB/s, ETA \d+ s"
    assert re.search(rf"qwen35: node-image-node-b-\w+ node-a -> node-b: {rate}", shown), shown[-6000:]
    assert re.search(rf"qwen35: checkpoint-node-b-\w+ node-a -> node-b: {rate}", shown), shown[-6000:]
    assert re.search(r"qwen35: readiness on node-a: waiting \d+ s at stage '\w+'", shown), shown[-6000:]
    assert "Traceback" not in first_up.out + first_up.err


def test_first_up_sent_the_image_and_checkpoint(first_up, stack, secrets):
    exported = json.loads(stack.run("stack", "export").out)
    by_name = {urn_name(r["urn"]): r for r in exported["deployment"]["resources"]}
    assert by_name[R_IMAGE_B]["outputs"]["bytes_sent"] > 0
    assert by_name[R_CHECKPOINT_B]["outputs"]["bytes_sent"] >= 2 * SHARD_BYTES
    answers(stack, secrets["api_key"])


# --- 1. drift is seen on exactly the resource that drifted, and `up` repairs it -----------------


def test_stopped_worker_is_seen_and_started_again(first_up, stack, lab_nodes, secrets):
    node_b = lab_nodes["node-b"]
    old_id = lab.docker(node_b, "inspect", "--format", "{{.Id}}", WORKER).out.strip()
    lab.docker(node_b, "stop", WORKER)
    logs = lab.docker(node_b, "logs", WORKER)
    found = refresh(stack)
    assert found.get(R_WORKER) == "update" and set(found) <= CLUSTER_WIDE | {R_WORKER}, found
    # The refresh removed nothing on the node (v3.9.0's read force-removed a stopped container): the
    # same worker, stopped, with every log line it wrote.
    kept = lab.docker(node_b, "inspect", "--format", "{{.Id}} {{.State.Running}}", WORKER).out.split()
    assert kept == [old_id, "false"], kept
    again = lab.docker(node_b, "logs", WORKER)
    assert (logs.out + logs.err).strip() and (again.out, again.err) == (logs.out, logs.err)
    events = repair(stack)
    done = changes(events)
    # The provider records a stopped container as `must_run: false`: `up` starts it again, in place.
    assert done.get(R_WORKER) in ("update", "create", "replace"), done
    # The gate probes the cluster again: it had not answered since the worker came back.
    assert done.get(R_GATE) in ("create", "replace", "create-replacement"), done
    # `--json` keeps the provider's stderr: the gate's stage as a diagnostic of the stack's row.
    relayed = [
        e["diagnosticEvent"]
        for e in events
        if "qwen35: readiness on node-a: waiting" in e.get("diagnosticEvent", {}).get("message", "")
    ]
    assert relayed and all(d["severity"] == "info#err" and not d.get("urn") for d in relayed), relayed
    now = lab.docker(node_b, "inspect", "--format", "{{.Id}} {{.State.Running}}", WORKER).out.split()
    assert now[1] == "true", now
    if done[R_WORKER] == "update":
        assert now[0] == old_id
    serves_and_is_clean(stack, secrets["api_key"])


def test_removed_worker_is_seen_and_created_again(first_up, stack, lab_nodes, secrets):
    node_b = lab_nodes["node-b"]
    lab.docker(node_b, "rm", "-f", WORKER)
    done, _ = seen_and_repaired(stack, R_WORKER, also=CLUSTER_WIDE)
    assert done.get(R_WORKER) == "create", done
    assert done.get(R_GATE) in ("create", "replace", "create-replacement"), done
    serves_and_is_clean(stack, secrets["api_key"])


def test_removed_image_tag_is_seen_and_tagged_again(first_up, stack, lab_nodes, lab_image, secrets):
    node_b = lab_nodes["node-b"]
    # The worker still runs the image: the tag goes, the image stays (what `docker rmi -f` does).
    lab.docker(node_b, "rmi", "-f", lab_image)
    assert lab_image not in image_tags(node_b)
    done, events = seen_and_repaired(stack, R_IMAGE_B)
    assert set(done) == {R_IMAGE_B}, done
    # Every layer was still there: nothing re-sent, only tagged again; no container replaced.
    outs = outputs_of(events, R_IMAGE_B)
    assert outs["layer_bytes_sent"] == 0, outs
    assert lab_image in image_tags(node_b)
    serves_and_is_clean(stack, secrets["api_key"])


def test_image_tag_pointed_elsewhere_is_seen_and_put_back(first_up, stack, lab_nodes, lab_image, secrets):
    node_b = lab_nodes["node-b"]
    placed = lab.docker(node_b, "image", "inspect", "--format", "{{.Id}}", lab_image).out.strip()
    other = lab.busybox_image(node_b)
    lab.docker(node_b, "tag", other, lab_image)
    done, events = seen_and_repaired(stack, R_IMAGE_B)
    assert set(done) == {R_IMAGE_B}, done
    outs = outputs_of(events, R_IMAGE_B)
    assert outs["layer_bytes_sent"] == 0, outs
    assert outs["image_id"] == placed
    assert lab.docker(node_b, "image", "inspect", "--format", "{{.Id}}", lab_image).out.strip() == placed
    serves_and_is_clean(stack, secrets["api_key"])


def shard_blobs(node: str) -> list[Path]:
    """The node's checkpoint blobs of the safetensors shards (what their snapshot links point at)."""
    (snapshot,) = (model_dir(node) / "snapshots").iterdir()
    return [p.resolve() for p in sorted(snapshot.glob("*.safetensors"))]


def one_shard_sent_again(stack: Stack, api_key: str) -> None:
    """After one shard on node-b was damaged or deleted: refresh flags node-b's Checkpoint alone, and
    `up` sends that one file again, not the whole checkpoint."""
    done, events = seen_and_repaired(stack, R_CHECKPOINT_B)
    assert set(done) == {R_CHECKPOINT_B}, done
    outs = outputs_of(events, R_CHECKPOINT_B)
    assert outs["files_sent"] == 1, outs
    assert SHARD_BYTES <= outs["bytes_sent"] < 2 * SHARD_BYTES, outs
    serves_and_is_clean(stack, api_key)


def test_damaged_checkpoint_file_is_seen_with_full_refresh_and_sent_again(
    first_up, stack, lab_nodes, secrets
):
    blob = shard_blobs("node-b")[0]
    with open(blob, "r+b") as handle:
        handle.seek(SHARD_BYTES // 2)
        byte = handle.read(1)
        handle.seek(SHARD_BYTES // 2)
        handle.write(bytes([byte[0] ^ 0xFF]))
    one_shard_sent_again(stack, secrets["api_key"])


def test_deleted_checkpoint_file_is_seen_with_sizes_and_sent_again(
    first_up, stack, config_for, lab_nodes, secrets
):
    write_config(stack.config, config_for(refresh="sizes"))
    switched = changes(repair(stack))
    assert set(switched) <= {"qwen35-checkpoint-node-a", R_CHECKPOINT_B}, switched
    assert_clean(stack)
    shard_blobs("node-b")[1].unlink()
    one_shard_sent_again(stack, secrets["api_key"])


# --- 6. `destroy` leaves the nodes as they were ---------------------------------------------------


def assert_as_before(lab_nodes, before, kept: frozenset[str] = frozenset()) -> None:
    """Every node as before the stack, but for the volumes `kept` (what keep_on_destroy keeps)."""
    for name, node in lab_nodes.items():
        assert node_state(node) == {**before[name], "volumes": before[name]["volumes"] | kept}, name


def assert_no_resources(stack: Stack) -> None:
    exported = json.loads(stack.run("stack", "export").out)
    assert [r["type"] for r in exported["deployment"].get("resources") or []] == []


def test_destroy_keeps_the_checkpoint_by_default_and_up_works_again(
    first_up, stack, lab_nodes, before, secrets
):
    stack.run("destroy", "--yes", timeout=900)
    assert_no_resources(stack)
    # keep_on_destroy (default true): the files stay on every node, and so does the compile cache.
    assert_as_before(lab_nodes, before, kept=frozenset({COMPILE_CACHE_VOLUME}))
    for node in lab_nodes:
        assert len(shard_blobs(node)) == 2, node
    again = stack.run("up", "--yes", "--skip-preview", "--json", timeout=1800).events()
    made = changes(again)
    assert R_GATE in made and made[R_GATE] == "create", made
    # node-b still held the checkpoint: nothing re-sent.
    assert outputs_of(again, R_CHECKPOINT_B)["bytes_sent"] == 0
    answers(stack, secrets["api_key"])


def test_destroy_removes_the_checkpoint_when_told_and_up_works_again(
    first_up, stack, config_for, lab_nodes, before, secrets
):
    write_config(stack.config, config_for(refresh="sizes", keep_on_destroy=False))
    stack.run("up", "--yes", "--skip-preview", timeout=1800)
    stack.run("destroy", "--yes", timeout=900)
    assert_no_resources(stack)
    assert_as_before(lab_nodes, before)
    for node in lab_nodes:
        snapshots = model_dir(node) / "snapshots"
        assert not snapshots.exists() or not any(snapshots.iterdir()), node
        blobs = model_dir(node) / "blobs"
        assert not blobs.exists() or not any(blobs.iterdir()), node
    again = stack.run("up", "--yes", "--skip-preview", "--json", timeout=1800).events()
    assert changes(again).get(R_GATE) == "create"
    assert outputs_of(again, R_CHECKPOINT_B)["bytes_sent"] >= 2 * SHARD_BYTES
    answers(stack, secrets["api_key"])
