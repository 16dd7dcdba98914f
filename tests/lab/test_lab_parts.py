"""The lab's pure parts and its error messages, without starting the real lab."""

from __future__ import annotations

import os
import shlex
import socket
import tarfile
from io import BytesIO
from pathlib import Path

import pytest

import lab
from lab import engines, images, layout, nodes, sessions
from lab.layout import LabError, known_hosts_line, node_paths, select_specs, ssh_paths

NODE = lab.LabNode(
    name="node-a",
    host="127.0.0.2",
    port=2222,
    user="root",
    identity_file="/run/qwen35-lab/ssh/id_ed25519",
    known_hosts="/run/qwen35-lab/ssh/known_hosts",
    docker_host="unix:///run/qwen35-lab/node-a/docker.sock",
    engine="20.10.24+dfsg1",
    store="classic",
)


@pytest.fixture
def private_lab(tmp_path, monkeypatch):
    """Lab paths under tmp_path, so nothing here touches a running lab."""
    monkeypatch.setenv("LAB_DIR", str(tmp_path / "run"))
    monkeypatch.setenv("LAB_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("QWEN35_CACHE", str(tmp_path / "cache"))
    return tmp_path


def test_dockerd_argv_keeps_each_daemon_to_itself(private_lab):
    paths = node_paths("node-c")
    argv = nodes.dockerd_argv("/x/dockerd", paths)
    assert argv[0] == "/x/dockerd"
    for flag, value in [
        ("--data-root", paths.data_root),
        ("--exec-root", paths.exec_root),
        ("--host", f"unix://{paths.socket}"),
        ("--pidfile", paths.docker_pid),
        ("--config-file", paths.daemon_json),
    ]:
        assert argv[argv.index(flag) + 1] == str(value)
    assert {"--bridge=none", "--iptables=false", "--ip6tables=false"} <= set(argv)


@pytest.mark.parametrize(
    ("name", "config"),
    [
        # The head and worker rotate their logs, as Sparks commonly do (the Docker provider must not
        # see the daemon's defaults as drift); node-c stays at Docker's defaults.
        ("node-a", {"log-opts": {"max-size": "10m", "max-file": "3"}}),
        ("node-b", {"log-opts": {"max-size": "10m", "max-file": "3"}}),
        ("node-c", {}),
        ("node-d", {"features": {"containerd-snapshotter": True}}),
    ],
)
def test_daemon_config_per_store(name, config):
    assert nodes.daemon_config(select_specs([name])[0]) == config


def test_sshd_config_points_sessions_at_the_nodes_daemon(private_lab):
    spec = select_specs(["node-b"])[0]
    text = nodes.sshd_config_text(spec, node_paths("node-b"), ssh_paths())
    assert "ListenAddress 127.0.0.3:2222" in text
    assert f"SetEnv DOCKER_HOST=unix://{node_paths('node-b').socket} LAB_NODE=node-b" in text
    assert "PasswordAuthentication no" in text


def test_known_hosts_line_uses_the_bracketed_form_for_other_ports():
    key = "ssh-ed25519 AAAAC3Nza comment"
    assert known_hosts_line("127.0.0.2", 2222, key) == "[127.0.0.2]:2222 ssh-ed25519 AAAAC3Nza"
    assert known_hosts_line("spark-1", 22, key) == "spark-1 ssh-ed25519 AAAAC3Nza"


def test_unknown_node_gets_did_you_mean():
    with pytest.raises(LabError, match=r"unknown node 'node-f'.*did you mean node-"):
        select_specs(["node-f"])


@pytest.mark.parametrize(
    ("info", "store"),
    [
        ({"Driver": "overlay2", "DriverStatus": [["Backing Filesystem", "extfs"]]}, "classic"),
        (
            {"Driver": "overlayfs", "DriverStatus": [["driver-type", "io.containerd.snapshotter.v1"]]},
            "containerd",
        ),
        ({}, "classic"),
    ],
)
def test_store_of(info, store):
    assert nodes.store_of(info) == store


DEB822 = """Types: deb
# http://snapshot.debian.org/archive/debian/20250520T000000Z
URIs: http://mirror.example/debian
Suites: bookworm bookworm-updates
Components: main

Types: deb
URIs: http://mirror.example/debian-security
Suites: bookworm-security
Components: main
"""


def test_mirror_from_deb822_skips_comments_and_security():
    assert engines.mirror_from_deb822(DEB822) == "http://mirror.example/debian"
    assert engines.mirror_from_deb822("Types: deb\nURIs: http://s/ds\nSuites: bookworm-security\n") is None


def test_debian_mirror_reads_one_line_sources(tmp_path):
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list").write_text(
        "deb http://sec.example/debian-security bookworm-security main\n"
        "deb [arch=amd64] http://mirror.example/debian/ bookworm main\n"
    )
    assert engines.debian_mirror(tmp_path) == "http://mirror.example/debian"
    assert engines.debian_mirror(tmp_path / "nowhere") == engines.DEFAULT_MIRROR


def test_apt_options_never_touch_the_systems_apt(tmp_path):
    options = engines.apt_options(tmp_path)
    settings = dict(o.split("=", 1) for o in options if o != "-o")
    assert settings["Dir::Etc::SourceList"] == str(tmp_path / "apt" / "sources.list")
    assert settings["Dir::Etc::SourceParts"] == "/dev/null"
    assert settings["Dir::State::Lists"].startswith(str(tmp_path))
    assert settings["Dir::Cache"].startswith(str(tmp_path))


def test_ssh_argv_pins_host_keys_and_quotes_once():
    argv = lab.ssh_argv(NODE, ["sh", "-c", "echo a b; touch /x"])
    assert argv[0] == "ssh"
    assert "StrictHostKeyChecking=yes" in argv
    assert f"UserKnownHostsFile={NODE.known_hosts}" in argv
    assert not any("StrictHostKeyChecking=no" in a for a in argv)
    assert argv[-3:-1] == ["root@127.0.0.2", "--"]
    assert shlex.split(argv[-1]) == ["sh", "-c", "echo a b; touch /x"]


def test_pipeline_fails_when_any_stage_fails():
    argv = lab.pipeline(["docker", "save", "x:1"], ["ssh", "b", "docker load"])
    assert argv[:5] == ["bash", "--norc", "--noprofile", "-o", "pipefail"]
    assert argv[-1] == "docker save x:1 | ssh b 'docker load'"


@pytest.mark.parametrize("tag", ["lab-busybox:1", "lab-debian:bookworm", "a/b:c.d-1"])
def test_check_tag_accepts(tag):
    assert images.check_tag(tag) == tag


@pytest.mark.parametrize("tag", ["Lab:1", "x", "x:1; rm -rf /", "x:$(id)", ":1"])
def test_check_tag_rejects(tag):
    with pytest.raises(LabError):
        images.check_tag(tag)


def test_busybox_is_static_and_sh_is_not():
    busybox = images.static_busybox()
    assert not images.elf_interpreter(busybox.read_bytes()[:4096])
    assert images.elf_interpreter(Path(os.path.realpath("/bin/sh")).read_bytes()[:4096])


def test_busybox_context_has_the_binary_and_applet_links():
    busybox = images.static_busybox()
    context = images.busybox_context(busybox, ["busybox", "sh", "ls"])
    with tarfile.open(fileobj=BytesIO(context)) as tar:
        members = {m.name: m for m in tar.getmembers()}
        assert tar.extractfile("Dockerfile").read().startswith(b"FROM scratch\n")
    assert members["rootfs/bin/busybox"].mode == 0o755
    assert members["rootfs/bin/sh"].issym() and members["rootfs/bin/sh"].linkname == "busybox"
    assert "rootfs/bin/busybox" in members and "rootfs/bin/ls" in members
    assert images.busybox_context(busybox, ["sh"]) == images.busybox_context(busybox, ["sh"])


def lease(pid: int, *nodes: str) -> dict:
    return {"id": f"{pid}-x", "pid": pid, "nodes": list(nodes)}


def test_sessions_count_only_nodes_not_running_before():
    state = {"started": [], "leases": [lease(111, "node-a")]}
    after = sessions.joined(
        state, running={"node-a"}, lease=lease(222, "node-a", "node-b"), alive=lambda pid: pid == 111
    )
    assert after == {"started": ["node-b"], "leases": [lease(111, "node-a"), lease(222, "node-a", "node-b")]}
    dead = sessions.joined(after, running=set(), lease=lease(333, "node-a"), alive=lambda pid: False)
    assert dead == {"started": ["node-a", "node-b"], "leases": [lease(333, "node-a")]}


def test_a_session_leaving_stops_only_what_no_live_session_wants():
    state = {
        "started": ["node-a", "node-b", "node-c"],
        "leases": [lease(1, "node-a"), lease(1, "node-b", "node-c")],
    }
    state["leases"][1]["id"] = "1-y"
    after, stop = sessions.left(state, lease_id="1-y", alive=lambda pid: True)
    assert stop == ["node-b", "node-c"] and after == {"started": ["node-a"], "leases": [lease(1, "node-a")]}
    # A dead session's lease wants nothing: its nodes go with the last live one.
    after, stop = sessions.left(state, lease_id="1-x", alive=lambda pid: False)
    assert stop == ["node-a", "node-b", "node-c"] and after == {"started": [], "leases": []}


def test_a_nested_session_in_one_process_leaves_the_outer_ones_nodes_running(private_lab, monkeypatch):
    """The engine tier's shape: the run's session holds node-a/node-b, a module adds node-c/node-d.
    The module's end stops node-c/node-d only; the run's end stops node-a/node-b."""
    (private_lab / "run").mkdir(parents=True)
    running: set[str] = set()
    stopped: list[list[str]] = []

    def up(wanted):
        running.update(wanted)
        return {name: name for name in wanted}

    def down(names):
        stopped.append(sorted(names))
        running.difference_update(names)

    cleared: list[str] = []
    monkeypatch.setattr(sessions, "up_locked", up)
    monkeypatch.setattr(sessions, "down_locked", down)
    monkeypatch.setattr(sessions, "running_nodes", lambda: sorted(running))
    monkeypatch.setattr(sessions, "clear_left_images", lambda node: cleared.append(node) or [])
    monkeypatch.setattr(sessions, "disk_short", lambda: True)
    with sessions.lab_session(["node-a", "node-b"]):
        with sessions.lab_session(["node-c", "node-d"]):
            assert running == {"node-a", "node-b", "node-c", "node-d"}
            with sessions.lab_session(["node-a", "node-c"]):  # both in use: nothing of theirs is cleared
                pass
        assert stopped == [["node-c", "node-d"]] and running == {"node-a", "node-b"}
    assert stopped == [["node-c", "node-d"], ["node-a", "node-b"]] and not running
    assert cleared == ["node-a", "node-b", "node-c", "node-d"]  # each once, as its session started it


def test_a_session_never_stops_a_lab_brought_up_by_hand(private_lab, monkeypatch):
    (private_lab / "run").mkdir(parents=True)
    monkeypatch.setattr(sessions, "up_locked", lambda wanted: {})
    monkeypatch.setattr(sessions, "down_locked", lambda names: pytest.fail(f"stopped {names}"))
    monkeypatch.setattr(sessions, "clear_left_images", lambda node: pytest.fail(f"cleared {node}"))
    monkeypatch.setattr(sessions, "running_nodes", lambda: ["node-a", "node-b"])
    with sessions.lab_session(["node-a"]), sessions.lab_session(["node-b"]):
        pass


def test_a_session_clears_nothing_while_the_disk_has_room(private_lab, monkeypatch):
    (private_lab / "run").mkdir(parents=True)
    monkeypatch.setattr(sessions, "up_locked", lambda wanted: {name: name for name in wanted})
    monkeypatch.setattr(sessions, "down_locked", lambda names: None)
    monkeypatch.setattr(sessions, "running_nodes", lambda: [])
    monkeypatch.setattr(sessions, "clear_left_images", lambda node: pytest.fail(f"cleared {node}"))
    monkeypatch.setattr(sessions, "disk_short", lambda: False)
    with sessions.lab_session(["node-a"]):
        pass
    assert images.disk_short(images.CLEAR_BELOW_BYTES - 1) and not images.disk_short(images.CLEAR_BELOW_BYTES)


def test_only_what_tests_tag_is_left_over():
    listing = "\n".join([
        "lab-vllm-qwen35:h-8b3bf50f8d7736b1", "lab-vllm-qwen35-graft:h-ca87ac2a140ad6de", "ni-eng:1",
        "<none>:<none>", "lab-vllm-cpu:0.32.0-0dc8bed37a7b", "lab-busybox:1", "lab-debian:bookworm",
        "lab-vllm-graft-donor:0.17.1-py313", "localhost:5000/lab-busybox:1", "",
    ])  # fmt: skip
    assert images.left_images(listing) == [
        "lab-vllm-qwen35:h-8b3bf50f8d7736b1", "lab-vllm-qwen35-graft:h-ca87ac2a140ad6de", "ni-eng:1",
        "localhost:5000/lab-busybox:1",
    ]  # fmt: skip


def test_sessions_read_the_older_format_of_bare_pids(private_lab):
    (private_lab / "run").mkdir(parents=True)
    (private_lab / "run" / "sessions.json").write_text('{"started": ["node-a"], "leases": [42]}')
    assert sessions._load() == {
        "started": ["node-a"],
        "leases": [{"id": "42", "pid": 42, "nodes": ["node-a"]}],
    }


# ---- errors for people ---------------------------------------------------------------------------


def test_not_root_is_named(monkeypatch, private_lab):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(LabError, match=r"^lab: must run as root \(dockerd and sshd need it\)$"):
        lab.up(["node-a"])


def test_missing_binary_names_package_and_make_setup(monkeypatch):
    monkeypatch.setattr(engines.shutil, "which", lambda name, path=None: None)
    with pytest.raises(
        LabError, match=r"sshd not found: install the Debian package openssh-server.*make setup"
    ):
        engines.find_binary("sshd")


def test_port_taken_names_address_and_port(monkeypatch):
    with socket.socket() as holder:
        holder.bind(("127.0.0.5", 0))
        holder.listen()
        port = holder.getsockname()[1]
        monkeypatch.setenv("LAB_SSH_PORT", str(port))
        with pytest.raises(LabError, match=rf"node-d: 127\.0\.0\.5:{port} is taken by another process"):
            nodes.check_port_free(select_specs(["node-d"])[0])


def test_spare_address_skips_one_taken_and_names_them_when_none_is_left(monkeypatch):
    with socket.create_server((layout.SPARE_HOSTS[0], 0)) as holder:
        port = holder.getsockname()[1]
        assert nodes.spare_address(port) == layout.SPARE_HOSTS[1]
        assert nodes.spare_address(port, avoid=(layout.SPARE_HOSTS[1],)) == layout.SPARE_HOSTS[2]
        monkeypatch.setattr(nodes, "SPARE_HOSTS", layout.SPARE_HOSTS[:1])
        with pytest.raises(LabError, match=rf"no spare loopback address has port {port} free \(taken: "):
            nodes.spare_address(port)
    assert not set(layout.SPARE_HOSTS) & {spec.host for spec in layout.NODE_SPECS}


def _fake_dockerd(tmp_path: Path, body: str) -> str:
    script = tmp_path / "fake-dockerd"
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(0o755)
    return str(script)


def test_daemon_that_exits_shows_its_log(monkeypatch, private_lab):
    fake = _fake_dockerd(private_lab, 'echo "failed to start daemon: boom"; exit 1')
    monkeypatch.setattr(nodes, "dockerd_binary", lambda engine: fake)
    with pytest.raises(
        LabError, match=r"(?s)node-a: dockerd exited with 1; last lines of .*dockerd\.log:.*boom"
    ):
        nodes.start_dockerd(select_specs(["node-a"])[0])


def test_daemon_that_never_answers_hits_the_deadline(monkeypatch, private_lab):
    fake = _fake_dockerd(private_lab, 'echo "still thinking"; exec sleep 3')
    monkeypatch.setattr(nodes, "dockerd_binary", lambda engine: fake)
    monkeypatch.setattr(nodes, "DOCKERD_DEADLINE", 0.5)
    with pytest.raises(
        LabError, match=r"(?s)did not answer on .*docker\.sock within 0s; last lines.*still thinking"
    ):
        nodes.start_dockerd(select_specs(["node-a"])[0])


# ---- node-e: behind a jump ----------------------------------------------------------------------


def test_a_node_behind_a_jump_brings_its_jump_up():
    assert layout.with_jumps(["node-e"]) == ["node-a", "node-e"]
    assert layout.with_jumps(["node-b", "node-e", "node-a"]) == ["node-a", "node-b", "node-e"]
    assert layout.with_jumps(["node-c"]) == ["node-c"]


def test_node_e_listens_only_in_its_namespace_and_the_door_serves_node_a(private_lab):
    spec = select_specs(["node-e"])[0]
    text = nodes.sshd_config_text(spec, node_paths("node-e"), ssh_paths())
    assert "ListenAddress 127.0.0.6:2222" in text
    assert f"SetEnv DOCKER_HOST=unix://{node_paths('node-e').socket} LAB_NODE=node-e" in text
    door = nodes.door_config_text(nodes.jump_spec(spec), ssh_paths())
    # The door is node-a (its host key, its daemon), only reached another way: no address of its own.
    assert f"HostKey {node_paths('node-a').host_key}" in door
    assert f"SetEnv DOCKER_HOST=unix://{node_paths('node-a').socket} LAB_NODE=node-a" in door
    assert "ListenAddress" not in door and "PasswordAuthentication no" in door


def test_node_e_is_reached_through_node_as_door_with_the_same_known_hosts(private_lab):
    spec = select_specs(["node-e"])[0]
    node = nodes.lab_node(spec, "20.10.24+dfsg1")
    assert node.proxy_jump == "root@127.0.0.2:2223"
    assert lab.node_config(node)["proxy_jump"] == "root@127.0.0.2:2223"
    assert "proxy_jump" not in lab.node_config(nodes.lab_node(select_specs(["node-a"])[0], "x"))
    proxy = next(o for o in lab.ssh_options(node) if o.startswith("ProxyCommand="))
    assert f"UserKnownHostsFile={node.known_hosts}" in proxy and "-p 2223" in proxy


def test_known_hosts_pins_the_door_with_the_jumps_host_key(private_lab):
    keys = ssh_paths()
    keys.root.mkdir(parents=True)
    nodes.ensure_host_keys_and_known_hosts(keys)
    lines = keys.known_hosts.read_text().splitlines()
    a_key = Path(f"{node_paths('node-a').host_key}.pub").read_text().split()[1]
    e_key = Path(f"{node_paths('node-e').host_key}.pub").read_text().split()[1]
    assert f"[127.0.0.2]:2222 ssh-ed25519 {a_key}" in lines
    assert f"[127.0.0.2]:2223 ssh-ed25519 {a_key}" in lines
    assert f"[127.0.0.6]:2222 ssh-ed25519 {e_key}" in lines
