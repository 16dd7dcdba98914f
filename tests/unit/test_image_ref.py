"""Image references as operators type them: accepted forms parse to their parts; hostile ones are refused."""

from __future__ import annotations

import pytest

from components.image_ref import (
    ImageRef,
    ImageRefError,
    familiar_reference,
    full_reference,
    parse_image_ref,
    split_tagged,
)
from components.image_ref import split_tagged as split_reference

DIGEST = "sha256:" + "0123456789abcdef" * 4

ACCEPTED = [
    # (typed, name, tag, digest, registry)
    ("vllm-node", "vllm-node", None, None, None),
    ("vllm-node:latest", "vllm-node", "latest", None, None),
    ("hellohal2064/vllm-qwen3.5-gb10:latest", "hellohal2064/vllm-qwen3.5-gb10", "latest", None, None),
    ("nvcr.io/nvidia/vllm:26.03-py3", "nvcr.io/nvidia/vllm", "26.03-py3", None, "nvcr.io"),
    ("localhost:5000/vllm-node:0.17.1", "localhost:5000/vllm-node", "0.17.1", None, "localhost:5000"),
    (
        "registry.example.com:443/a/b/c:v1",
        "registry.example.com:443/a/b/c",
        "v1",
        None,
        "registry.example.com:443",
    ),
    ("10.1.230.180:5000/vllm:x", "10.1.230.180:5000/vllm", "x", None, "10.1.230.180:5000"),
    (f"vllm-node@{DIGEST}", "vllm-node", None, DIGEST, None),
    (f"vllm-node:latest@{DIGEST}", "vllm-node", "latest", DIGEST, None),
    (f"nvcr.io/nvidia/vllm:26.03-py3@{DIGEST}", "nvcr.io/nvidia/vllm", "26.03-py3", DIGEST, "nvcr.io"),
    ("docker.io/library/ubuntu:24.04", "docker.io/library/ubuntu", "24.04", None, "docker.io"),
    ("a__b--c.d_e:Tag_1.x-y", "a__b--c.d_e", "Tag_1.x-y", None, None),
    ("x:" + "t" * 128, "x", "t" * 128, None, None),
]


@pytest.mark.parametrize(
    ("typed", "name", "tag", "digest", "registry"), ACCEPTED, ids=[a[0][:40] for a in ACCEPTED]
)
def test_accepted_references_parse_to_their_parts(typed, name, tag, digest, registry):
    ref = parse_image_ref(typed)
    assert (ref.name, ref.tag, ref.digest, ref.registry) == (name, tag, digest, registry)
    assert str(ref) == typed


HOSTILE = [
    # (typed, a word the reason must contain)
    ("", "empty"),
    ("vllm node:latest", "whitespace"),
    (" vllm-node", "whitespace"),
    ("vllm-node:latest\n", "whitespace"),
    ("vllm-node;reboot", "repository name"),
    ("vllm-node:$(reboot)", "tag"),
    ("`id`:latest", "repository name"),
    ("--privileged", "repository name"),
    ("-v/:/host", "repository name"),
    ("VLLM-Node:latest", "repository name"),
    ("vllm-node:", "tag"),
    (":latest", "no image name"),
    ("vllm-node:.hidden", "tag"),
    ("vllm-node:-x", "tag"),
    ("vllm-node:" + "t" * 129, "tag"),
    ("vllm-node@sha256:abc", "digest"),
    ("vllm-node@sha256:" + "A" * 64, "digest"),
    ("vllm-node@md5:" + "a" * 32, "digest"),
    ("vllm-node:latest@", "digest"),
    ("a//b:1", "repository name"),
    ("a/:1", "ends with"),
    ("../etc:1", "repository name"),
    ("a..b:1", "repository name"),
    ("vllm-node:lat'est", "tag"),
    ('vllm-node:"x"', "tag"),
    ("vllm-nöde:1", "characters"),
    ("vllm-node:1\x00", "characters"),
    ("a" * 256 + ":1", "longer"),
    ("host:port/x:1", "repository name"),
]


@pytest.mark.parametrize(("typed", "reason"), HOSTILE, ids=[repr(h[0])[:40] for h in HOSTILE])
def test_hostile_references_are_refused_with_the_reason(typed, reason):
    with pytest.raises(ImageRefError) as info:
        parse_image_ref(typed)
    assert reason in str(info.value)


def test_non_strings_are_refused():
    with pytest.raises(ImageRefError, match="not a string"):
        parse_image_ref(None)


def test_tagged_and_pullable_forms():
    assert parse_image_ref("vllm-node").tagged == "vllm-node:latest"
    assert parse_image_ref("vllm-node").pullable == "vllm-node:latest"
    pinned = parse_image_ref(f"vllm-node:0.17@{DIGEST}")
    assert pinned.tagged == "vllm-node:0.17"
    # Docker resolves the digest and ignores a tag beside it: say exactly what runs.
    assert pinned.pullable == f"vllm-node@{DIGEST}"


@pytest.mark.parametrize(
    ("short", "full"),
    [
        ("x:1", "docker.io/library/x:1"),
        ("org/x:1", "docker.io/org/x:1"),
        ("nvcr.io/nvidia/vllm:1", "nvcr.io/nvidia/vllm:1"),
        ("localhost:5000/x:1", "localhost:5000/x:1"),
        ("localhost/x:1", "localhost/x:1"),
    ],
)
def test_familiar_and_full_forms_round_trip(short, full):
    assert full_reference(short) == full
    assert familiar_reference(full) == short
    assert parse_image_ref(short).full == full
    assert parse_image_ref(full).familiar == short


def test_split_tagged_needs_a_tag_and_never_takes_a_port_for_one():
    assert split_tagged("localhost:5000/x:1") == ("localhost:5000/x", "1")
    for bad in ("localhost:5000/x", "x", f"x:1@{DIGEST}"):
        with pytest.raises(ImageRefError, match="name:tag"):
            split_tagged(bad)


def test_image_ref_is_a_value():
    assert parse_image_ref("x:1") == ImageRef("x", "1")


def test_references():
    assert split_reference("reg:5000/a/b:1") == ("reg:5000/a/b", "1")
    with pytest.raises(ValueError):
        split_reference("reg:5000/a")
    assert full_reference("x:1") == "docker.io/library/x:1"
    assert full_reference("u/x:1") == "docker.io/u/x:1"
    assert full_reference("reg.io/x:1") == "reg.io/x:1"
    assert familiar_reference("docker.io/library/x:1") == "x:1"
