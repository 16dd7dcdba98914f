"""NodeImage across the engine and image-store combinations that occur in the field.

node-a/node-b: Docker 20.10, classic store, old save layout; node-c: Docker 26 classic, OCI layout;
node-d: Docker 26 with the containerd store (image IDs differ there: identity is the layer list).
"""

from __future__ import annotations

import os
import subprocess

import pytest

import lab
from components.provider_kit.fan_out_tree import fan_out_tree
from tests.support.node_image_lab import PROVIDER, build, image_id, no_temporary_tags, props, remove, runs


def layers_of(node: lab.LabNode, ref: str) -> list[str]:
    return lab.docker(
        node, "image", "inspect", "--format", "{{range .RootFS.Layers}}{{.}} {{end}}", ref
    ).out.split()


@pytest.fixture(scope="module")
def images_on_c(node_c, node_a, node_b, node_d):
    for node in (node_a, node_b, node_c, node_d):
        lab.busybox_image(node)
    build(node_c, "ni-eng-base:1", "lab-busybox:1", os.urandom(500_000))
    wanted = build(node_c, "ni-eng:1", "ni-eng-base:1", os.urandom(100_000))
    return wanted


@pytest.mark.parametrize(("export", "layout"), [("save", "oci"), ("auto", "export")])
def test_oci_layout_source_to_classic_destination_is_thin(node_c, node_a, images_on_c, export, layout):
    PROVIDER.create(props("ni-eng-base:1", node_c, node_a))
    remove(node_a, "ni-eng:1")
    outs = PROVIDER.create(props("ni-eng:1", node_c, node_a, tuning={"source_export": export})).outs
    assert outs["layout"] == layout and outs["store"] == "classic" and outs["skipped"] is False
    assert outs["layers_left_out"] == 2 and outs["layers_sent"] == 1
    assert outs["bytes_sent"] <= 1.2 * 100_000
    assert outs["image_id"] == images_on_c == image_id(node_a, "ni-eng:1")
    assert "root" in runs(node_a, "ni-eng:1") and no_temporary_tags(node_a)


def test_legacy_source_to_classic_destination(node_a, node_b, node_c, images_on_c):
    PROVIDER.create(props("ni-eng:1", node_c, node_a))  # node-a holds it whatever ran before
    remove(node_b, "ni-eng:1")
    outs = PROVIDER.create(props("ni-eng:1", node_a, node_b, tuning={"source_export": "save"})).outs
    assert outs["layout"] == "legacy" and outs["image_id"] == images_on_c
    assert "root" in runs(node_b, "ni-eng:1")


def ctr(node: lab.LabNode, *args: str) -> str:
    """`ctr` against the containerd the node's dockerd started (namespace moby), from this machine."""
    from lab.layout import node_paths

    address = f"{node_paths(node.name).exec_root}/containerd/containerd.sock"
    argv = ["ctr", "--address", address, "-n", "moby", *args]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True)
    return done.stdout


def content_blobs(node: lab.LabNode) -> set[str]:
    """The blobs the node's containerd content store holds."""
    return set(ctr(node, "content", "ls", "-q").split())


def layers_in_use(node: lab.LabNode) -> set[str]:
    """Every layer of every image on the node."""
    ids = lab.docker(node, "image", "ls", "-a", "-q", "--no-trunc").out.split()
    listing = lab.docker(
        node, "image", "inspect", "--format", "{{range .RootFS.Layers}}{{.}} {{end}}", *set(ids)
    )
    return set(listing.out.split())


def test_oci_source_to_containerd_destination_leaves_out_held_blobs(node_c, node_d, images_on_c):
    # A known start, whatever ran before: the base just loaded (its blobs, and busybox's, in the
    # content store under their diff IDs), the image on top of it absent.
    remove(node_d, "ni-eng:1", "ni-eng-base:1")
    PROVIDER.create(props("ni-eng-base:1", node_c, node_d))
    base = set(layers_of(node_c, "ni-eng-base:1"))
    assert base <= content_blobs(node_d) & layers_in_use(node_d) and len(base) == 2
    outs = PROVIDER.create(props("ni-eng:1", node_c, node_d)).outs
    assert outs["store"] == "containerd" and outs["source_store"] == "classic"
    assert outs["layers_left_out"] == 2 and outs["layers_sent"] == 1  # only the top layer travels
    assert outs["layers"] == layers_of(node_c, "ni-eng:1") == layers_of(node_d, "ni-eng:1")
    assert outs["image_id"] == image_id(node_d, "ni-eng:1") != images_on_c  # the destination's own ID
    assert "root" in runs(node_d, "ni-eng:1") and no_temporary_tags(node_d)
    again = PROVIDER.create(props("ni-eng:1", node_c, node_d)).outs
    assert again["skipped"] is True and again["bytes_sent"] == 0


@pytest.mark.parametrize(("export", "layout"), [("save", "oci"), ("auto", "export-oci")])
def test_containerd_destination_gets_a_changed_top_layer_only(node_c, node_d, images_on_c, export, layout):
    """Loaded once, the base's blobs stay in the content store (under their diff IDs): a new top
    layer on the same base sends only that layer (from `docker save`, or read from the source's
    layer store as an OCI layout)."""
    PROVIDER.create(props("ni-eng-base:1", node_c, node_d))
    top = build(node_c, "ni-eng-top:1", "ni-eng-base:1", os.urandom(100_000))
    remove(node_d, "ni-eng-top:1")
    outs = PROVIDER.create(props("ni-eng-top:1", node_c, node_d, tuning={"source_export": export})).outs
    assert outs["layout"] == layout
    assert outs["layers_left_out"] == 2 and outs["layers_sent"] == 1 and outs["bytes_sent"] <= 1.2 * 100_000
    assert outs["layers"] == layers_of(node_c, "ni-eng-top:1") and top != outs["image_id"]
    assert "root" in runs(node_d, "ni-eng-top:1") and no_temporary_tags(node_d)
    remove(node_d, "ni-eng-top:1")


def test_containerd_destination_missing_a_blob_still_gets_it(node_c, node_d, images_on_c):
    """The base's blobs removed from node-d's content store: the copy sends them, the image runs."""
    PROVIDER.create(props("ni-eng-base:1", node_c, node_d))
    remove(node_d, "ni-eng:1")
    base_layers = layers_of(node_c, "ni-eng-base:1")
    held = content_blobs(node_d) & set(base_layers)
    assert held, "the base's layer blobs should be in node-d's content store after its load"
    ctr(node_d, "content", "rm", *sorted(held))
    assert not content_blobs(node_d) & set(base_layers)
    outs = PROVIDER.create(props("ni-eng:1", node_c, node_d)).outs
    assert outs["layers_left_out"] == 0 and outs["layers_sent"] == 3
    assert outs["layers"] == layers_of(node_d, "ni-eng:1") and "root" in runs(node_d, "ni-eng:1")
    assert set(base_layers) <= content_blobs(node_d)


def test_containerd_source_to_classic_destination(node_d, node_a, node_c, images_on_c):
    PROVIDER.create(props("ni-eng:1", node_c, node_d))
    remove(node_a, "ni-eng:1")
    outs = PROVIDER.create(props("ni-eng:1", node_d, node_a)).outs
    assert outs["source_store"] == "containerd" and outs["store"] == "classic"
    assert outs["layers"] == layers_of(node_d, "ni-eng:1")
    assert outs["image_id"] == image_id(node_a, "ni-eng:1")
    assert "root" in runs(node_a, "ni-eng:1")


def test_fan_out_never_uses_a_node_that_cannot_reexport(node_c, node_d, node_a, node_b, images_on_c):
    stores = {n.name: n.store for n in (node_a, node_b, node_c, node_d)}
    rounds = fan_out_tree("node-c", ["node-d", "node-a", "node-b"], lambda n: stores[n] != "containerd")
    sources = {src for round_ in rounds for src, _ in round_}
    assert "node-d" not in sources and len(rounds) == 2
    # Stores as the daemons report them drive the plan: every worker still gets the image.
    assert sorted(dst for round_ in rounds for _, dst in round_) == ["node-a", "node-b", "node-d"]


def test_declared_store_must_match_the_daemon(node_c, node_d, images_on_c):
    """The copy tree is planned from the stack's declared stores; a wrong declaration stops the copy."""
    from components.node_image import NodeImageError

    remove(node_d, "ni-eng:1")
    with pytest.raises(NodeImageError) as wrong:
        PROVIDER.create(props("ni-eng:1", node_c, node_d, image_store="classic"))
    message = str(wrong.value)
    assert "node-d: its Docker uses the containerd image store" in message, message
    assert "set image_store: containerd for node-d" in message, message
    assert image_id(node_d, "ni-eng:1") is None and no_temporary_tags(node_d)
    outs = PROVIDER.create(props("ni-eng:1", node_c, node_d, image_store="containerd")).outs
    assert outs["store"] == "containerd" and outs["destination"]["image_store"] == "containerd"


@pytest.mark.parametrize(
    ("name", "read_from"), [("node-a", "store files"), ("node-c", "store files"), ("node-d", "engine api")]
)
def test_the_inventory_read_from_a_classic_stores_files_is_what_the_daemon_reports(
    name, read_from, node_a, node_c, node_d, images_on_c
):
    """A classic store's inventory comes from its files (not one daemon request per image): the same
    images, layer lists and sizes `docker image inspect` reports; a containerd store's daemon is asked
    over the Engine API (no `docker` CLI process on the destination)."""
    import json

    from components.node_image.facts import INSPECT_FORMAT, parse_images
    from components.node_image.programs import facts_argv

    node = {"node-a": node_a, "node-c": node_c, "node-d": node_d}[name]
    report = json.loads(lab.on_node(node, facts_argv("ni-eng:1", inventory=True)).out.splitlines()[-1])
    assert report["inventory_from"] == read_from
    ids = sorted(set(lab.docker(node, "image", "ls", "-a", "-q", "--no-trunc").out.split()))
    daemon = parse_images(lab.docker(node, "image", "inspect", "--format", INSPECT_FORMAT, *ids).out)
    assert len(ids) >= 3 and sorted(parse_images(report["images"]), key=lambda i: i.image_id) == daemon


@pytest.mark.parametrize("name", ["node-a", "node-c", "node-d"])
def test_the_facts_the_engine_api_gives_are_the_clis(name, node_a, node_c, node_d, images_on_c):
    """The Engine API answers the facts where the CLI would reach the same socket: on Docker 20.10,
    on 26 and on a containerd store, the same daemon, image line and layer sizes as the CLI's own
    commands (asked for by a format the API path does not build, so the CLI answers)."""
    import json

    from components.node_image.facts import INFO_FORMAT, parse_daemon, parse_images
    from components.node_image.programs import facts_argv

    node = {"node-a": node_a, "node-c": node_c, "node-d": node_d}[name]

    def facts(info_format: str) -> dict:
        argv = facts_argv("ni-eng:1", history=True)
        spec = json.loads(argv[-1])
        argv[-1] = json.dumps({**spec, "info_format": info_format})
        return json.loads(lab.on_node(node, argv).out.splitlines()[-1])

    api, cli = facts(INFO_FORMAT), facts(INFO_FORMAT + '{{""}}')  # (the same line, another format)
    assert (api["facts_from"], cli["facts_from"]) == ("engine api", "docker") and "api_error" not in api
    assert parse_daemon(api["info"]) == parse_daemon(cli["info"])
    assert json.loads(api["info"].split("\t")[0]) == json.loads(cli["info"].split("\t")[0])  # driver status
    assert parse_images(api["image"]) == parse_images(cli["image"]) != []
    assert api["history"].split() == cli["history"].split() and len(api["history"].split()) >= 3
    absent = json.loads(lab.on_node(node, facts_argv("ni-eng:absent", history=True)).out.splitlines()[-1])
    assert absent["facts_from"] == "engine api" and absent["image"] == absent["history"] == ""


def test_a_fresh_containerd_destination_is_listed_empty_not_unreadable(node_c, node_d, images_on_c, capsys):
    """A node whose content store holds nothing yet (no image ever loaded): nothing to leave out, and
    no warning that the store could not be read."""
    from lab.layout import node_paths

    images = lab.docker(node_d, "image", "ls", "-a", "-q", "--no-trunc").out.split()
    if images:
        lab.docker(node_d, "image", "rm", "-f", *set(images))
    if content_blobs(node_d):
        ctr(node_d, "content", "rm", *sorted(content_blobs(node_d)))
    # What a fresh dockerd's containerd has: the content store with `ingest` only, no blob folder.
    store = node_paths(node_d.name).data_root / "containerd" / "daemon" / "io.containerd.content.v1.content"
    blobs = store / "blobs" / "sha256"
    if blobs.is_dir() and not any(blobs.iterdir()):
        blobs.rmdir()
        blobs.parent.rmdir()
    assert store.is_dir() and not blobs.exists(), sorted(p.name for p in store.iterdir())
    try:
        outs = PROVIDER.create(props("ni-eng-base:1", node_c, node_d)).outs
    finally:
        lab.busybox_image(node_d)  # as the other tests expect it
    err = capsys.readouterr().err
    assert outs["blobs_listed"] is True and outs["layers_left_out"] == 0, outs
    assert "could not be read" not in err, err
    assert "root" in runs(node_d, "ni-eng-base:1")
