"""The skip/retag/copy decision as a table: both nodes' facts in, the plan out (no node, no I/O)."""

from __future__ import annotations

import pytest

from components.node_image import (
    Copy,
    Daemon,
    Facts,
    ImageInfo,
    Node,
    NodeImageError,
    Retag,
    Skip,
    Tuning,
    plan,
)
from components.node_image.plan import disk_needed, present_chains, present_prefix
from components.node_programs.wire import chain_ids
from tests.unit.test_layer_filter import DIFF_IDS, digest

L1, L2, L3 = ("sha256:" + c * 64 for c in "123")
WANTED = ImageInfo("sha256:w", (L1, L2, L3), 3000)
OTHER = ImageInfo("sha256:o", (L1, L2), 2000)  # shares the two bottom layers
CLASSIC = Daemon("classic", "/var/lib/docker", "20.10.24", "overlay2")
CONTAINERD = Daemon("containerd", "/var/lib/docker", "29.0.0", "overlayfs")
HISTORY = "0\n1000\n1000\n1000\n"  # docker history sizes, newest first
TUNING = Tuning(disk_reserve_bytes=0)


def node(name: str, host: str, store: str | None = None) -> Node:
    raw = {"name": name, "host": host, "user": "ops", "known_hosts": "/kh", "image_store": store}
    return Node.from_dict(name, raw)


A, B = node("a", "10.0.0.1"), node("b", "10.0.0.2")


def source(image=WANTED, daemon=CLASSIC, at=A) -> Facts:
    return Facts(at, "app:1", daemon, image, history=HISTORY)


def destination(tag=None, images=(), daemon=CLASSIC, free=10**12, blobs=(), at=B) -> Facts:
    return Facts(at, "app:1", daemon, tag, images=list(images), free=free, blobs=frozenset(blobs))


@pytest.mark.parametrize(
    ("src", "dst", "expected"),
    [
        # the source itself (the head): nothing to send, no tag of ours
        (source(), source(), Skip(WANTED, CLASSIC, tag_was_there=False)),
        # the tag already names the image
        (source(), destination(tag=WANTED, images=[WANTED]), Skip(WANTED, CLASSIC, tag_was_there=True)),
        # the tag names a DIFFERENT image: never a skip. The wanted one is not there: copy.
        (
            source(),
            destination(tag=OTHER, images=[OTHER]),
            Copy(leave_out=(L1, L2), keep_from=2, export=True, same_store=True, bytes_to_send=1000),
        ),
        # the tag names a different image and the wanted one is there untagged: retag
        (source(), destination(tag=OTHER, images=[OTHER, WANTED]), Retag(WANTED, CLASSIC)),
        # nothing there: every layer
        (
            source(),
            destination(),
            Copy(leave_out=(), keep_from=0, export=True, same_store=True, bytes_to_send=3000),
        ),
        # the destination holds the bottom layers as a chain: only the top one
        (
            source(),
            destination(images=[OTHER]),
            Copy(leave_out=(L1, L2), keep_from=2, export=True, same_store=True, bytes_to_send=1000),
        ),
        # containerd destination: layers whose blobs its content store holds, and an image there
        # still uses, are left out (any layer, not only a bottom chain)
        (
            source(),
            destination(daemon=CONTAINERD, blobs=[L1, L3], images=[ImageInfo("sha256:t", (L1, L3))]),
            Copy(leave_out=(L1, L3), keep_from=0, export=True, same_store=False, bytes_to_send=1000),
        ),
        # a blob no image uses any more may be collected before the load: sent
        (
            source(),
            destination(daemon=CONTAINERD, blobs=[L1, L3], images=[OTHER]),
            Copy(leave_out=(L1,), keep_from=0, export=True, same_store=False, bytes_to_send=2000),
        ),
        # containerd destination with the layers in images but not as blobs: everything is sent
        (
            source(),
            destination(daemon=CONTAINERD, images=[OTHER]),
            Copy(leave_out=(), keep_from=0, export=True, same_store=False, bytes_to_send=3000),
        ),
        # across stores the layer list is the identity: the containerd ID differs, still a skip
        (
            source(),
            destination(tag=ImageInfo("sha256:manifest", WANTED.layers), daemon=CONTAINERD),
            Skip(ImageInfo("sha256:manifest", WANTED.layers), CONTAINERD, tag_was_there=True),
        ),
        # same ID, other layers across stores: not the image
        (
            source(),
            destination(tag=ImageInfo("sha256:w", (L1,)), daemon=CONTAINERD),
            Copy(leave_out=(), keep_from=0, export=True, same_store=False, bytes_to_send=3000),
        ),
    ],
    ids=[
        "same-node",
        "tag-present",
        "tag-elsewhere-copy",
        "tag-elsewhere-retag",
        "fresh",
        "thin-classic",
        "thin-containerd",
        "containerd-unused-blob",
        "containerd-no-blobs",
        "across-stores-skip",
        "across-stores-other",
    ],
)
def test_plan(src, dst, expected):
    assert plan(src, dst, TUNING) == expected


def test_a_destination_tag_on_another_image_is_never_skipped():
    """A tag on the destination that points at another image is not the image: the copy still runs."""
    for images in ([], [OTHER], [OTHER, WANTED]):
        decided = plan(source(), destination(tag=OTHER, images=images), TUNING)
        assert not isinstance(decided, Skip), images


def test_save_forced_and_non_overlay_sources_do_not_export():
    forced = Tuning(disk_reserve_bytes=0, source_export="save")
    assert plan(source(), destination(), forced).export is False
    vfs = Daemon("classic", "/d", "20.10", "vfs")
    assert plan(source(daemon=vfs), destination(), TUNING).export is False


def test_sizes_that_do_not_line_up_assume_every_layer():
    src = Facts(A, "app:1", CLASSIC, WANTED, history="0\n5\n")
    assert plan(src, destination(images=[OTHER]), TUNING).bytes_to_send == WANTED.size


@pytest.mark.parametrize(
    ("src", "dst", "words"),
    [
        (source(image=None), destination(), ["source a", "app:1 is not there", "next:"]),
        (source(), destination(free=100), ["destination b", "not enough disk", "nothing was sent", "next:"]),
        (
            source(),
            destination(daemon=CONTAINERD, at=node("b", "10.0.0.2", store="classic")),
            ["b: its Docker uses the containerd image store", "set image_store: containerd for b"],
        ),
    ],
    ids=["no-source-image", "disk", "declared-store"],
)
def test_plan_refuses_with_the_node_named(src, dst, words):
    with pytest.raises(NodeImageError) as caught:
        plan(src, dst, Tuning(disk_reserve_bytes=1000))
    assert all(word in str(caught.value) for word in words), str(caught.value)


def test_disk_need_counts_only_what_is_sent():
    decided = plan(source(), destination(images=[OTHER], free=disk_needed(1000, TUNING)), TUNING)
    assert isinstance(decided, Copy) and decided.bytes_to_send == 1000


def test_chain_ids_and_present_prefix():
    chains = chain_ids(DIFF_IDS)
    assert chains[0] == DIFF_IDS[0]
    assert chains[1] == digest(f"{DIFF_IDS[0]} {DIFF_IDS[1]}".encode())
    assert present_prefix(DIFF_IDS, set(chains[:2])) == 2
    assert present_prefix(DIFF_IDS, {chains[1]}) == 0  # a chain without its base is not a prefix
    assert present_chains([DIFF_IDS[:1]]) == {chains[0]}
