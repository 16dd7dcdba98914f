"""The node proof in the lab, through NodeProofProvider as the engine runs it: real containers of the
real-vLLM lab image (its own torch) on node-a and node-b, with the lab stack's serving settings
(Pulumi.lab.yaml: no GPU, no devices, its memlock) and each node's own NCCL/gloo variables. There is
no GPU and no RDMA here: the group is gloo's over loopback, and that is exactly the verdict expected.
(Three nodes would need the 6.5 GB image on node-c too: the program's world of three is proven in
tests/release/test_node_proof_program.py.)"""

from __future__ import annotations

import secrets
import time

import pytest

import lab
from components.config import parse_stack_config
from components.containers import fabric_env
from components.layout import node_proof_inputs
from components.node_proof import NodeProofError, NodeProofProvider, container_name
from lab.images import DEBIAN_TAG, debian_image
from lab.vllm_cpu_image import vllm_cpu_images
from tests.support.fabric_trees import writer_source
from tests.support.host_trees import host_tree
from tests.support.lab_nodes import node_dict
from tests.support.ports import free_port
from tests.support.program import dev_raw

PROVIDER = NodeProofProvider()


@pytest.fixture(scope="module")
def images(node_a, node_b) -> dict[str, str]:
    return vllm_cpu_images([node_a, node_b])


def proof_props(nodes: list[lab.LabNode], images: dict[str, str], deadline_s: float = 120.0) -> dict:
    """The NodeProof inputs the lab stack's config gives, on these nodes, with these images."""
    config = parse_stack_config(dev_raw("lab"))
    declared = {n.name: n for n in config.nodes}
    inputs = node_proof_inputs(config)
    inputs = {**inputs, "bytes": inputs.pop("bytes_"), "deadline_s": deadline_s, "mode": "enforce"}
    inputs["port"] = free_port(nodes[0].host)  # nothing else of the lab's listens there now
    inputs["master_addr"] = declared[nodes[0].name].fabric_ip
    entries = [
        {
            "name": node.name,
            "node": node_dict(node),
            "rank": rank,
            "image_id": images[node.name],
            "env": fabric_env(config, declared[node.name]),
            "ib_hca": [],
        }
        for rank, node in enumerate(nodes)
    ]
    return {**inputs, "nodes": entries, "min_busbw_gbs": None}


def left_containers(nodes: list[lab.LabNode], props: dict) -> list[str]:
    name = container_name(props)
    return [n.name for n in nodes if name in lab.docker(n, "ps", "-a", "--format", "{{.Names}}").out.split()]


# node-b's bound when the head never opens its group.
JOIN_BOUND_S = 60


def test_two_lab_nodes_prove_over_gloo_with_the_images_torch_and_leave_nothing(node_a, node_b, images):
    props = proof_props([node_a, node_b], images)
    outs = PROVIDER.create(props).outs
    assert (outs["verdict"], outs["backend"], outs["problems"]) == ("passed", "gloo", []), outs
    assert outs["busbw_gbs"] > 0
    for name in ("node-a", "node-b"):
        result = outs["results"][name]
        assert (result["network"], result["gpu"], result["failed"]) == ("gloo", None, []), result
        assert result["torch"].startswith("2."), result
    assert left_containers([node_a, node_b], props) == []
    # Refresh reads only the hosts' software again (unchanged): what `up` proved stays.
    assert PROVIDER.read("qwen35-node-proof", outs).outs == outs


def test_a_proof_that_cannot_reach_the_head_is_refused_within_its_bound_naming_both(node_a, node_b, images):
    # The head's group never opens: its image has no torch (Debian's python3 alone), so node-b's
    # proof waits for a head that is not there until its bound.
    debian = debian_image(node_a, DEBIAN_TAG)
    # The bound covers node-b's start and torch's import as well as the join: generous enough that a
    # machine loaded beside the lab still reaches the join, which is what this test judges.
    props = proof_props(
        [node_a, node_b], {"node-a": debian, "node-b": images["node-b"]}, deadline_s=JOIN_BOUND_S
    )
    started = time.monotonic()
    with pytest.raises(NodeProofError) as refused:
        PROVIDER.create(props)
    elapsed = time.monotonic() - started
    message = str(refused.value)
    assert "node-a: the image's python3 cannot import torch" in message, message
    head = f"{props['master_addr']}:{props['port']}"
    assert f"node-b: could not join the group of node-a at {head} within {JOIN_BOUND_S}s" in message, message
    # `up` never waits past the bound and its own grace after it (components/node_proof/execute.py),
    # plus the SSH round trips that start and remove the containers.
    assert elapsed < JOIN_BOUND_S + 60 + 120, elapsed
    assert left_containers([node_a, node_b], props) == []


def test_a_driver_changed_on_a_node_is_seen_by_refresh_and_proves_again(node_a, node_b, images):
    # The lab has no NVIDIA driver: node-b's host facts come from a crafted tree (`host_root`), as
    # FabricCheck's sysfs trees do; an `apt upgrade` of the driver is that file rewritten.
    root = f"/tmp/qwen35-host-{secrets.token_hex(4)}"

    def craft(driver: str) -> None:
        written = lab.on_node(
            node_b, ["python3", "-", root], input=writer_source(host_tree(driver)), timeout=60
        )
        assert written.out.strip() == root, written.err

    try:
        craft("580.95.05")
        props = proof_props([node_a, node_b], images)
        props["nodes"][1]["host_root"] = root
        outs = PROVIDER.create(props).outs
        assert outs["verdict"] == "passed", outs["problems"]
        recorded = outs["node_software"]["node-b"]
        assert (recorded["driver"], recorded["cuda"], recorded["firmware"]) == (
            "580.95.05", "13.0", {"rocep1s0f0": "28.45.1020", "rocep1s0f1": "28.45.1020"}
        )  # fmt: skip
        assert recorded["torch"].startswith("2.") and recorded["vllm"]
        assert (
            PROVIDER.diff("qwen35-node-proof", PROVIDER.read("qwen35-node-proof", outs).outs, props).changes
            is False
        )
        craft("580.105.08")
        refreshed = PROVIDER.read("qwen35-node-proof", outs).outs
        assert refreshed["observed_software"]["node-b"]["driver"] == "580.105.08"
        assert refreshed["node_software"]["node-b"]["driver"] == "580.95.05"
        assert PROVIDER.diff("qwen35-node-proof", refreshed, props).changes is True
        again = PROVIDER.update("qwen35-node-proof", refreshed, props).outs
        assert again["node_software"]["node-b"]["driver"] == "580.105.08"
        assert PROVIDER.diff("qwen35-node-proof", again, props).changes is False
    finally:
        lab.on_node(node_b, ["rm", "-rf", "--", root], timeout=60)
