"""NodeImage without nodes: facts parsing, decisions, errors, and the resource wiring under mocks."""

from __future__ import annotations

import contextlib
import json
import pickle
import sys
import urllib.parse
from pathlib import Path

import pulumi
import pytest

import components.node_image as ni
from components.config import CopyConfig
from components.node_image import (
    Daemon,
    ImageInfo,
    Node,
    NodeImageError,
    NodeImageProvider,
    Tuning,
    copy_tree,
    disk_needed,
    execute,
    parse_daemon,
    parse_df_available,
    parse_images,
    parse_layer_sizes,
    peer_target,
    replace_reasons,
    resource,
    same_image,
)
from components.node_programs import program_argv
from components.node_programs.transfer_source import Exit as SourceExit
from components.transfer import Peer, peer_unreachable
from tests.support.program import RecordingMocks

L1, L2 = "sha256:" + "1" * 64, "sha256:" + "2" * 64


def node(name: str, host: str, **extra) -> dict:
    return {
        "name": name,
        "host": host,
        "port": 22,
        "user": "ops",
        "identity_file": "/k",
        "known_hosts": "/kh",
        **extra,
    }


def test_facts_are_parsed():
    assert parse_daemon('[["Backing Filesystem","extfs"]]\t/var/lib/docker\t20.10.24\n') == Daemon(
        "classic", "/var/lib/docker", "20.10.24"
    )
    assert parse_daemon('[["driver-type","io.containerd.snapshotter.v1"]]\t/d\t26.1.5').store == "containerd"
    images = parse_images(f'"sha256:ab"\t["{L1}","{L2}"]\t123\n"sha256:cd"\tnull\t0\n')
    assert images == [ImageInfo("sha256:ab", (L1, L2), 123), ImageInfo("sha256:cd", (), 0)]
    df = "Filesystem 1-blocks Used Available Capacity Mounted on\n/dev/vda 100 40 60 40% /\n"
    assert parse_df_available(df) == 60
    assert parse_layer_sizes("0\n10\n0\n5\n", 2) == [5, 10]  # history is newest first
    assert parse_layer_sizes("0\n10\n", 2) is None  # does not line up: caller assumes everything


def test_disk_need_is_the_layers_to_write_times_the_unpack_factor_plus_reserve():
    tuning = Tuning(disk_reserve_bytes=100, disk_factor=2.0)
    assert disk_needed(1060, tuning) == 2 * 1060 + 100


def test_identity_is_the_id_in_one_store_and_the_layers_across_stores():
    a, b = ImageInfo("sha256:a", (L1, L2)), ImageInfo("sha256:b", (L1, L2))
    assert not same_image(a, "classic", b, "classic")
    assert same_image(a, "containerd", b, "classic")
    assert not same_image(a, "containerd", ImageInfo("sha256:b", (L1,)), "classic")


def test_tuning_rejects_unknown_keys_with_a_hint():
    def nodes_with(tuning):
        return ni.parse(
            {"image": "app:1", "source": node("a", "h1"), "destination": node("b", "h2"), "tuning": tuning}
        )

    with pytest.raises(NodeImageError, match="did you mean 'stall_timeout_s'"):
        nodes_with({"stall_timeout": 5})
    with pytest.raises(NodeImageError, match="compression"):
        nodes_with({"compression": "zip"})
    assert nodes_with({"disk_reserve_bytes": 1})[3].disk_reserve_bytes == 1
    assert Tuning is CopyConfig  # one definition of copy tuning


def test_bad_inputs_fail_before_any_node_is_touched():
    provider = NodeImageProvider()
    with pytest.raises(NodeImageError, match="name:tag"):
        provider.create({"image": "app", "source": node("a", "h1"), "destination": node("b", "h2")})
    with pytest.raises(NodeImageError, match="name:tag"):
        provider.create(
            {"image": "app:1;rm -rf /", "source": node("a", "h1"), "destination": node("b", "h2")}
        )
    with pytest.raises(NodeImageError, match="destination"):
        provider.create({"image": "app:1", "source": node("a", "h1"), "destination": {"host": "h2"}})


def test_the_source_reaches_the_destination_on_its_fabric_address():
    destination = Node.from_dict("destination", node("b", "10.0.0.2", fabric_host="192.168.100.2"))
    peer = peer_target(destination, Tuning(peer_known_hosts="/src/kh"))
    assert (peer.host, peer.user, peer.port, peer.known_hosts) == ("192.168.100.2", "ops", 22, "/src/kh")
    assert Node.from_dict("d", node("b", "10.0.0.2")).fabric_host == "10.0.0.2"


def olds(**extra) -> dict:
    base = {
        "image": "app:1",
        "source": node("a", "h1"),
        "destination": node("b", "h2"),
        "trigger": "",
        "image_id": "sha256:x",
        "layers": [L1],
        "store": "classic",
        "source_image_id": "sha256:x",
        "source_store": "classic",
    }
    return {**base, **extra}


@pytest.mark.parametrize(
    ("news", "expected"),
    [
        ({}, []),
        ({"source_image_id": ""}, []),  # the head: its source is itself
        ({"source_image_id": "sha256:y"}, ["image"]),  # the source's NodeImage now reports another image
        ({"source_image_id": pulumi.UNKNOWN}, ["image"]),  # preview: the source is being replaced
        ({"image": "app:2"}, ["image"]),
        ({"destination": node("b", "h3")}, ["destination"]),
        ({"destination": node("b", "h2", port=2222)}, ["destination"]),
        ({"destination": node("b", "h2", fabric_host="b.fabric")}, []),  # another name: an update
        ({"trigger": "new-build"}, ["trigger"]),
        ({"source": node("c", "h9")}, []),  # another source, same image
    ],
    ids=[
        "same",
        "head",
        "source-rebuilt",
        "source-unknown",
        "image",
        "destination",
        "port",
        "fabric",
        "trigger",
        "other-source",
    ],  # fmt: skip
)
def test_replace_reasons(news, expected):
    assert replace_reasons(olds(), {**olds(), **news}) == expected


def test_drift_read_by_refresh_replaces():
    drifted = olds(image_id="sha256:other", verified_image_id="sha256:x")
    assert replace_reasons(drifted, olds()) == ["image"]
    legacy = olds(image_id="sha256:other", source_store="classic")  # state from before verified_image_id
    assert replace_reasons(legacy, olds()) == ["image"]
    cross = olds(image_id="sha256:manifest", store="containerd", source_store="classic")
    assert replace_reasons(cross, olds()) == []  # its own ID in the containerd store: not drift


@pytest.mark.parametrize(
    ("news", "expected"),
    [
        # The build's ID of the image this copy holds: recorded in place (no copy, nothing downstream).
        ({"trigger": "sha256:x"}, []),
        # Another image than the one held (a rebuild with another result), or not known yet (preview).
        ({"trigger": "sha256:y"}, ["trigger"]),
        ({"trigger": pulumi.UNKNOWN}, ["trigger"]),
    ],
)
def test_a_trigger_recorded_from_pulumi_docker_image_moves_to_the_build_id(news, expected):
    # pulumi_docker.Image's ID was its image reference: the trigger recorded from it was `image` itself.
    legacy = olds(trigger="app:1")
    assert replace_reasons(legacy, {**legacy, **news}) == expected
    # Any other old trigger changing is a new copy, whatever the new value.
    assert replace_reasons(olds(trigger="build-1"), {**olds(), **news}) == ["trigger"]


def test_the_build_id_trigger_is_recorded_by_update():
    legacy = olds(trigger="app:1")
    diff = NodeImageProvider().diff("b/app:1", legacy, {**legacy, "trigger": "sha256:x"})
    assert (diff.changes, diff.replaces) == (True, [])


def test_delete_leaves_tags_it_did_not_place(monkeypatch):
    monkeypatch.setattr(execute, "DockerOn", lambda *a, **k: pytest.fail("no node should be contacted"))
    NodeImageProvider().delete("b/app:1", olds(placed_tag=False))
    NodeImageProvider().delete("b/app:1", olds(placed_tag=False, holds_tag=False, claim=""))


def test_provider_pickles_by_reference_without_state():
    provider = pickle.loads(pickle.dumps(NodeImageProvider()))
    assert type(provider).__module__ == "components.node_image" and vars(provider) == {}


def test_copy_tree_wires_one_resource_per_node_following_the_plan(monkeypatch):
    made = []

    class Recorder(pulumi.CustomResource):  # a Resource for depends_on, never registered
        def __init__(  # noqa: PLW0231
            self,
            name,
            image,
            source,
            destination,
            tuning=None,
            trigger=None,
            opts=None,
            source_image_id=None,
            keep_previous=None,
        ):
            self.name, self.source, self.destination = name, source["name"], destination["name"]
            self.image_id, self.source_image_id = f"id-of-{destination['name']}", source_image_id
            self.depends_on = list(opts.depends_on or []) if opts else []
            made.append(self)

    monkeypatch.setattr(resource, "NodeImage", Recorder)
    nodes = {name: node(name, f"10.0.0.{i}") for i, name in enumerate(["head", "w1", "w2", "w3"])}
    tree = copy_tree("img", "app:1", nodes, "head", can_reexport={"w1", "w2", "w3"})
    assert set(tree) == set(nodes)
    assert (tree["head"].source, tree["head"].destination, tree["head"].depends_on) == ("head", "head", [])
    for worker in ("w1", "w2", "w3"):
        source = tree[worker].source
        assert tree[worker].depends_on == [tree[source]]  # a source serves only once it has the image
        assert tree[worker].source_image_id == f"id-of-{source}"  # what its source observed: an input
    assert tree["w1"].source == "head" and {tree["w2"].source, tree["w3"].source} == {"head", "w1"}


def test_node_images_register_under_mocks():
    mocks = RecordingMocks()
    pulumi.runtime.set_mocks(mocks, project="qwen35-spark", stack="unit", preview=False)
    seen = {}

    @pulumi.runtime.test
    def run():
        nodes = {name: node(name, f"10.0.0.{i}") for i, name in enumerate(["head", "w1", "w2"])}
        tree = copy_tree("img", "app:1", nodes, "head", tuning={"stall_timeout_s": 30})
        return pulumi.Output.all(tree["w2"].image_id, tree["w2"].skipped, tree["w2"].layers).apply(
            lambda values: seen.update(values=values)
        )

    run()
    dynamic = [r for r in mocks.resources if r.typ == "pulumi-python:dynamic/qwen35:NodeImage"]
    assert sorted(r.name for r in dynamic) == ["img-head", "img-w1", "img-w2"]
    w2 = next(r for r in dynamic if r.name == "img-w2")
    assert w2.inputs["image"] == "app:1" and w2.inputs["destination"]["host"] == "10.0.0.2"
    assert w2.inputs["source"]["name"] == "head" and w2.inputs["tuning"] == {"stall_timeout_s": 30}
    json.dumps({k: v for k, v in w2.inputs.items() if k != "__provider"})  # plain JSON values
    image_id, skipped, layers = seen["values"]
    assert image_id.startswith("sha256:") and skipped is True and len(layers) == 2


def test_phase_times_list_every_span_and_print_only_when_asked(monkeypatch, capsys):
    times = ni.PhaseTimes("app:1")
    with times.span("source facts"):
        pass
    assert times.timed("stream", lambda x: x + 1)(1) == 2
    table = times.table()
    assert "timing app:1" in table and "source facts" in table and "stream" in table
    monkeypatch.delenv(ni.TIMING_ENV, raising=False)
    times.report()
    assert capsys.readouterr().err == ""
    monkeypatch.setenv(ni.TIMING_ENV, "1")
    times.report()
    assert "source facts" in capsys.readouterr().err


def test_peer_master_lives_in_a_private_folder_on_the_source():
    peer = Peer(peer_target(Node.from_dict("destination", node("b", "10.0.0.2")), Tuning()), "/tmp/qni-x")
    spec = peer.spec()
    assert spec["folder"] == "/tmp/qni-x" and spec["connect_timeout"] == 10
    assert spec["check"][-3:] == ["-O", "check", "x"] and "ControlPath=/tmp/qni-x/m" in spec["check"]
    connect = spec["connect"]
    # a new master, no remote shell, pinned keys from ssh_options
    assert connect[:5] == ["env", "SHELL=/bin/sh", "ssh", "-o", "ControlMaster=yes"]  # (see ssh_command)
    assert connect[-3:] == ["-f", "-N", "ops@10.0.0.2"]
    assert "StrictHostKeyChecking=yes" in connect and "ControlPath=/tmp/qni-x/m" in connect
    # dialed by the node's python3 (never this machine's interpreter: the command runs on the source)
    dial = next(o for o in connect if o.startswith("ProxyCommand="))
    assert dial.startswith("ProxyCommand=python3 -I -S -c ") and sys.executable not in " ".join(connect)
    sink = peer.sink_argv()  # the destination's end, opened over the master
    assert sink[:3] == ["env", "SHELL=/bin/sh", "ssh"] and "ControlPath=/tmp/qni-x/m" in sink
    assert "transfer_sink" not in sink[-1]
    assert sink[-1].startswith("python3 -I -S -c ")
    assert peer.close_argv()[:4] == ["python3", "-I", "-S", "-c"] and peer.close_argv()[5] == "close"


@pytest.mark.parametrize(
    ("status", "words"),
    [
        (255, ["cannot SSH", "node a", "node b", "ops@10.0.0.2:22", "nothing was sent", "next:", "boom"]),
        (SourceExit.PEER_FOLDER, ["private folder /tmp/qni-x", "node a", "nothing was sent", "next:"]),
    ],
)
def test_a_failed_handshake_names_both_nodes_and_what_to_do(status, words):
    source = Node.from_dict("source", node("node a", "10.0.0.1"))
    destination = Node.from_dict("destination", node("node b", "10.0.0.2"))
    peer = Peer(peer_target(destination, Tuning()), "/tmp/qni-x")
    message = str(
        peer_unreachable(source, destination, peer, status, "ssh: connect to host 10.0.0.2 port 22: boom")
    )
    assert all(word in message for word in words), message


def test_new_access_details_for_the_destination_update_in_place(monkeypatch):
    """A new key or known_hosts for the same node is an update (refresh/destroy then use it), not a copy."""
    news = {**olds(), "destination": {**node("b", "h2"), "known_hosts": "/new/known_hosts"}}
    result = NodeImageProvider().diff("b/app:1", olds(), news)
    assert result.changes is True and result.replaces == []
    updated = NodeImageProvider().update("b/app:1", olds(), news).outs
    assert updated["destination"]["known_hosts"] == "/new/known_hosts"
    assert updated["image_id"] == "sha256:x"


class _RecordingDestination:
    """DockerOn stand-in for delete(): records the image_tag calls."""

    def __init__(self):
        self.calls: list[tuple[str, dict]] = []

    def __call__(self, *args, **kwargs):
        return self

    def tags(self, mode, spec, python="python3", end=None):
        self.calls.append((mode, spec))
        return {"exit": 0}


@pytest.mark.parametrize(
    ("state", "spec"),
    [
        (
            {"claim": "c1", "placed_tag": True},
            {"ref": "app:1", "claim": "c1", "legacy_placed_id": "", "keep": 1},
        ),
        (
            {"claim": "c2", "holds_tag": True},
            {"ref": "app:1", "claim": "c2", "legacy_placed_id": "", "keep": 1},
        ),  # joined
        # from before tag records: what it placed, never what a refresh saw later
        (
            {"placed_tag": True, "placed_image_id": "sha256:x", "image_id": "sha256:drifted"},
            {"ref": "app:1", "claim": "", "legacy_placed_id": "sha256:x", "keep": 1},
        ),
        (
            {"claim": "c3", "placed_tag": True, "keep_previous": 0},
            {"ref": "app:1", "claim": "c3", "legacy_placed_id": "", "keep": 0},
        ),
    ],
    ids=["placed", "joined", "legacy", "keep-none"],
)
def test_delete_gives_up_its_hold_on_the_node(monkeypatch, state, spec):
    fake = _RecordingDestination()
    monkeypatch.setattr(execute, "DockerOn", fake)
    monkeypatch.setattr(execute, "ssh_sessions", lambda: contextlib.nullcontext(lambda name: None))
    NodeImageProvider().delete("b/app:1", olds(**state))
    assert fake.calls == [("leave", spec)]


STATEFUL_DOCKER = """#!{python}
import json, os, sys
path = os.environ["FAKE_DOCKER_STATE"]
tags = json.load(open(path)) if os.path.exists(path) else {{}}
args = sys.argv[1:]
def save():
    json.dump(tags, open(path, "w"))
if args[:2] == ["image", "inspect"]:
    ref = args[-1]
    if ref not in tags:
        sys.stderr.write("Error: No such image: " + ref + "\\n"); sys.exit(1)
    print(tags[ref]); sys.exit(0)
if args[0] == "tag":
    tags[args[2]] = tags.get(args[1], args[1]); save(); sys.exit(0)
if args[:2] == ["image", "rm"]:
    if args[2] not in tags:
        sys.exit(1)
    del tags[args[2]]; save(); sys.exit(0)
sys.exit(2)
"""


@pytest.fixture
def node_docker(tmp_path, monkeypatch):
    """A stand-in docker whose tags live in a file, and a HOME for the tag records: (tags, run image_tag)."""
    import subprocess
    import sys

    docker = tmp_path / "bin" / "docker"
    docker.parent.mkdir()
    docker.write_text(STATEFUL_DOCKER.format(python=sys.executable))
    docker.chmod(0o755)
    state = tmp_path / "tags.json"
    monkeypatch.setenv("PATH", f"{docker.parent}:/usr/bin:/bin")
    monkeypatch.setenv("FAKE_DOCKER_STATE", str(state))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))

    def tags() -> dict:
        return json.loads(state.read_text()) if state.exists() else {}

    def image_tag(mode: str, **spec) -> dict:
        argv = program_argv("image_tag", [mode, json.dumps(spec)], sys.executable)
        done = subprocess.run(argv, capture_output=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout.decode().splitlines()[-1])

    return tags, image_tag


def test_a_replacement_keeps_the_tag_and_the_survivor_removes_it(node_docker):
    """The engine creates the new resource, then deletes the old one: the tag survives the old one."""
    tags, image_tag = node_docker
    image_tag("retag", ref="app:1", image_id="sha256:x", claim="old")  # the old resource placed it
    assert image_tag("join", ref="app:1", claim="new")["joined"] is True  # the new one found it there
    assert image_tag("leave", ref="app:1", claim="old", legacy_placed_id="")["removed"] is False
    assert tags() == {"app:1": "sha256:x"}
    assert image_tag("leave", ref="app:1", claim="new", legacy_placed_id="")["removed"] is True
    assert tags() == {}


def test_the_last_holder_keeps_a_bounded_number_of_previous_images(node_docker):
    """keep_previous: the replaced image stays tagged while a newer one is held (a rollback joins it,
    copying nothing); of one repository's previous images only the `keep` newest stay; when the last
    image of the repository is let go (a destroy), nothing is kept."""
    tags, image_tag = node_docker
    for n in (1, 2, 3):
        image_tag("retag", ref=f"app:{n}", image_id=f"sha256:{n}", claim=f"c{n}")
    left = image_tag("leave", ref="app:1", claim="c1", legacy_placed_id="", keep=1)
    assert (left["removed"], left["retained"], left["previous"], left["pruned"]) == (
        False,
        True,
        ["app:1"],
        [],
    )
    left = image_tag("leave", ref="app:2", claim="c2", legacy_placed_id="", keep=1)
    assert (left["previous"], left["pruned"]) == (["app:2"], ["app:1"])
    assert tags() == {"app:2": "sha256:2", "app:3": "sha256:3"}
    # The rollback: a new resource finds app:2 kept and holds it again; app:3 is now the kept one.
    assert image_tag("join", ref="app:2", claim="back")["joined"] is True
    left = image_tag("leave", ref="app:3", claim="c3", legacy_placed_id="", keep=1)
    assert (left["previous"], left["pruned"]) == (["app:3"], [])
    assert image_tag("leave", ref="app:2", claim="back", legacy_placed_id="", keep=1)["removed"] is True
    assert tags() == {}


def test_a_tag_no_nodeimage_placed_is_never_removed(node_docker):
    tags, image_tag = node_docker
    image_tag("retag", ref="base:1", image_id="sha256:b", claim="")  # by hand: no record
    assert image_tag("join", ref="base:1", claim="c")["joined"] is False
    assert image_tag("leave", ref="base:1", claim="c", legacy_placed_id="")["removed"] is False
    assert tags() == {"base:1": "sha256:b"}


def test_a_replacement_of_state_from_before_records_keeps_the_tag_for_the_survivor(node_docker):
    """The old resource placed the tag before records existed (placed_tag, no claim, no record): the new
    one finds it there and waits; the old one's delete hands the tag over instead of removing it, and
    the survivor's delete removes it."""
    tags, image_tag = node_docker
    image_tag("retag", ref="app:1", image_id="sha256:x", claim="")  # no record, as before records
    joined = image_tag("join", ref="app:1", claim="new")
    assert joined["joined"] is False and joined["waiting"] is True
    assert image_tag("leave", ref="app:1", claim="", legacy_placed_id="sha256:x")["removed"] is False
    assert tags() == {"app:1": "sha256:x"}
    assert image_tag("leave", ref="app:1", claim="new", legacy_placed_id="")["removed"] is True
    assert tags() == {}


def test_a_waiting_claim_on_a_tag_placed_by_hand_never_removes_it(node_docker):
    tags, image_tag = node_docker
    image_tag("retag", ref="base:1", image_id="sha256:b", claim="")  # by hand: no record
    assert image_tag("join", ref="base:1", claim="c1")["waiting"] is True
    assert image_tag("join", ref="base:1", claim="c2")["joined"] is False  # still nobody holds it
    assert image_tag("leave", ref="base:1", claim="c1", legacy_placed_id="")["removed"] is False
    assert image_tag("leave", ref="base:1", claim="c2", legacy_placed_id="")["removed"] is False
    assert tags() == {"base:1": "sha256:b"}
    # nothing left waiting: a later legacy delete of another image's state does not hand anything over
    assert image_tag("leave", ref="base:1", claim="", legacy_placed_id="sha256:other")["removed"] is False


def test_a_legacy_delete_hands_over_only_what_it_placed(node_docker):
    tags, image_tag = node_docker
    image_tag("retag", ref="app:1", image_id="sha256:x", claim="")
    image_tag("join", ref="app:1", claim="new")
    image_tag("retag", ref="app:1", image_id="sha256:y", claim="")  # re-pointed by hand since
    assert image_tag("leave", ref="app:1", claim="", legacy_placed_id="sha256:x")["removed"] is False
    assert image_tag("leave", ref="app:1", claim="new", legacy_placed_id="")["removed"] is False
    assert tags() == {"app:1": "sha256:y"}


@pytest.mark.parametrize(
    ("joined", "claim_kept", "holds"),
    [
        ({"joined": True, "waiting": False}, True, True),
        ({"joined": False, "waiting": True}, True, False),  # may be handed the tag by a legacy delete
        ({"joined": False, "waiting": False}, False, False),
    ],
    ids=["joined", "waiting", "neither"],
)
def test_a_skip_keeps_its_claim_when_it_joined_or_waits(joined, claim_kept, holds):
    from components.node_image.facts import Facts
    from components.node_image.plan import Skip
    from components.transfer import PhaseTimes

    class Destination:
        node = Node.from_dict("destination", node("b", "h2"))

        def tags(self, mode, spec, python="python3", end=None):
            assert mode == "join"
            return joined

    info, daemon = ImageInfo("sha256:x", (L1,)), Daemon("classic", "/var/lib/docker", "26.1")
    facts = Facts(Destination.node, "app:1", daemon, info)
    props = {**olds(), "tuning": {}}
    job = execute.CopyJob(
        "app:1", None, Destination(), facts, facts, None, None, CopyConfig(), "c1", PhaseTimes()
    )
    outs = execute.carry_out(Skip(info, daemon, True), props, job, None)
    assert bool(outs["claim"]) is claim_kept and outs["holds_tag"] is holds and outs["placed_tag"] is False


def test_a_tag_pointed_elsewhere_since_is_not_removed_nor_joined(node_docker):
    tags, image_tag = node_docker
    image_tag("retag", ref="app:1", image_id="sha256:x", claim="a")
    image_tag("retag", ref="app:1", image_id="sha256:y", claim="")  # re-pointed by hand, record kept
    assert image_tag("join", ref="app:1", claim="b")["joined"] is False
    assert image_tag("leave", ref="app:1", claim="a", legacy_placed_id="")["removed"] is False
    assert tags() == {"app:1": "sha256:y"}


def test_a_holder_superseded_by_a_new_placement_does_not_remove_it(node_docker):
    tags, image_tag = node_docker
    image_tag("retag", ref="app:1", image_id="sha256:x", claim="old")
    image_tag("retag", ref="app:1", image_id="sha256:y", claim="new")  # a new image placed: new holder
    assert image_tag("leave", ref="app:1", claim="old", legacy_placed_id="")["removed"] is False
    assert tags() == {"app:1": "sha256:y"}


@pytest.mark.parametrize(("on_node", "removed"), [("sha256:x", True), ("sha256:other", False)])
def test_state_from_before_records_removes_only_what_it_placed(node_docker, on_node, removed):
    tags, image_tag = node_docker
    image_tag("retag", ref="app:1", image_id=on_node, claim="")
    assert image_tag("leave", ref="app:1", claim="", legacy_placed_id="sha256:x")["removed"] is removed
    assert ("app:1" in tags()) is not removed


FAKE_DOCKER = """#!{python}
import json, os, sys
log = os.environ["FAKE_DOCKER_LOG"]
args = sys.argv[1:]
with open(log, "a") as handle:
    handle.write(json.dumps(args) + "\\n")
if args[0] == "load":
    data = sys.stdin.buffer.read()
    sys.exit(0 if data == b"archive" else 1)
if args[:2] == ["image", "inspect"]:
    print(os.environ["FAKE_DOCKER_IMAGE"])
if args[:2] == ["image", "rm"] and os.environ.get("FAKE_DOCKER_RM_FAILS"):
    sys.stderr.write("Error response from daemon: busy\\n"); sys.exit(1)
if args[:2] == ["image", "rm"] and os.environ.get("FAKE_DOCKER_RM_MISSING"):
    sys.stderr.write("Error: No such image: " + args[2] + "\\n"); sys.exit(1)
sys.exit(0)
"""


def fake_docker_cli(tmp_path, monkeypatch, image_line: str, engine_socket: str | None = None) -> Path:
    """A stand-in `docker` first on PATH (loads "archive", inspects as `image_line`), a HOME for the tag
    records, and DOCKER_HOST: `engine_socket`, or a socket that is not there (the CLI does it all); the
    log of the CLI's calls."""
    import sys

    docker = tmp_path / "docker"
    docker.write_text(FAKE_DOCKER.format(python=sys.executable))
    docker.chmod(0o755)
    log = tmp_path / "log"
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("FAKE_DOCKER_LOG", str(log))
    monkeypatch.setenv("FAKE_DOCKER_IMAGE", image_line)
    monkeypatch.setenv("DOCKER_HOST", f"unix://{engine_socket or tmp_path / 'no-engine.sock'}")
    return log


class StandinEngine:
    """A stand-in Docker Engine API on a unix socket: one image under `tmp_ref`; records each request
    and what the tag and untag requests changed."""

    def __init__(self, folder: Path, tmp_ref: str, loaded: dict):
        import http.server
        import socketserver
        import threading

        self.path = str(folder / "engine.sock")
        self.requests: list[str] = []
        self.refs = {tmp_ref: loaded}
        self.drop_delete_answer = False
        self.info: dict | None = None  # GET /info's answer (404 when None)
        self.histories: dict[str, list] = {}  # GET /images/<ref>/history's answers
        self.broken: set[str] = set()  # paths answered 500
        self.listed: dict[str, dict] = {}  # GET /images/json?all=1's images (and their inspections), by ID
        engine = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def address_string(self):
                return "local"

            def log_message(self, *args):
                pass

            def answer(self, status: int, body: object = None):
                data = json.dumps(body).encode() if body is not None else b""
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                engine.requests.append(f"GET {self.path}")
                if self.path in engine.broken:
                    return self.answer(500, {"message": "broken"})
                if self.path == "/info":
                    return self.answer(200, engine.info) if engine.info else self.answer(404, {})
                if self.path == "/images/json?all=1":
                    return self.answer(200, [{"Id": image_id} for image_id in engine.listed])
                listed = engine.listed.get(urllib.parse.unquote(self.path)[len("/images/") : -len("/json")])
                if listed is not None:
                    return self.answer(200, listed)
                if self.path.endswith("/history"):
                    ref = urllib.parse.unquote(self.path.removeprefix("/images/").removesuffix("/history"))
                    found = engine.histories.get(ref)
                    return self.answer(200, found) if found is not None else self.answer(404, {})
                ref = urllib.parse.unquote(self.path.removeprefix("/images/").removesuffix("/json"))
                self.answer(200, engine.refs[ref]) if ref in engine.refs else self.answer(404, {})

            def do_POST(self):
                engine.requests.append(f"POST {self.path}")
                path, _, query = self.path.partition("?")
                ref = urllib.parse.unquote(path.removeprefix("/images/").removesuffix("/tag"))
                asked = dict(urllib.parse.parse_qsl(query))
                engine.refs[f"{asked['repo']}:{asked['tag']}"] = engine.refs[ref]
                self.answer(201)

            def do_DELETE(self):
                engine.requests.append(f"DELETE {self.path}")
                gone = engine.refs.pop(urllib.parse.unquote(self.path.removeprefix("/images/")), None)
                if engine.drop_delete_answer:  # removed, but the answer is lost
                    self.close_connection = True
                    self.wfile.flush()
                    self.connection.shutdown(2)
                    return
                self.answer(200, []) if gone else self.answer(404, {"message": "No such image"})

        class Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
            daemon_threads = True

        self.server = Server(self.path, Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize("engine", ["cli", "api"])
@pytest.mark.parametrize(
    ("loaded_id", "same_store", "status", "promoted"),
    [
        ("sha256:ab", True, 0, True),
        ("sha256:other", True, 4, False),  # not the wanted image: never tagged, temporary tag dropped
        ("sha256:manifest", False, 0, True),  # across store kinds the layer list is the identity
    ],
    ids=["same-id", "other-image", "across-stores"],
)
def test_destination_loads_verifies_and_promotes_in_one_program(
    tmp_path, monkeypatch, loaded_id, same_store, status, promoted, engine
):
    """`docker load` by the CLI, then inspect, tag and untag: by the Engine API when the daemon's
    socket is plain (DOCKER_HOST unix://…) and it finds the temporary tag, else by the CLI; the same
    outcome either way."""
    import subprocess
    import sys

    api = None
    if engine == "api":
        api = StandinEngine(
            tmp_path, "app:qwen35-tmp-1", {"Id": loaded_id, "RootFS": {"Layers": [L1, L2]}, "Size": 7}
        )
    log = fake_docker_cli(tmp_path, monkeypatch, f'"{loaded_id}"\t["{L1}","{L2}"]\t7', api and api.path)
    argv = ni.load_argv(
        "app:qwen35-tmp-1", "app:1", ImageInfo("sha256:ab", (L1, L2)), same_store, sys.executable
    )
    try:
        done = subprocess.run(argv, input=b"archive", capture_output=True, timeout=60)
    finally:
        if api is not None:
            api.close()
    report = json.loads(done.stdout.decode().strip().splitlines()[-1])
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert done.returncode == status and report["promoted"] is promoted and report["exit"] == status
    assert parse_images(report["loaded"])[0] == ImageInfo(loaded_id, (L1, L2), 7)
    if api is None:
        tagged = ["tag", "app:qwen35-tmp-1", "app:1"] in calls
        assert tagged is promoted
        assert calls[-1] == ["image", "rm", "app:qwen35-tmp-1"]  # the temporary tag goes either way
        return
    assert calls == [["load"]]  # the CLI only loaded
    assert ("POST /images/app:qwen35-tmp-1/tag?repo=app&tag=1" in api.requests) is promoted
    assert api.requests[-1] == "DELETE /images/app:qwen35-tmp-1"
    assert set(api.refs) == ({"app:1"} if promoted else set())


FACTS_DOCKER = """#!{python}
import json, os, sys
args = sys.argv[1:]
if os.environ.get("FAKE_DOCKER_LOG"):
    with open(os.environ["FAKE_DOCKER_LOG"], "a") as log:
        log.write(json.dumps(args[:2]) + "\\n")
if args[0] == "info":
    status = '[["driver-type","io.containerd.snapshotter.v1"]]'
    print(status + '\\t' + os.environ["FAKE_ROOT"] + '\\t29.0.0\\toverlayfs')
elif args[:2] == ["image", "inspect"] and args[-1] == "app:1":
    print('"sha256:ab"\\t["{l1}","{l2}"]\\t123')
elif args[:2] == ["image", "inspect"]:
    print("\\n".join('"' + ref + '"\\t["{l1}"]\\t5' for ref in args[4:]))
elif args[0] == "history":
    print("0\\n100\\n23")
elif args[:2] == ["image", "ls"] and os.environ.get("FAKE_LS_FAILS"):
    sys.stderr.write("permission denied\\n")
    sys.exit(1)
elif args[:2] == ["image", "ls"]:
    print("sha256:b\\nsha256:a\\nsha256:b")
else:
    sys.exit(1)
"""


@pytest.mark.parametrize("engine", ["cli", "api", "api failing midway"])
def test_facts_of_a_node_in_one_program(tmp_path, monkeypatch, engine):
    """The same facts whether the Engine API answers (where DOCKER_HOST is a plain unix socket) or
    the CLI does; an API that fails midway leaves every answer to the CLI and says why."""
    import subprocess
    import sys

    from components.node_image.facts import parse_facts
    from components.node_image.programs import facts_argv

    docker = tmp_path / "bin" / "docker"
    docker.parent.mkdir()
    docker.write_text(FACTS_DOCKER.format(python=sys.executable, l1=L1, l2=L2))
    docker.chmod(0o755)
    root = tmp_path / "docker-root"
    blobs = root / "containerd" / "daemon" / "io.containerd.content.v1.content" / "blobs" / "sha256"
    blobs.mkdir(parents=True)
    (blobs / L1.split(":")[1]).write_bytes(b"")
    log = tmp_path / "calls"
    monkeypatch.setenv("PATH", f"{docker.parent}:/usr/bin:/bin")
    monkeypatch.setenv("FAKE_ROOT", str(root))
    monkeypatch.setenv("FAKE_DOCKER_LOG", str(log))
    api = None
    if engine != "cli":
        api = StandinEngine(
            tmp_path, "app:1", {"Id": "sha256:ab", "RootFS": {"Layers": [L1, L2]}, "Size": 123}
        )
        status = [["driver-type", "io.containerd.snapshotter.v1"]]
        api.info = {
            "DriverStatus": status,
            "DockerRootDir": str(root),
            "ServerVersion": "29.0.0",
            "Driver": "overlayfs",
        }
        api.histories["app:1"] = [{"Size": 0}, {"Size": 100}, {"Size": 23}]
        api.listed = {  # what the fake CLI lists and inspects too
            "sha256:a": {"Id": "sha256:a", "RootFS": {"Layers": [L1]}, "Size": 100},
            "sha256:b": {"Id": "sha256:b", "RootFS": {"Layers": [L1, L2]}, "Size": 123},
        }
        if engine == "api failing midway":
            api.broken.add("/images/app:1/history")
        monkeypatch.setenv("DOCKER_HOST", f"unix://{api.path}")
    argv = facts_argv("app:1", history=True, inventory=True)
    argv[0] = sys.executable
    try:
        done = subprocess.run(argv, capture_output=True, timeout=60)
    finally:
        if api is not None:
            api.close()
    assert done.returncode == 0, done.stderr
    facts = parse_facts(Node.from_dict("d", node("b", "h2")), "app:1", done.stdout.decode(), True, True, True)
    assert facts.daemon == Daemon("containerd", str(root), "29.0.0", "overlayfs")
    assert facts.image == ImageInfo("sha256:ab", (L1, L2), 123) and facts.history.split() == [
        "0",
        "100",
        "23",
    ]
    assert [i.image_id for i in facts.images] == ["sha256:a", "sha256:b"]  # each image once
    assert facts.blobs == frozenset({L1}) and facts.free > 0 and facts.python.endswith("python3")
    report = json.loads(done.stdout.decode().splitlines()[-1])
    calls = {tuple(json.loads(line)) for line in log.read_text().splitlines()} if log.exists() else set()
    inventory = {("image", "ls"), ("image", "inspect")}  # a containerd store's: asked of the daemon
    if engine == "api":
        # No `docker` process at all: the inventory too is the API's (its list, then each image).
        assert report["facts_from"] == "engine api" and report["inventory_from"] == "engine api"
        assert calls == set(), calls
        assert api.requests == [
            "GET /info",
            "GET /images/app:1/json",
            "GET /images/app:1/history",
            "GET /images/json?all=1",
            "GET /images/sha256:a/json",
            "GET /images/sha256:b/json",
        ]
    else:
        asked = inventory | {("info", "--format"), ("history", "--no-trunc")}
        assert report["facts_from"] == "docker" and calls == asked, calls
        assert ("status 500" in report["api_error"]) if api else ("api_error" in report)  # (no socket)


def test_an_inventory_that_fails_after_the_api_answered_is_not_asked_again(tmp_path, monkeypatch):
    """Only the API's own requests fall back to the CLI: an inventory the daemon refuses is the
    report's failure, said once (not every fact asked again of the CLI)."""
    import subprocess
    import sys

    from components.node_image.programs import facts_argv

    docker = tmp_path / "bin" / "docker"
    docker.parent.mkdir()
    docker.write_text(FACTS_DOCKER.format(python=sys.executable, l1=L1, l2=L2))
    docker.chmod(0o755)
    log = tmp_path / "calls"
    for name, value in (("PATH", f"{docker.parent}:/usr/bin:/bin"), ("FAKE_DOCKER_LOG", str(log))):
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("FAKE_LS_FAILS", "1")
    api = StandinEngine(tmp_path, "app:1", {"Id": "sha256:ab", "RootFS": {"Layers": [L1]}, "Size": 1})
    status = [["driver-type", "io.containerd.snapshotter.v1"]]
    api.info = {"DriverStatus": status, "DockerRootDir": str(tmp_path), "ServerVersion": "29", "Driver": "x"}
    api.broken.add("/images/json?all=1")  # the API's inventory fails: the CLI's is tried, once
    monkeypatch.setenv("DOCKER_HOST", f"unix://{api.path}")
    argv = facts_argv("app:1", inventory=True)
    argv[0] = sys.executable
    try:
        done = subprocess.run(argv, capture_output=True, timeout=60)
    finally:
        api.close()
    report = json.loads(done.stdout.decode().splitlines()[-1])
    assert done.returncode == 4 and report["facts_from"] == "engine api"
    assert report["api_error"].startswith("inventory: EngineError: GET /images/json: status 500")
    assert "permission denied" in report["stderr"]
    assert [json.loads(line) for line in log.read_text().splitlines()] == [["image", "ls"]]


CLASSIC_DOCKER = """#!{python}
import os, sys
args = sys.argv[1:]
if args[0] == "info":
    print('[["Backing Filesystem","extfs"]]\\t' + os.environ["FAKE_ROOT"] + '\\t26.1.5\\toverlay2')
elif args[:2] == ["image", "inspect"] and args[-1] == "app:1":
    print('"sha256:ab"\\t["{l1}"]\\t3')
elif args[:2] == ["image", "ls"] and os.environ.get("FAKE_LS"):
    print("sha256:" + "f" * 64)
elif args[:2] == ["image", "inspect"] and os.environ.get("FAKE_LS"):
    print('"sha256:' + "f" * 64 + '"\\t["{l1}"]\\t9')
else:
    sys.exit(1)  # asked of the daemon: the store's files were meant to answer
"""


def classic_store(root: Path, images: dict[str, list[str]], sizes: dict[str, int]) -> None:
    """A classic overlay2 store's files: image configs by ID, layer sizes by chain ID."""
    from components.node_programs.wire import chain_ids

    configs = root / "image" / "overlay2" / "imagedb" / "content" / "sha256"
    layers = root / "image" / "overlay2" / "layerdb" / "sha256"
    configs.mkdir(parents=True)
    layers.mkdir(parents=True)
    for hex_id, diff_ids in images.items():
        (configs / hex_id).write_text(json.dumps({"rootfs": {"type": "layers", "diff_ids": diff_ids}}))
        for diff_id, chain in zip(diff_ids, chain_ids(diff_ids), strict=True):
            (layers / chain.removeprefix("sha256:")).mkdir(exist_ok=True)
            (layers / chain.removeprefix("sha256:") / "size").write_text(str(sizes[diff_id]))


def classic_facts(tmp_path, monkeypatch, root: Path) -> dict:
    import subprocess
    import sys

    from components.node_image.programs import facts_argv

    docker = tmp_path / "bin" / "docker"
    docker.parent.mkdir(exist_ok=True)
    docker.write_text(CLASSIC_DOCKER.format(python=sys.executable, l1=L1))
    docker.chmod(0o755)
    monkeypatch.setenv("PATH", f"{docker.parent}:/usr/bin:/bin")
    monkeypatch.setenv("FAKE_ROOT", str(root))
    argv = facts_argv("app:1", inventory=True)
    argv[0] = sys.executable
    done = subprocess.run(argv, capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.decode().splitlines()[-1])


def test_a_classic_stores_inventory_is_read_from_its_files(tmp_path, monkeypatch):
    from components.node_image.facts import parse_images

    root = tmp_path / "docker-root"
    a, b, empty = "a" * 64, "b" * 64, "e" * 64
    classic_store(root, {a: [L1], b: [L1, L2], empty: []}, {L1: 100, L2: 23})
    report = classic_facts(tmp_path, monkeypatch, root)
    assert report["inventory_from"] == "store files"
    assert parse_images(report["images"]) == [  # sizes as the daemon reports them: its layers' sum
        ImageInfo(f"sha256:{a}", (L1,), 100),
        ImageInfo(f"sha256:{b}", (L1, L2), 123),
        ImageInfo(f"sha256:{empty}", (), 0),
    ]


def test_an_image_whose_layer_went_meanwhile_and_a_config_being_written_are_left_out(tmp_path, monkeypatch):
    from components.node_image.facts import parse_images
    from components.node_programs.wire import chain_ids

    root = tmp_path / "docker-root"
    a, b = "a" * 64, "b" * 64
    classic_store(root, {a: [L1], b: [L1, L2]}, {L1: 100, L2: 23})
    configs = root / "image" / "overlay2" / "imagedb" / "content" / "sha256"
    (configs / ".tmp-config123").write_text('{"rootfs": {"diff_ids": []}}')  # being written by Docker
    top = chain_ids([L1, L2])[1].removeprefix("sha256:")
    (root / "image" / "overlay2" / "layerdb" / "sha256" / top / "size").unlink()  # deleted while read
    report = classic_facts(tmp_path, monkeypatch, root)
    assert [i.image_id for i in parse_images(report["images"])] == [f"sha256:{a}"]


@pytest.mark.parametrize("damage", ["no store", "unreadable config"])
def test_a_store_whose_files_cannot_be_read_is_asked_of_the_daemon(tmp_path, monkeypatch, damage):
    from components.node_image.facts import parse_images

    root = tmp_path / "docker-root"
    if damage == "unreadable config":
        classic_store(root, {"a" * 64: [L1]}, {L1: 100})
        (root / "image" / "overlay2" / "imagedb" / "content" / "sha256" / ("a" * 64)).write_text("{not json")
    else:
        root.mkdir()
    monkeypatch.setenv("FAKE_LS", "1")
    report = classic_facts(tmp_path, monkeypatch, root)
    assert report["inventory_from"] == "docker"
    assert parse_images(report["images"]) == [ImageInfo("sha256:" + "f" * 64, (L1,), 9)]


def test_a_temporary_tag_left_behind_only_warns_and_the_claim_stays_valid(tmp_path, monkeypatch):
    """The real tag is verified and recorded before the temporary tag goes: failing to remove the
    temporary tag must not fail the load (that would leave a claim no resource state knows)."""
    monkeypatch.setenv("FAKE_DOCKER_RM_FAILS", "1")
    report, _ = run_load(tmp_path, monkeypatch, None)
    assert report["exit"] == 0 and report["promoted"] is True, report
    assert "app:qwen35-tmp-1" in report["warning"] and "docker image rm" in report["warning"]
    records = list((tmp_path / "home" / ".qwen35" / "tags").glob("*.json"))
    assert [json.loads(r.read_text())["holders"] for r in records] == [["c1"]]


def _stream_with(stages: list, consumer_report: dict | None, failure=None) -> Exception:
    """execute._stream of a layer-store export whose transfer ended with these stage outcomes."""
    from components.node_image.errors import ExportFailed
    from components.node_image.facts import Facts
    from components.node_image.plan import Copy
    from components.transfer import Failure, StageOutcome, TransferResult

    a, b = Node.from_dict("source", node("a", "h1")), Node.from_dict("destination", node("b", "h2"))
    outcomes = [StageOutcome(name, status, [], report) for name, status, report in stages]
    failed = next((o for o in outcomes if o.status), None)
    why = f"{failed.name} exited {failed.status}" if failed else "no progress from the source for 150 s"

    class Session:
        def transfer(self, job, destination, tuning, end=None):
            return TransferResult(a, b, outcomes, 10, consumer_report, failure or Failure.STAGE, why, [])

    class On:
        def __init__(self, n):
            self.node = n

    info, daemon = ImageInfo("sha256:x", (L1,)), Daemon("classic", "/var/lib/docker", "26.1", "overlay2")
    export = {"root": "/var/lib/docker", "driver": "overlay2", "image_id": "sha256:x", "layout": "docker"}
    with pytest.raises((ExportFailed, NodeImageError)) as caught:
        job = execute.CopyJob(
            "app:1",
            On(a),
            On(b),
            Facts(a, "app:1", daemon, info),
            Facts(b, "app:1", daemon, None),
            None,
            None,
            CopyConfig(),
            "c1",
            execute.PhaseTimes(),
        )
        execute._stream(Copy((), 0, True, True, 10), job, "app:qwen35-tmp-1", export, None, Session())
    return caught.value


@pytest.mark.parametrize(
    ("producer", "consumer", "export_failed"),
    [
        ((3, {"error": "export-unavailable: no layer store"}), (2, {"exit": 2}), True),
        ((1, {"error": "OSError: unreadable layer"}), (2, {"exit": 2}), True),  # it failed first
        ((1, {"error": "BrokenPipeError: [Errno 32]"}), (2, {"exit": 2}), False),  # the load failed first
        ((0, {}), (2, {"exit": 2}), False),  # docker load failed on the destination: not the export
        ((0, {}), (4, {"exit": 4}), True),  # what the export gave did not match
    ],
    ids=["unavailable", "export-error", "load-first", "load-failed", "mismatch"],
)
def test_only_a_failed_export_falls_back_to_docker_save(producer, consumer, export_failed):
    from components.node_image.errors import ExportFailed

    error = _stream_with(
        [("layer export (source)", *producer), ("docker load (destination)", consumer[0], None)], consumer[1]
    )
    assert isinstance(error, ExportFailed) is export_failed, error


class _Session:
    """transfer.SourceSession stand-in: its peer, a scripted `before` status."""

    statuses: list[int] = []

    def __init__(self, node, peer, argv, control_path, times=None):
        self.peer = peer
        self.status = self.statuses.pop(0)

    def before(self):
        return self.status, "", ""

    def close(self):
        pass


def test_every_attempt_gets_a_connection_of_its_own(monkeypatch):
    """A retried source session and the docker save fallback each use a fresh private folder: a previous
    attempt's detached close removes its own folder and master, never the next attempt's."""
    from components.node_image.errors import ExportFailed
    from components.node_image.facts import Facts
    from components.node_image.plan import Copy
    from components.remote import SshTarget

    a = Node.from_dict("source", node("a", "h1"))
    peers = execute.Peers(SshTarget("h2", "ops", "/kh"))
    monkeypatch.setattr(execute.transfer, "SourceSession", _Session)
    monkeypatch.setattr(_Session, "statuses", [255, 0])
    monkeypatch.setattr(execute, "parse_facts", lambda *args, **kwargs: "facts")

    class On:
        node = a

        class transport:  # noqa: N801
            control_path = "/cp"

        def untag(self, ref):
            pass

    session, facts = execute.source_session(On(), peers, "app:1", execute.PhaseTimes())
    assert facts == "facts" and len(peers.made) == 2 and session.peer is peers.made[1]
    used = []

    def stream(how, job, tmp_tag, export, peer, session):
        used.append(peer)
        if len(used) == 1:
            raise ExportFailed("the layer store could not be read")
        return {"summary": {}, "bytes": 1, "image": job.at_source.image}

    monkeypatch.setattr(execute, "_stream", stream)
    info, daemon = ImageInfo("sha256:x", (L1,)), Daemon("classic", "/var/lib/docker", "26.1", "overlay2")
    at = Facts(a, "app:1", daemon, info)
    job = execute.CopyJob("app:1", On(), On(), at, at, peers, None, CopyConfig(), "c", execute.PhaseTimes())
    execute.copy_image(Copy((), 0, True, True, 1), job, session)
    assert used[0] is session.peer and used[1] is peers.made[2]
    assert len({peer.folder for peer in peers.made}) == 3


def test_an_unreadable_content_store_is_reported_not_silently_sent_in_full(tmp_path, monkeypatch):
    import subprocess
    import sys

    from components.node_image.facts import parse_facts
    from components.node_image.programs import facts_argv

    docker = tmp_path / "bin" / "docker"
    docker.parent.mkdir()
    docker.write_text(FACTS_DOCKER.format(python=sys.executable, l1=L1, l2=L2))
    docker.chmod(0o755)
    root = tmp_path / "docker-root"
    content = root / "containerd" / "daemon" / "io.containerd.content.v1.content" / "blobs"
    content.mkdir(parents=True)
    (content / "sha256").write_bytes(b"")  # cannot be listed (as for a user without read access)
    monkeypatch.setenv("PATH", f"{docker.parent}:/usr/bin:/bin")
    monkeypatch.setenv("FAKE_ROOT", str(root))
    argv = facts_argv("app:1", history=False, inventory=True)
    argv[0] = sys.executable
    done = subprocess.run(argv, capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.decode().splitlines()[-1])["blobs_listed"] is False
    facts = parse_facts(
        Node.from_dict("d", node("b", "h2")), "app:1", done.stdout.decode(), False, True, True
    )
    assert facts.blobs == frozenset() and str(content / "sha256") in facts.blobs_unlisted[0]


@pytest.mark.parametrize("unlisted", [(), ("/x/blobs/sha256: Permission denied",)])
def test_outputs_say_whether_the_content_store_was_listed(unlisted, capsys):
    from components.node_image.facts import Facts
    from components.node_image.plan import Skip
    from components.transfer import PhaseTimes

    b = Node.from_dict("destination", node("b", "h2"))

    class Destination:
        node = b

    info, daemon = ImageInfo("sha256:x", (L1,)), Daemon("containerd", "/var/lib/docker", "29.0")
    facts = Facts(b, "app:1", daemon, info, blobs_unlisted=unlisted)
    job = execute.CopyJob(
        "app:1", None, Destination(), facts, facts, None, None, CopyConfig(), "c1", PhaseTimes()
    )
    outs = execute.carry_out(Skip(info, daemon, False), olds(), job, None)
    assert outs["blobs_listed"] is (not unlisted)
    assert ("Permission denied" in capsys.readouterr().err) is bool(unlisted)


def test_a_transfer_without_a_report_is_an_error_not_a_crash():
    from components.node_image.errors import ExportFailed
    from components.transfer import Failure

    for failure in (Failure.TRANSPORT, Failure.STAGE):  # no stage outcomes at all
        error = _stream_with([], None, failure)
        assert isinstance(error, NodeImageError) and not isinstance(error, ExportFailed), error


def test_the_engine_api_is_used_only_where_the_cli_would_pick_the_same_plain_socket(tmp_path, monkeypatch):
    from components.node_programs import engine_api

    config = tmp_path / "docker-config"
    config.mkdir()
    monkeypatch.setenv("DOCKER_CONFIG", str(config))
    monkeypatch.delenv("DOCKER_CONTEXT", raising=False)
    monkeypatch.setenv("DOCKER_HOST", "unix:///run/user/1000/docker.sock")  # rootless, say
    assert engine_api.engine_socket() == "/run/user/1000/docker.sock"
    for elsewhere in ("tcp://10.0.0.9:2376", "ssh://ops@spark-1"):
        monkeypatch.setenv("DOCKER_HOST", elsewhere)
        assert engine_api.engine_socket() is None
    monkeypatch.delenv("DOCKER_HOST")
    assert engine_api.engine_socket() == "/var/run/docker.sock"  # no config: the default
    (config / "config.json").write_text(json.dumps({"currentContext": "default"}))
    assert engine_api.engine_socket() == "/var/run/docker.sock"
    (config / "config.json").write_text(json.dumps({"currentContext": "remote-box"}))
    assert engine_api.engine_socket() is None  # a context chosen: the CLI knows where it leads
    (config / "config.json").write_text("{not json")
    assert engine_api.engine_socket() is None
    (config / "config.json").unlink()
    monkeypatch.setenv("DOCKER_CONTEXT", "remote-box")
    assert engine_api.engine_socket() is None


def run_load(tmp_path, monkeypatch, api: StandinEngine | None) -> tuple[dict, list]:
    """`image_tag load` of the wanted image (the fake CLI loads; `api`, if given, is DOCKER_HOST's)."""
    import subprocess
    import sys

    log = fake_docker_cli(tmp_path, monkeypatch, f'"sha256:ab"\t["{L1}"]\t7', api and api.path)
    argv = ni.load_argv(
        "app:qwen35-tmp-1", "app:1", ImageInfo("sha256:ab", (L1,)), True, sys.executable, "c1"
    )
    try:
        done = subprocess.run(argv, input=b"archive", capture_output=True, timeout=60)
    finally:
        if api is not None:
            api.close()
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    return json.loads(done.stdout.decode().strip().splitlines()[-1]), calls


def test_an_engine_that_does_not_know_the_temporary_tag_is_not_the_one_loaded_into(tmp_path, monkeypatch):
    """Another daemon answers on the socket (a different DOCKER_HOST than the CLI's, say): the CLI
    does every step."""
    other = StandinEngine(
        tmp_path, "something:else", {"Id": "sha256:zz", "RootFS": {"Layers": []}, "Size": 1}
    )
    report, calls = run_load(tmp_path, monkeypatch, other)
    assert report["exit"] == 0 and report["promoted"] is True
    assert other.requests == ["GET /images/app:qwen35-tmp-1/json"] and set(other.refs) == {"something:else"}
    assert ["tag", "app:qwen35-tmp-1", "app:1"] in calls and calls[-1] == ["image", "rm", "app:qwen35-tmp-1"]


def test_an_api_answer_lost_after_the_temporary_tag_went_is_still_a_promotion(tmp_path, monkeypatch):
    """The API removed the temporary tag and the connection dropped before its answer: that step, and
    only it, goes to the CLI, which finds nothing left to remove. The copy is promoted and held, no
    warning."""
    api = StandinEngine(
        tmp_path, "app:qwen35-tmp-1", {"Id": "sha256:ab", "RootFS": {"Layers": [L1]}, "Size": 7}
    )
    api.drop_delete_answer = True
    monkeypatch.setenv("FAKE_DOCKER_RM_MISSING", "1")
    report, calls = run_load(tmp_path, monkeypatch, api)
    assert report["exit"] == 0 and report["promoted"] is True and "warning" not in report, report
    assert report["api_error"].startswith("untag: ") and set(api.refs) == {"app:1"}
    assert calls == [["load"], ["image", "rm", "app:qwen35-tmp-1"]]
    records = list((tmp_path / "home" / ".qwen35" / "tags").glob("*.json"))
    assert [json.loads(r.read_text())["holders"] for r in records] == [["c1"]]


def test_a_reference_splits_into_repository_and_tag_at_the_last_colon_after_the_last_slash():
    from components.node_programs.wire import split_tag as split_ref

    assert split_ref("app:1") == ("app", "1")
    assert split_ref("registry.lan:5000/team/vllm-node:qwen35-abc") == (
        "registry.lan:5000/team/vllm-node",
        "qwen35-abc",
    )
    assert split_ref("registry.lan:5000/team/vllm-node") == ("registry.lan:5000/team/vllm-node", "latest")


def _content_store(root, layout: str) -> None:
    content = root / "containerd" / "daemon" / "io.containerd.content.v1.content"
    if layout in ("fresh", "held"):
        (content / "ingest").mkdir(parents=True)  # what a fresh dockerd's containerd makes first
    if layout == "held":
        (content / "blobs" / "sha256").mkdir(parents=True)
        (content / "blobs" / "sha256" / ("a" * 64)).write_bytes(b"layer")


# (layout under the docker root, blobs listed, listed at all): an empty store is listed, and empty.
CONTENT_STORES = [
    ("held", ["a" * 64], True),
    ("fresh", [], True),  # a fresh node: the content store is there, no blob yet
    ("absent", [], False),  # no content store where dockerd's containerd keeps it: cannot be read
]


@pytest.mark.parametrize(("layout", "blobs", "listed"), CONTENT_STORES, ids=[c[0] for c in CONTENT_STORES])
def test_content_blobs_tells_an_empty_store_from_an_unreadable_one(
    tmp_path, monkeypatch, layout, blobs, listed
):
    from components.node_programs import docker_facts

    monkeypatch.setattr(docker_facts, "SYSTEM_CONTAINERD_ROOT", str(tmp_path / "no-system-containerd"))
    _content_store(tmp_path, layout)
    found, why = docker_facts.content_blobs(str(tmp_path))
    assert found == blobs and (not why) == listed, why


def test_content_blobs_names_a_store_it_may_not_read(tmp_path, monkeypatch):
    from components.node_programs import docker_facts

    monkeypatch.setattr(docker_facts, "SYSTEM_CONTAINERD_ROOT", str(tmp_path / "no-system-containerd"))
    _content_store(tmp_path, "held")
    real = docker_facts.os.listdir

    def refused(path):
        if "io.containerd.content.v1.content" in str(path):
            raise PermissionError(13, "Permission denied")
        return real(path)

    monkeypatch.setattr(docker_facts.os, "listdir", refused)
    found, why = docker_facts.content_blobs(str(tmp_path))
    assert found == [] and why and "Permission denied" in why[0], why
