"""ImageBuild's provider without a node: check and diff do no I/O, errors name the field, and the
build's failure path (under a stand-in transport) names its stage and leaves the real tag alone."""

from __future__ import annotations

import subprocess

import pytest

from components import remote
from components.image_build import ImageBuildError, ImageBuildProvider, execute
from components.image_build.facts import source_label
from components.image_build.programs import INSPECT_FORMAT
from components.remote import Result
from tests.unit.test_image_build_plan import BUILT, BUILT_FROM_X, FOLLOWING, PROPS, A, X, Y

LABEL = source_label("BASE_IMAGE")


@pytest.fixture
def no_io(monkeypatch):
    def refuse(*_args, **_kwargs):
        raise AssertionError("check/diff ran a command")

    monkeypatch.setattr(subprocess, "run", refuse)
    monkeypatch.setattr(subprocess, "Popen", refuse)
    monkeypatch.setattr(remote.SshTransport, "run", refuse)


def test_check_does_no_io_and_names_each_bad_field(no_io):
    assert ImageBuildProvider().check({}, PROPS).failures == []
    failures = ImageBuildProvider().check({}, {**PROPS, "platform": "arm64", "ref": "x@y"}).failures
    assert sorted(f.property for f in failures) == ["platform", "ref"]


@pytest.mark.parametrize(
    ("news", "changes", "replaces"),
    [
        (PROPS, False, []),
        ({**PROPS, "context_digest": "sha256:" + "d" * 64}, True, ["context_digest"]),
        ({**PROPS, "network": "none"}, True, []),
    ],
)
def test_diff_does_no_io(no_io, news, changes, replaces):
    result = ImageBuildProvider().diff("spark-1/x", BUILT, news)
    assert (result.changes, result.replaces) == (changes, replaces)
    # The new image is tagged before the old resource goes: what runs keeps its image.
    assert result.delete_before_replace is False


def test_delete_leaves_the_head_alone(no_io):
    assert ImageBuildProvider().delete("spark-1/x", BUILT) is None


class Head:
    """A stand-in head: answers each command by its first words, records every argv."""

    name = "spark-1"
    target = remote.SshTarget(host="10.0.0.1", user="aurora", known_hosts="/kh", name="spark-1")

    def __init__(self, answers):
        self.answers, self.ran = answers, []

    def run(self, argv, stdin=None, timeout=None):
        self.ran.append(list(argv))
        for prefix, result in self.answers.items():
            if " ".join(argv).startswith(prefix):
                return Result(tuple(argv), *result, node=self.name)
        return Result(tuple(argv), 0, b"", b"", self.name)


REFUSAL = [
    "Step 7/22 : RUN set -eu; proof",
    "compatibility proof failed (exit 1): the copied Qwen3.5 modules would not import",
    "The command '/bin/sh -c set -eu; proof' returned a non-zero code: 1",
]


def fake_build(lines, returncode, relayed):
    def run_relaying(node, local_argv, argv, stdin, timeout, relay, relay_stdout=False):
        assert relay_stdout and argv[:2] == ["docker", "build"] and argv[-1] == "-"
        for line in lines:
            relay(line)
        return Result(tuple(argv), returncode, b"", b"", node)

    return run_relaying


@pytest.fixture
def context(tmp_path):
    (tmp_path / "Dockerfile").write_text("FROM scratch\n")
    return tmp_path


def test_a_refused_build_names_its_stage_and_never_tags(monkeypatch, context, capsys):
    monkeypatch.setattr(execute, "run_relaying", fake_build(REFUSAL, 1, []))
    head = Head({})
    with pytest.raises(ImageBuildError) as refused:
        execute.build(head, {**PROPS, "context": str(context)})
    message = str(refused.value)
    assert message.startswith(f"spark-1: building {PROPS['ref']} failed at the compatibility proof (exit 1)")
    assert "step `RUN set -eu; proof`" in message and "would not import" in message
    assert "next: the proof's verdict is above" in message
    # The real tag was never touched; only the build's own temporary tag was dropped.
    assert not [argv for argv in head.ran if argv[:2] == ["docker", "tag"]]
    (dropped,) = head.ran
    assert dropped[:4] == ["docker", "image", "rm", "--no-prune"] and ":qwen35-build-" in dropped[4]
    # Each line reached the operator as it came.
    assert "qwen35: image-build on spark-1: compatibility proof failed (exit 1)" in capsys.readouterr().err


def test_a_passing_build_tags_its_image_then_drops_the_temporary_tag(monkeypatch, context):
    monkeypatch.setattr(execute, "run_relaying", fake_build(["Step 1/1 : FROM scratch"], 0, []))
    head = Head({"docker image inspect --format {{.Id}}": (0, f"{A}\n".encode(), b"")})
    assert execute.build(head, {**PROPS, "context": str(context)}) == A
    inspect, tag, drop = head.ran
    assert ":qwen35-build-" in inspect[-1]
    assert tag == ["docker", "tag", A, PROPS["ref"]]
    assert drop[:4] == ["docker", "image", "rm", "--no-prune"] and drop[4] == inspect[-1]


def inspect_answer(tag_labels: str, base_now: str) -> tuple[int, bytes, bytes]:
    """The head's answer to the build's one inspect: the tag's image (labelled) and the base now."""
    out = f'{A} ["{PROPS["ref"]}"] [] {tag_labels}\n{base_now} ["vllm-node:latest"] [] null\n'
    return (0, out.encode(), b"")


def test_up_after_the_base_was_rebuilt_builds_again_and_records_the_new_base(monkeypatch, context):
    olds = {**BUILT_FROM_X, "context": str(context)}
    built = "sha256:" + "e" * 64
    head = Head({
        f"docker image inspect --format {INSPECT_FORMAT}": inspect_answer(f'{{"{LABEL}":"{X}"}}', Y),
        "docker image inspect --format {{.Id}}": (0, f"{built}\n".encode(), b""),
    })  # fmt: skip
    ran = []

    def run_relaying(node, local_argv, argv, stdin, timeout, relay, relay_stdout=False):
        ran.append(argv)
        return Result(tuple(argv), 0, b"", b"", node)

    monkeypatch.setattr(execute, "run_relaying", run_relaying)
    monkeypatch.setattr(execute, "head_transport", lambda _props: head)
    outs = execute.ensure({**FOLLOWING, "context": str(context)}, olds)
    # Built from the base as it is now, and labelled so: a later create keeps this tag.
    (argv,) = ran
    assert ["--label", f"{LABEL}={Y}"] == argv[argv.index("--label") : argv.index("--label") + 2]
    assert outs["image_id"] == built and outs["built"] is True
    assert outs["source_ids"] == outs["observed_source_ids"] == {"BASE_IMAGE": Y}
    assert ["docker", "tag", built, PROPS["ref"]] in head.ran


def test_read_reports_the_sources_as_the_head_holds_them(monkeypatch):
    head = Head({f"docker image inspect --format {INSPECT_FORMAT}": inspect_answer("null", Y)})
    monkeypatch.setattr(execute, "head_transport", lambda _props: head)
    found = execute.observe(BUILT_FROM_X)
    assert found["observed_image_id"] == A and found["observed_source_ids"] == {"BASE_IMAGE": Y}
    assert found["source_ids"] == {"BASE_IMAGE": X}
    # A stack recorded before sources were followed: read adds nothing (refresh stays clean).
    assert "observed_source_ids" not in execute.observe({**PROPS, "image_id": A})


def test_up_records_the_sources_of_a_stack_made_before_they_were_followed(monkeypatch, context):
    head = Head({f"docker image inspect --format {INSPECT_FORMAT}": inspect_answer("null", X)})
    monkeypatch.setattr(execute, "head_transport", lambda _props: head)
    outs = execute.ensure({**FOLLOWING, "context": str(context)}, BUILT)
    assert outs["image_id"] == A and outs["built"] is True and outs["source_ids"] == {"BASE_IMAGE": X}
    assert not [argv for argv in head.ran if argv[:2] in (["docker", "build"], ["docker", "tag"])]


def test_pip_flags_for_wheels_with_none_there_fail_before_anything_runs(monkeypatch, context):
    head = Head({})
    props = {**PROPS, "context": str(context), "context_rules": ["!wheels"]}
    with pytest.raises(ImageBuildError, match="holds no wheel") as refused:
        execute.build(head, props)
    assert "drop /opt/qwen35/wheels from image.pip_args" in str(refused.value)
    assert head.ran == []


def test_a_missing_context_fails_before_anything_runs(monkeypatch, tmp_path):
    head = Head({})
    with pytest.raises(ImageBuildError, match="failed at the build context"):
        execute.build(head, {**PROPS, "context": str(tmp_path / "gone")})
    assert head.ran == []


def test_provider_pickles_by_reference_without_state():
    # The SDK pickles the provider into every stack's state: by reference to this module path.
    import pickle

    provider = pickle.loads(pickle.dumps(ImageBuildProvider()))
    assert type(provider).__module__ == "components.image_build" and vars(provider) == {}
    assert b"components.image_build" in pickle.dumps(ImageBuildProvider())
