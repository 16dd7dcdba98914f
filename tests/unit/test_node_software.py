"""What each node runs, as drift: the host's software read from a crafted root (the parse of each
file, the program run here on a tree), and the drift path with stand-in transports: refresh reads a
changed driver, and plan_change then proves again."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from components.node_programs import node_software as program
from components.node_programs import program_argv
from components.node_proof import ensure, observe, plan_change
from components.node_proof.facts import software_drift
from components.node_proof.programs import software_argv
from components.remote import Result
from tests.support.fabric_trees import write_tree
from tests.support.host_trees import NVRM, SMI, host_tree
from tests.unit.test_node_proof import props, report


@pytest.mark.parametrize(
    ("text", "driver"),
    [
        (NVRM.format("580.95.05"), "580.95.05"),
        (
            "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024\n",
            "550.54.15",
        ),
        ("NVRM version: NVIDIA UNIX Open Kernel Module  575.57  Release Build\n", "575.57"),
        ("GCC version: 13.3.0\n", None),
        ("", None),
        (None, None),
    ],
)
def test_the_driver_is_read_from_the_nvrm_line(text, driver):
    assert program.driver_of(text) == driver


@pytest.mark.parametrize(
    ("text", "versions"),
    [
        (SMI.format("580.95.05", "13.0"), ("580.95.05", "13.0")),
        (
            "| NVIDIA-SMI 550.54.15   Driver Version: 550.54.15   CUDA Version: 12.4.1 |",
            ("550.54.15", "12.4.1"),
        ),
        ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.", (None, None)),
        (None, (None, None)),
    ],
)
def test_nvidia_smi_gives_the_driver_and_the_cuda_version_it_supports(text, versions):
    assert program.smi_versions(text) == versions


@pytest.mark.parametrize(
    ("text", "release"), [("6.11.0-1016-nvidia\n", "6.11.0-1016-nvidia"), ("\n", None), (None, None)]
)
def test_the_kernel_release_is_the_files_one_line(text, release):
    assert program.osrelease_of(text) == release


def crafted(root, driver="580.95.05"):
    """A host tree written at `root` (what a lab node's `host_root` holds)."""
    return write_tree(root, host_tree(driver))


def test_the_program_reads_every_fact_under_a_crafted_root(tmp_path):
    root = crafted(tmp_path)
    argv = program_argv("node_software", [json.dumps({"root": str(root)})], sys.executable)
    done = subprocess.run(argv, capture_output=True, text=True, check=True)
    assert json.loads(done.stdout) == {
        "driver": "580.95.05", "cuda": "13.0", "kernel": "6.11.0-1016-nvidia",
        "firmware": {"rocep1s0f0": "28.45.1020", "rocep1s0f1": "28.45.1020"},
    }  # fmt: skip
    # A bare tree: every fact unread, none an error.
    assert program.facts(str(tmp_path / "none")) == {
        "driver": None,
        "cuda": None,
        "kernel": None,
        "firmware": {},
    }


def test_the_host_root_travels_in_the_spec_and_defaults_to_slash():
    assert json.loads(software_argv({"name": "a", "host_root": "/tmp/t"})[-1]) == {"root": "/tmp/t"}
    assert json.loads(software_argv({"name": "a"})[-1]) == {"root": "/"}


class Host:
    """A node whose host answers the software program from a crafted tree and its proof as canned."""

    def __init__(self, name, root, rank):
        self.name, self.root, self.rank = name, root, rank

    def run(self, argv, stdin=None, timeout=None):
        if argv[0] == "python3":
            spec = json.loads(argv[-1])
            assert spec == {"root": str(self.root)}
            found = program.facts(spec["root"])
            return Result(tuple(argv), 0, json.dumps(found).encode(), b"", self.name)
        if argv[:2] == ["docker", "rm"]:
            return Result(tuple(argv), 1, b"", b"No such container", self.name)
        done = {
            **report(self.name, self.rank, "gloo"),
            "software": {"torch": "2.10.0", "nccl": None, "vllm": "0.17.1"},
        }
        return Result(tuple(argv), 0, json.dumps(done).encode(), b"", self.name)


def test_a_driver_upgraded_after_the_proof_is_drift_that_proves_again(tmp_path, monkeypatch):
    warned = []
    monkeypatch.setattr("pulumi.log.warn", lambda line, *a, **k: warned.append(line))
    monkeypatch.setattr("pulumi.log.info", lambda *a, **k: None)
    p = props(gpu=False)
    roots = {entry["name"]: crafted(tmp_path / entry["name"]) for entry in p["nodes"]}
    for entry in p["nodes"]:
        entry["host_root"] = str(roots[entry["name"]])
    transports = {e["name"]: Host(e["name"], roots[e["name"]], e["rank"]) for e in p["nodes"]}
    state = ensure(p, transports=transports)
    assert state["node_software"]["spark-2"] == {
        "driver": "580.95.05", "cuda": "13.0", "kernel": "6.11.0-1016-nvidia",
        "firmware": {"rocep1s0f0": "28.45.1020", "rocep1s0f1": "28.45.1020"},
        "torch": "2.10.0", "nccl": None, "vllm": "0.17.1",
    }  # fmt: skip
    # A refresh with nothing changed: no drift, a no-op `up`.
    assert not plan_change(observe(state, transports=transports), p).changes and warned == []
    # `apt upgrade` of the driver on spark-2: refresh reads it, and the next `up` proves again.
    crafted(roots["spark-2"], driver="580.105.08")
    refreshed = observe(state, transports=transports)
    assert refreshed["observed_software"]["spark-2"]["driver"] == "580.105.08"
    assert refreshed["node_software"] == state["node_software"]  # what the proof ran under
    assert plan_change(refreshed, p).updates == ("node_software",)
    assert warned == [
        "node proof: host software changed since the proof (spark-2: driver 580.95.05 -> 580.105.08); "
        "the next `up` proves again"
    ]
    # That `up` records both alike: no drift after it.
    again = ensure(p, transports=transports)
    assert again["node_software"]["spark-2"]["driver"] == "580.105.08" and not plan_change(again, p).changes


def test_new_firmware_is_drift_and_an_unreadable_fact_is_not():
    was = {"a": {"driver": "580.95.05", "firmware": {"rocep1s0f0": "28.45.1020"}, "kernel": "6.11"}}
    now = {"a": {"driver": None, "firmware": {"rocep1s0f0": "28.45.1200"}, "kernel": "6.11"}}
    assert software_drift(was, now) == {
        "a": {"firmware": ({"rocep1s0f0": "28.45.1020"}, {"rocep1s0f0": "28.45.1200"})}
    }
    assert software_drift(was, {"a": {"driver": None}}) == {}
    assert software_drift(None, now) == {} and software_drift(was, {"b": now["a"]}) == {}


def test_a_node_out_of_reach_on_refresh_keeps_what_was_recorded(monkeypatch):
    monkeypatch.setattr("pulumi.log.warn", lambda *a, **k: None)
    from components.remote import RemoteError

    class Gone:
        name = "spark-1"

        def run(self, argv, stdin=None, timeout=None):
            raise RemoteError("spark-1", argv, 255, b"", "no route to host")

    p = props(gpu=False, nodes=1)
    state = {**p, "node_software": {"spark-1": {"driver": "580.95.05", "torch": "2.10.0"}}}
    refreshed = observe(state, transports={"spark-1": Gone()})
    assert refreshed["observed_software"] == state["node_software"] and not plan_change(refreshed, p).changes


def test_host_root_is_lab_only_absolute_and_refused_with_the_proof_off():
    from components.config import parse_stack_config
    from tests.support.program import dev_raw

    raw = dev_raw()
    raw["nodes"][0] = {**raw["nodes"][0], "host_root": "/srv/lab/spark-1"}
    assert parse_stack_config(raw).nodes[0].host_root == "/srv/lab/spark-1"
    for bad in ("relative/tree", "/"):
        raw["nodes"][0]["host_root"] = bad
        with pytest.raises(ValueError, match="lab-only absolute path to a test tree laid out like /"):
            parse_stack_config(raw)
    raw["nodes"][0]["host_root"] = "/srv/lab/spark-1"
    raw["fabric"] = {**raw.get("fabric", {}), "check": "off", "node_proof": "off"}
    with pytest.raises(ValueError, match="nodes.0.host_root: is read by the node proof only"):
        parse_stack_config(raw)
