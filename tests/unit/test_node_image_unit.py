"""NodeImage without nodes: facts parsing, decisions, errors, and the resource wiring under mocks."""

from __future__ import annotations

import contextlib
import json
import pickle

import pulumi
import pytest

import components.node_image as ni
from components.node_image import (
    Daemon,
    ImageInfo,
    Node,
    NodeImageError,
    NodeImageProvider,
    Tuning,
    copy_tree,
    disk_needed,
    parse_daemon,
    parse_df_available,
    parse_images,
    parse_layer_sizes,
    peer_target,
    replace_reasons,
    same_image,
)
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


def test_disk_need_counts_only_missing_layers():
    tuning = Tuning(disk_reserve_bytes=100, disk_factor=2.0)
    assert disk_needed([1000, 50, 10], 0, tuning) == 2 * 1060 + 100
    assert disk_needed([1000, 50, 10], 2, tuning) == 2 * 10 + 100


def test_identity_is_the_id_in_one_store_and_the_layers_across_stores():
    a, b = ImageInfo("sha256:a", (L1, L2)), ImageInfo("sha256:b", (L1, L2))
    assert not same_image(a, "classic", b, "classic")
    assert same_image(a, "containerd", b, "classic")
    assert not same_image(a, "containerd", ImageInfo("sha256:b", (L1,)), "classic")


def test_tuning_rejects_unknown_keys_with_a_hint():
    with pytest.raises(NodeImageError, match="did you mean 'stall_timeout_s'"):
        Tuning.from_props({"tuning": {"stall_timeout": 5}})
    with pytest.raises(NodeImageError, match="compression"):
        Tuning.from_props({"tuning": {"compression": "zip"}})
    assert Tuning.from_props({"tuning": {"disk_reserve_bytes": 1}}).disk_reserve_bytes == 1


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
    }
    return {**base, **extra}


@pytest.mark.parametrize(
    ("news", "source_now", "expected"),
    [
        ({}, (ImageInfo("sha256:x", (L1,)), "classic"), []),
        ({}, None, []),  # source unreachable during preview: inputs only
        ({}, (ImageInfo("sha256:y", (L1, L2)), "classic"), ["image"]),  # rebuilt on the source
        ({"image": "app:2"}, None, ["image"]),
        ({"destination": node("b", "h3")}, None, ["destination"]),
        ({"trigger": "new-build"}, None, ["trigger"]),
        (
            {"source": node("c", "h9")},
            (ImageInfo("sha256:x", (L1,)), "classic"),
            [],
        ),  # another source: same image
    ],
    ids=["same", "no-source", "source-rebuilt", "image", "destination", "trigger", "other-source"],
)
def test_replace_reasons(news, source_now, expected):
    assert replace_reasons(olds(), {**olds(), **news}, source_now) == expected


def test_drift_read_by_refresh_replaces():
    drifted = olds(image_id="sha256:other")
    assert replace_reasons(drifted, olds(), (ImageInfo("sha256:x", (L1,)), "classic")) == ["image"]
    cross = olds(image_id="sha256:manifest", store="containerd")  # own ID in the containerd store
    assert replace_reasons(cross, olds(), (ImageInfo("sha256:x", (L1,)), "classic")) == []


def test_delete_leaves_tags_it_did_not_place(monkeypatch):
    monkeypatch.setattr(ni, "DockerOn", lambda *a, **k: pytest.fail("no node should be contacted"))
    NodeImageProvider().delete("b/app:1", olds(placed_tag=False))


def test_provider_pickles_by_reference_without_state():
    provider = pickle.loads(pickle.dumps(NodeImageProvider()))
    assert type(provider).__module__ == "components.node_image" and vars(provider) == {}


def test_copy_tree_wires_one_resource_per_node_following_the_plan(monkeypatch):
    made = []

    class Recorder(pulumi.CustomResource):  # a Resource for depends_on, never registered
        def __init__(self, name, image, source, destination, tuning=None, trigger=None, opts=None):  # noqa: PLW0231
            self.name, self.source, self.destination = name, source["name"], destination["name"]
            self.depends_on = list(opts.depends_on or []) if opts else []
            made.append(self)

    monkeypatch.setattr(ni, "NodeImage", Recorder)
    nodes = {name: node(name, f"10.0.0.{i}") for i, name in enumerate(["head", "w1", "w2", "w3"])}
    tree = copy_tree("img", "app:1", nodes, "head", can_reexport={"w1", "w2", "w3"})
    assert set(tree) == set(nodes)
    assert (tree["head"].source, tree["head"].destination, tree["head"].depends_on) == ("head", "head", [])
    for worker in ("w1", "w2", "w3"):
        source = tree[worker].source
        assert tree[worker].depends_on == [tree[source]]  # a source serves only once it has the image
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
    dynamic = [r for r in mocks.resources if r.typ == "pulumi-python:dynamic:Resource"]
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
    assert "NodeImage timing app:1" in table and "source facts" in table and "stream" in table
    monkeypatch.delenv(ni.TIMING_ENV, raising=False)
    times.report()
    assert capsys.readouterr().err == ""
    monkeypatch.setenv(ni.TIMING_ENV, "1")
    times.report()
    assert "source facts" in capsys.readouterr().err


def test_destination_loads_verifies_and_promotes_in_one_session():
    wanted = ImageInfo("sha256:ab", (L1, L2))
    argv = ni.load_and_promote_argv("app:qwen35-tmp-1", "app:1", wanted, same_store=True)
    script = argv[-1]
    assert argv[:2] == ["bash", "--norc"] and script.startswith("docker load || exit $?")
    assert "cut -f1" in script and "'\"sha256:ab\"'" in script and "|| exit 4" in script
    assert script.index("docker tag app:qwen35-tmp-1 app:1") < script.index(
        "docker image rm app:qwen35-tmp-1"
    )
    across = ni.load_and_promote_argv("app:qwen35-tmp-1", "app:1", wanted, same_store=False)[-1]
    assert "cut -f2" in across and L1 in across


def test_peer_master_lives_in_a_private_folder_on_the_source():
    peer = ni.Peer(peer_target(Node.from_dict("destination", node("b", "10.0.0.2")), Tuning()), "/tmp/qni-x")
    opened = peer.handshake_argv()[-1]
    waited, _, opened = opened.partition("; done; ")
    # an early attempt (started during the inspection) is waited for, bounded by the connect timeout
    assert waited.startswith("i=0; while [ -d /tmp/qni-x ] && [ ! -s /tmp/qni-x/done ] && [ $i -lt 2500 ]")
    assert opened.startswith("{ mkdir -m 700 /tmp/qni-x") and "test -O /tmp/qni-x" in opened
    assert "ControlPath=/tmp/qni-x/m" in opened and "-O check" in opened
    # a new master, no remote shell; its stderr kept in the folder, not on the copy session's pipe
    assert "-o ControlMaster=yes" in opened and "-f -N ops@10.0.0.2" in opened
    assert "2>/tmp/qni-x/err" in opened
    closed = peer.close_argv()[-1]
    assert closed.startswith(waited) and "-O exit" in closed and closed.endswith("rm -rf /tmp/qni-x")
    early = peer.early_argv()[-1]
    assert "-f -N ops@10.0.0.2" in early and early.endswith('[ "$s" = 96 ] || echo "$s" > /tmp/qni-x/done')


def test_the_copy_connects_to_the_destination_before_anything_is_sent():
    peer = ni.Peer(peer_target(Node.from_dict("destination", node("b", "10.0.0.2")), Tuning()), "/tmp/qni-x")
    spec = ni.transfer.filter_spec([L1, L2], 1, "app:qwen35-tmp-1", 30, 60)
    script = ni.transfer.copy_pipeline(
        "app:1", spec, peer.argv(["docker", "load"]), first=peer.handshake_argv()
    )[-1]
    assert script.index("-f -N ops@10.0.0.2") < script.index("docker save app:1")
    assert 'exit "$s"; }; echo "qwen35-preflight 0"' in script


@pytest.mark.parametrize(
    ("status", "words"),
    [
        (255, ["cannot SSH", "node a", "node b", "ops@10.0.0.2:22", "nothing was sent", "next:", "boom"]),
        (ni.PEER_FOLDER_EXIT, ["private folder /tmp/qni-x", "node a", "nothing was sent", "next:"]),
    ],
)
def test_a_failed_handshake_names_both_nodes_and_what_to_do(status, words):
    source = Node.from_dict("source", node("node a", "10.0.0.1"))
    destination = Node.from_dict("destination", node("node b", "10.0.0.2"))
    peer = ni.Peer(peer_target(destination, Tuning()), "/tmp/qni-x")
    stderr = f"qwen35-preflight {status}\nssh: connect to host 10.0.0.2 port 22: boom"
    report = ni.transfer.parse_filter_stderr(stderr)
    assert report["preflight"] == status
    message = str(ni.peer_unreachable(source, destination, peer, status, "\n".join(report["other"])))
    assert all(word in message for word in words), message


def test_new_access_details_for_the_destination_update_in_place(monkeypatch):
    """A new key or known_hosts for the same node is an update (refresh/destroy then use it), not a copy."""
    import components.node_image as node_image

    monkeypatch.setattr(node_image, "_source_now", lambda news: None)
    news = {**olds(), "destination": {**node("b", "h2"), "known_hosts": "/new/known_hosts"}}
    result = NodeImageProvider().diff("b/app:1", olds(), news)
    assert result.changes is True and result.replaces == []
    updated = NodeImageProvider().update("b/app:1", olds(), news).outs
    assert updated["destination"]["known_hosts"] == "/new/known_hosts"
    assert updated["image_id"] == "sha256:x"


class _FakeDestination:
    """DockerOn stand-in for delete(): the tag points at `current`; records untag calls."""

    untagged: list[str] = []

    def __init__(self, current: str):
        self.current = current

    def __call__(self, *args, **kwargs):
        return self

    def image(self, ref):
        return ImageInfo(self.current, (L1,))

    def untag(self, ref):
        self.untagged.append(ref)
        return ni.Result(("docker",), 0)


@pytest.mark.parametrize(
    ("placed", "on_node", "untags"),
    [
        ("sha256:x", "sha256:x", True),  # still the image it placed
        ("sha256:x", "sha256:other", False),  # someone re-pointed the tag: not ours to remove
    ],
)
def test_delete_untags_only_the_image_it_placed_even_after_a_drifted_refresh(
    monkeypatch, placed, on_node, untags
):
    fake = _FakeDestination(on_node)
    fake.untagged = []
    monkeypatch.setattr(ni, "DockerOn", fake)
    monkeypatch.setattr(ni, "ssh_sessions", lambda: contextlib.nullcontext(lambda name: None))
    # A refresh saw the drifted tag and wrote its ID into image_id; placed_image_id keeps what was placed.
    state = olds(placed_tag=True, placed_image_id=placed, image_id=on_node)
    NodeImageProvider().delete("b/app:1", state)
    assert fake.untagged == (["app:1"] if untags else [])
