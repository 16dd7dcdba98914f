"""How a NodeImage copy reaches the destination: its end (`transfer_sink listen`) is started by the
orchestrator in its own session to the destination, and the source streams into it through its SSH
master's stream-local forward, so a create opens one session per node and none from the source on the
destination. A destination whose sshd refuses the forward still gets the copy, the consumer then run
in a session of its own. Sessions are counted by each node's login shell (`lab.logins`)."""

from __future__ import annotations

import dataclasses
import glob
import os
import socket
import subprocess
import time

import pytest

import lab
from lab.layout import node_paths
from lab.logins import counted_logins
from tests.support.node_image_lab import PROVIDER, build, image_id, no_temporary_tags, props, remove

REFUSING_PORT = 2231  # node-b's second sshd, one that refuses stream-local forwarding


@pytest.fixture(scope="module")
def pair(node_a, node_b):
    lab.busybox_image(node_a)
    build(node_a, "fw-base:1", "lab-busybox:1", os.urandom(500_000))
    PROVIDER.create(props("fw-base:1", node_a, node_b))
    return node_a, node_b


def ends_left() -> list[str]:
    """Folders of destination ends still there (lab nodes share this machine's /tmp)."""
    return glob.glob("/tmp/qns-*")


def no_end_left(before: list[str], wait_s: float = 3.0) -> bool:
    deadline = time.monotonic() + wait_s
    while set(ends_left()) - set(before) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not set(ends_left()) - set(before)


def counted_create(image: str, src, dst, reached=None) -> tuple[dict, dict[str, int]]:
    """NodeImage create of `image` from src to dst (reached as `reached`, if given): its outputs and the
    SSH sessions each node saw meanwhile."""
    with counted_logins(src, dst) as counts:
        outs = PROVIDER.create(props(image, src, reached or dst)).outs
        return outs, counts()


def test_a_copy_opens_one_session_on_each_node_and_none_from_the_source(pair):
    src, dst = pair
    wanted = build(src, "fw-top:1", "fw-base:1", os.urandom(300_000))
    remove(dst, "fw-top:1")
    before = ends_left()
    outs, seen = counted_create("fw-top:1", src, dst)
    assert outs["skipped"] is False and outs["image_id"] == wanted == image_id(dst, "fw-top:1")
    assert outs["layers_sent"] == 1 and outs["layers_left_out"] == 2
    # the source's session and the destination's (its inspection, then the end the stream went into)
    assert seen == {"node-a": 1, "node-b": 1}
    assert no_temporary_tags(dst) and no_end_left(before)
    again, seen = counted_create("fw-top:1", src, dst)
    assert again["skipped"] is True and seen == {"node-a": 1, "node-b": 1}
    assert no_end_left(before, wait_s=0)  # an end never reached is gone before create returns


@pytest.fixture
def refusing_node_b(node_b, tmp_path):
    """node-b reached through a second sshd of its own (same host key, home and daemon) whose config
    says `AllowStreamLocalForwarding no`, as a hardened node's may: sessions work, forwards do not."""
    paths = node_paths("node-b")
    kept = [
        line
        for line in paths.sshd_config.read_text().splitlines()
        if not line.startswith(("ListenAddress", "PidFile"))
    ]
    config = tmp_path / "sshd_config"
    config.write_text(
        "\n".join(
            [
                f"ListenAddress {node_b.host}:{REFUSING_PORT}",
                f"PidFile {tmp_path / 'sshd.pid'}",
                "AllowStreamLocalForwarding no",
                *kept,
            ]
        )
        + "\n"
    )
    known = tmp_path / "known_hosts"
    key = paths.host_key.with_suffix(".pub").read_text().split()
    known.write_text(f"[{node_b.host}]:{REFUSING_PORT} {key[0]} {key[1]}\n")
    log = tmp_path / "sshd.log"
    with log.open("wb") as err:
        sshd = subprocess.Popen(["/usr/sbin/sshd", "-D", "-e", "-f", str(config)], stderr=err)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            socket.create_connection((node_b.host, REFUSING_PORT), timeout=1).close()
            break
        except OSError:
            assert sshd.poll() is None, f"the refusing sshd did not start: {log.read_text()}"
            time.sleep(0.05)
    try:
        yield dataclasses.replace(node_b, port=REFUSING_PORT, known_hosts=str(known)), log
    finally:
        sshd.terminate()
        sshd.wait(timeout=10)


def test_a_destination_that_refuses_the_forward_still_gets_the_copy(pair, refusing_node_b, capsys):
    src, dst = pair
    refusing, log = refusing_node_b
    wanted = build(src, "fw-refused:1", "fw-base:1", os.urandom(200_000))
    remove(dst, "fw-refused:1")
    before = ends_left()
    outs, seen = counted_create("fw-refused:1", src, dst, refusing)
    assert outs["skipped"] is False and outs["image_id"] == wanted == image_id(dst, "fw-refused:1")
    assert outs["layers_sent"] == 1
    assert "refused streamlocal port forward" in log.read_text()  # it was tried, and refused
    assert "was not reached through the forward" in capsys.readouterr().err  # and the operator is told
    # the consumer ran in a session of its own; the end started for it was ended unfed
    assert seen == {"node-a": 1, "node-b": 2}
    assert no_temporary_tags(dst) and no_end_left(before)
