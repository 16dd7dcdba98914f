"""NodeImage without nodes: facts parsing, decisions, errors, and the resource wiring under mocks."""

from __future__ import annotations

import contextlib
import json
import pickle
import sys

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


def left(claim: str, keep: int = 1, legacy: str = "") -> list[tuple[str, dict]]:
    """The `leave` a delete runs: its claim, the image it placed (removed if the tag moved on)."""
    spec = {"ref": "app:1", "claim": claim, "legacy_placed_id": legacy, "placed_id": "sha256:x", "keep": keep}
    return [("leave", spec)]


@pytest.mark.parametrize(
    ("state", "calls"),
    [
        (
            {"claim": "c1", "placed_tag": True, "placed_image_id": "sha256:x"},
            left("c1"),
        ),
        # joined: what it verified at its creation, never what a refresh saw later
        (
            {"claim": "c2", "holds_tag": True, "verified_image_id": "sha256:x", "image_id": "sha256:later"},
            left("c2"),
        ),
        # from before tag records: what it placed, never what a refresh saw later
        (
            {"placed_tag": True, "placed_image_id": "sha256:x", "image_id": "sha256:drifted"},
            left("", legacy="sha256:x"),
        ),
        (
            {"claim": "c3", "placed_tag": True, "keep_previous": 0, "verified_image_id": "sha256:x"},
            left("c3", keep=0),
        ),
        # the head's copy of a build (no claim: the build placed the tag): only its image, if displaced
        ({"trigger": "sha256:x"}, [("drop", {"ref": "app:1", "placed_id": "sha256:x"})]),
        # found in place and not built here (a prebuilt image): the node is not contacted
        ({}, []),
        ({"trigger": "sha256:older"}, []),
    ],
    ids=["placed", "joined", "legacy", "keep-none", "built-on-the-head", "prebuilt", "trigger-elsewhere"],
)  # fmt: skip
def test_delete_gives_up_its_hold_on_the_node(monkeypatch, state, calls):
    fake = _RecordingDestination()
    monkeypatch.setattr(execute, "DockerOn", fake)
    monkeypatch.setattr(execute, "ssh_sessions", lambda: contextlib.nullcontext(lambda name: None))
    NodeImageProvider().delete("b/app:1", olds(**state))
    assert fake.calls == calls


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


def test_a_reference_splits_into_repository_and_tag_at_the_last_colon_after_the_last_slash():
    from components.node_programs.wire import split_tag as split_ref

    assert split_ref("app:1") == ("app", "1")
    assert split_ref("registry.lan:5000/team/vllm-node:qwen35-abc") == (
        "registry.lan:5000/team/vllm-node",
        "qwen35-abc",
    )
    assert split_ref("registry.lan:5000/team/vllm-node") == ("registry.lan:5000/team/vllm-node", "latest")


@pytest.mark.parametrize(
    ("answer", "said"),
    [
        ({"exit": 0, "displaced_kept": "sha256:x", "displaced_why": "image is being used by container 1f"},
         "the previous image sha256:x stays (image is being used by container 1f)"),
        (NodeImageError("destination b (h2): ssh: connect to host h2 port 22: No route to host"),
         "the build's previous image sha256:x was not checked for removal"),
    ],
    ids=["kept-in-use", "head-unreachable"],
)  # fmt: skip
def test_a_displaced_image_kept_or_unchecked_is_told_and_the_delete_goes_on(monkeypatch, answer, said):
    told: list[str] = []

    class Destination(_RecordingDestination):
        def tags(self, mode, spec, python="python3", end=None):
            super().tags(mode, spec)
            if isinstance(answer, Exception):
                raise answer
            return answer

    fake = Destination()
    monkeypatch.setattr(execute, "DockerOn", fake)
    monkeypatch.setattr(execute, "ssh_sessions", lambda: contextlib.nullcontext(lambda name: None))
    monkeypatch.setattr(execute, "tell_operator", told.append)
    NodeImageProvider().delete("a/app:1", olds(trigger="sha256:x"))  # the head's copy of a build
    assert [mode for mode, _ in fake.calls] == ["drop"] and len(told) == 1 and said in told[0], told
