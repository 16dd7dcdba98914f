"""`node_programs/image_tag.py`: the tag and its record of holders (retag, join, leave), and the
destination's end of a copy (load, verify, promote) by the CLI or the Engine API."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from components.node_image import ImageInfo, parse_images
from components.node_image.programs import load_argv
from components.node_programs import program_argv
from tests.support.standin_engine import StandinEngine

L1, L2 = "sha256:" + "1" * 64, "sha256:" + "2" * 64


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
    argv = load_argv(
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


def test_a_temporary_tag_left_behind_only_warns_and_the_claim_stays_valid(tmp_path, monkeypatch):
    """The real tag is verified and recorded before the temporary tag goes: failing to remove the
    temporary tag must not fail the load (that would leave a claim no resource state knows)."""
    monkeypatch.setenv("FAKE_DOCKER_RM_FAILS", "1")
    report, _ = run_load(tmp_path, monkeypatch, None)
    assert report["exit"] == 0 and report["promoted"] is True, report
    assert "app:qwen35-tmp-1" in report["warning"] and "docker image rm" in report["warning"]
    records = list((tmp_path / "home" / ".qwen35" / "tags").glob("*.json"))
    assert [json.loads(r.read_text())["holders"] for r in records] == [["c1"]]


def run_load(tmp_path, monkeypatch, api: StandinEngine | None) -> tuple[dict, list]:
    """`image_tag load` of the wanted image (the fake CLI loads; `api`, if given, is DOCKER_HOST's)."""
    import subprocess
    import sys

    log = fake_docker_cli(tmp_path, monkeypatch, f'"sha256:ab"\t["{L1}"]\t7', api and api.path)
    argv = load_argv("app:qwen35-tmp-1", "app:1", ImageInfo("sha256:ab", (L1,)), True, sys.executable, "c1")
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
