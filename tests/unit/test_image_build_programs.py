"""ImageBuild's commands as argument lists, and the context tar its build reads on stdin."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from components.image_build import (
    build_argv,
    build_ref,
    context_digest,
    context_files,
    ignore_rules,
    ignored,
    inspect_argv,
    source_refs,
    tag_argv,
    untag_argv,
    write_context,
)
from components.remote import shell_join

PROPS = {
    "dockerfile": "Dockerfile.graft",
    "platform": "linux/arm64",
    "network": "host",
    "build_args": {"SMOKE": "0", "BASE_IMAGE": "vllm-node:latest", "PIP_ARGS": "--no-index --find-links /w"},
}


@pytest.mark.parametrize(
    ("props", "expected"),
    [
        (
            PROPS,
            [
                "docker", "build", "--file", "Dockerfile.graft", "--platform", "linux/arm64",
                "--network", "host",
                "--build-arg", "BASE_IMAGE=vllm-node:latest",
                "--build-arg", "PIP_ARGS=--no-index --find-links /w",
                "--build-arg", "SMOKE=0",
                "--tag", "img:qwen35-build-ab12", "--rm", "--force-rm", "-",
            ],
        ),
        (
            {**PROPS, "network": None, "build_args": {}},
            [
                "docker", "build", "--file", "Dockerfile.graft", "--platform", "linux/arm64",
                "--tag", "img:qwen35-build-ab12", "--rm", "--force-rm", "-",
            ],
        ),
    ],
)  # fmt: skip
def test_build_argv(props, expected):
    assert build_argv(props, "img:qwen35-build-ab12") == expected


def test_the_build_labels_its_image_with_each_source_image_s_id():
    argv = build_argv(PROPS, "img:t", {"BASE_IMAGE": ID, "DONOR_IMAGE": ""})
    # A source the head lacked (the build pulls it) is not labelled: the build's own read records it.
    assert argv[-7:] == [
        "--label",
        f"qwen35.source.base_image={ID}",
        "--tag",
        "img:t",
        "--rm",
        "--force-rm",
        "-",
    ]


def test_the_sources_are_the_build_args_named_in_sources():
    props = {**PROPS, "sources": ["BASE_IMAGE", "DONOR_IMAGE"]}
    # DONOR_IMAGE is not a build arg here: nothing to follow for it.
    assert source_refs(props) == {"BASE_IMAGE": "vllm-node:latest"}
    assert source_refs(PROPS) == {}


def test_a_build_arg_with_spaces_stays_one_argument_on_the_head():
    line = shell_join(build_argv(PROPS, "img:t"))
    assert "'PIP_ARGS=--no-index --find-links /w'" in line


@pytest.mark.parametrize(
    ("ref", "token", "expected"),
    [
        ("vllm-node-qwen35:h-0123", "ab12", "vllm-node-qwen35:qwen35-build-ab12"),
        ("localhost:5000/org/img:v1", "ff00", "localhost:5000/org/img:qwen35-build-ff00"),
    ],
)
def test_the_build_tag_is_in_the_same_repository(ref, token, expected):
    assert build_ref(ref, token) == expected


INSPECT = [
    "docker", "image", "inspect", "--format",
    "{{.Id}} {{json .RepoTags}} {{json .RepoDigests}} {{json .Config.Labels}}",
]  # fmt: skip
ID = "sha256:" + "a" * 64


@pytest.mark.parametrize(
    ("call", "expected"),
    [
        (lambda: inspect_argv("img:t"), [*INSPECT, "img:t"]),
        (lambda: inspect_argv("img:t", ID), [*INSPECT, "img:t", ID]),
        # The source images in the same call; one named twice is asked for once.
        (
            lambda: inspect_argv("img:t", None, ["vllm-node:latest", "donor:1", "vllm-node:latest"]),
            [*INSPECT, "img:t", "vllm-node:latest", "donor:1"],
        ),
        (lambda: tag_argv(ID, "img:t"), ["docker", "tag", ID, "img:t"]),
        (
            lambda: untag_argv("img:qwen35-build-1"),
            ["docker", "image", "rm", "--no-prune", "img:qwen35-build-1"],
        ),
    ],
)
def test_head_commands(call, expected):
    assert call() == expected


@pytest.fixture
def context(tmp_path):
    (tmp_path / "Dockerfile").write_text("FROM scratch\n")
    (tmp_path / "proof.py").write_text("print('ok')\n")
    (tmp_path / "proof.py").chmod(0o755)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.txt").write_text("b")
    (tmp_path / "__pycache__").mkdir()
    (tmp_path / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"junk")
    (tmp_path / "stale.pyc").write_bytes(b"junk")
    return tmp_path


def test_the_context_tar_holds_the_files_with_fixed_owners_and_times(context):
    out = io.BytesIO()
    write_context(context, out)
    with tarfile.open(fileobj=io.BytesIO(out.getvalue())) as tar:
        members = {m.name: m for m in tar.getmembers()}
        assert sorted(members) == ["Dockerfile", "proof.py", "sub/b.txt"]
        assert tar.extractfile("sub/b.txt").read() == b"b"
    assert {(m.uid, m.gid, m.mtime) for m in members.values()} == {(0, 0, 0)}
    assert members["proof.py"].mode == 0o755 and members["Dockerfile"].mode == 0o644
    again = io.BytesIO()
    write_context(context, again)
    assert again.getvalue() == out.getvalue()


def test_the_context_digest_follows_contents_names_and_run_bits_only(context):
    before = context_digest(context)
    assert before.startswith("sha256:") and len(before) == 71
    (context / "__pycache__" / "y.pyc").write_bytes(b"more junk")
    assert context_digest(context) == before
    (context / "sub" / "b.txt").write_text("c")
    changed = context_digest(context)
    assert changed != before
    (context / "proof.py").chmod(0o644)
    assert context_digest(context) != changed
    assert [p.name for p in context_files(context)] == ["Dockerfile", "proof.py", "b.txt"]


# ---- what the build sends: .dockerignore, file by file -------------------------------------------


@pytest.mark.parametrize(
    ("rules", "path", "left_out"),
    [
        (["README.md"], "README.md", True),
        (["README.md"], "sub/README.md", False),
        (["**/README.md"], "sub/README.md", True),
        (["**/*.pyc"], "a/b/c.pyc", True),
        (["*.whl"], "wheels/a.whl", False),
        (["wheels"], "wheels/a.whl", True),
        (["/wheels/"], "wheels/deep/a.whl", True),
        (["wheels", "!wheels"], "wheels/a.whl", False),
        (["wheels", "!wheels/keep.whl"], "wheels/keep.whl", False),
        (["wheels", "!wheels/keep.whl"], "wheels/other.whl", True),
        (["!wheels", "wheels"], "wheels/a.whl", True),
        (["proof_?.py"], "proof_1.py", True),
        (["proof_[0-3].py"], "proof_4.py", False),
        (["proof_[^0-3].py"], "proof_4.py", True),
        (["# wheels", ""], "wheels/a.whl", False),
    ],
)
def test_dockerignore_rules_as_docker_applies_them(tmp_path, rules, path, left_out):
    assert ignored(path, ignore_rules(tmp_path, rules)) is left_out


def test_the_context_s_dockerignore_leaves_files_out_of_the_stream_and_the_digest(context):
    (context / "wheels").mkdir()
    (context / "wheels" / "a-1-py3-none-any.whl").write_bytes(b"wheel")
    (context / "README.md").write_text("docs")
    everything = context_digest(context)
    (context / ".dockerignore").write_text("README.md\nwheels\n")
    assert [p.name for p in context_files(context)] == [".dockerignore", "Dockerfile", "proof.py", "b.txt"]
    without = context_digest(context)
    assert without != everything
    # What is left out changes nothing: the tag and the image stay.
    (context / "wheels" / "b-1-py3-none-any.whl").write_bytes(b"another")
    assert context_digest(context) == without
    # A rule after the file's own brings the wheels back (a build whose pip flags use them).
    assert "a-1-py3-none-any.whl" in [p.name for p in context_files(context, ["!wheels"])]
    out = io.BytesIO()
    write_context(context, out, ["!wheels"])
    with tarfile.open(fileobj=io.BytesIO(out.getvalue())) as tar:
        assert sorted(tar.getnames()) == [
            ".dockerignore", "Dockerfile", "proof.py", "sub/b.txt",
            "wheels/a-1-py3-none-any.whl", "wheels/b-1-py3-none-any.whl",
        ]  # fmt: skip


def test_the_digest_reads_each_file_a_block_at_a_time(context, monkeypatch):
    expected = context_digest(context)

    def whole(_path):
        raise AssertionError("a context file was read whole into memory")

    monkeypatch.setattr(Path, "read_bytes", whole)
    assert context_digest(context) == expected
