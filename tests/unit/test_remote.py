"""The transport's pure parts: quoting, SSH options, errors, retries (tables, no node needed)."""

from __future__ import annotations

import shlex

import pytest

from components.config import parse_stack_config
from components.nodes import node_access, same_address, same_node
from components.remote import (
    LocalTransport,
    RemoteError,
    Result,
    SshTarget,
    bash_argv,
    shell_join,
    ssh_argv,
    ssh_options,
    with_retries,
)
from tests.support.program import dev_raw

TARGET = SshTarget(host="10.0.0.1", user="aurora", known_hosts="/k/known_hosts", name="spark-1")


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["docker", "image", "inspect", "a:b"], "docker image inspect a:b"),
        (["echo", "a b"], "echo 'a b'"),
        (["echo", "$(reboot)"], "echo '$(reboot)'"),
        (["echo", "it's"], "echo 'it'\"'\"'s'"),
        (["sh", "-c", "x; y"], "sh -c 'x; y'"),
        ([], ""),
    ],
)
def test_shell_join_round_trips(argv, expected):
    assert shell_join(argv) == expected
    assert shlex.split(shell_join(argv)) == argv


@pytest.mark.parametrize("bad", ["docker ps", ["a\nb"], ["a\x00"], [1]])
def test_shell_join_refuses_strings_and_unsafe_args(bad):
    with pytest.raises((TypeError, ValueError)):
        shell_join(bad)


def _opt(opts: list[str], key: str) -> str | None:
    for i, item in enumerate(opts):
        if item == "-o" and opts[i + 1].startswith(key + "="):
            return opts[i + 1].split("=", 1)[1]
    return None


def test_ssh_options_pin_host_keys_and_fail_fast():
    opts = ssh_options(TARGET)
    assert _opt(opts, "StrictHostKeyChecking") == "yes"
    assert _opt(opts, "UserKnownHostsFile") == "/k/known_hosts"
    assert _opt(opts, "BatchMode") == "yes"
    assert _opt(opts, "ServerAliveInterval") == "15" and _opt(opts, "ServerAliveCountMax") == "3"
    assert _opt(opts, "ConnectTimeout") == "10"
    assert opts[opts.index("-p") + 1] == "22"
    assert "-i" not in opts
    # AES-GCM preferred (faster per CPU second with AES instructions), every default cipher still offered
    ciphers = _opt(opts, "Ciphers").split(",")
    assert ciphers[0] == "aes128-gcm@openssh.com" and "chacha20-poly1305@openssh.com" in ciphers


def test_identity_and_control_master():
    opts = ssh_options(SshTarget(**{**TARGET.__dict__, "identity_file": "/k/id"}), control_path="/tmp/cm-%C")
    assert opts[opts.index("-i") + 1] == "/k/id" and _opt(opts, "IdentitiesOnly") == "yes"
    assert _opt(opts, "ControlMaster") == "auto" and _opt(opts, "ControlPath") == "/tmp/cm-%C"


def test_proxy_jump_uses_the_same_pinned_keys():
    target = SshTarget(
        host="192.168.200.13", user="aurora", known_hosts="/k/kh", proxy_jump="aurora@10.1.230.180:22"
    )
    proxy = shlex.split(_opt(ssh_options(target), "ProxyCommand"))
    assert proxy[0] == "ssh" and proxy[-1] == "aurora@10.1.230.180" and "%h:%p" in proxy
    assert _opt(proxy, "UserKnownHostsFile") == "/k/kh" and _opt(proxy, "StrictHostKeyChecking") == "yes"


def test_a_dialer_connects_for_ssh_where_asked_and_never_before_a_jump():
    """`dial_with`: ssh connects through node_programs/tcp_dial.py run by that interpreter; a target
    behind a jump keeps the jump's ProxyCommand (the hop's own connection is not dialed)."""
    assert _opt(ssh_options(TARGET), "ProxyCommand") is None  # not asked: ssh connects by itself
    opts = ssh_options(TARGET, dial_with="/opt/py 100%/bin/python3")
    dial = shlex.split(_opt(opts, "ProxyCommand"))
    assert _opt(opts, "ProxyUseFdpass") == "yes"
    assert dial[:4] == ["/opt/py 100%%/bin/python3", "-I", "-S", "-c"]  # ssh's % tokens: a literal % doubled
    assert dial[5:] == ["%h", "%p", "10"]  # ssh fills in the host and port; ConnectTimeout for the dial
    behind = SshTarget(host="192.168.200.13", user="a", known_hosts="/k/kh", proxy_jump="a@10.1.230.180:22")
    jump = shlex.split(_opt(ssh_options(behind, dial_with="python3"), "ProxyCommand"))
    assert jump[0] == "ssh" and "ProxyUseFdpass=yes" not in ssh_options(behind, dial_with="python3")


def test_the_dialer_hands_ssh_a_connected_socket_without_nagle(tmp_path):
    import array
    import socket
    import subprocess
    import sys

    from components.node_programs import program_argv

    listener = socket.create_server(("127.0.0.1", 0))
    ours, theirs = socket.socketpair()  # what ssh gives its dialer as stdout
    port = str(listener.getsockname()[1])
    with ours, theirs, listener:
        done = subprocess.run(
            program_argv("tcp_dial", ["127.0.0.1", port, "5"], sys.executable), stdout=theirs, timeout=30
        )
        assert done.returncode == 0
        fds = array.array("i")
        data, ancillary, _, _ = ours.recvmsg(1, socket.CMSG_SPACE(fds.itemsize))
        fds.frombytes(ancillary[0][2][: fds.itemsize])
        with socket.socket(fileno=fds[0]) as conn:
            accepted, _ = listener.accept()
            with accepted:
                assert conn.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
                assert conn.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1  # as ssh's own
                assert conn.gettimeout() is None  # blocking, as ssh's own connect() leaves it
                conn.sendall(b"SSH-2.0-x\r\n")
                assert accepted.recv(64) == b"SSH-2.0-x\r\n"


def test_a_failed_dial_says_what_ssh_would(tmp_path):
    """The dialer's message is ssh's own, and the lines ssh adds after it are left out of a tail: an
    operator reads the same reason with or without the dialer."""
    import socket
    import subprocess
    import sys

    from components.remote import stderr_tail

    with socket.create_server(("127.0.0.1", 0)) as closed:
        port = closed.getsockname()[1]
    target = SshTarget(host="127.0.0.1", user="x", known_hosts=str(tmp_path / "kh"), port=port)
    reasons = []
    for dial_with in (None, sys.executable):
        done = subprocess.run(ssh_argv(target, ["true"], dial_with=dial_with), capture_output=True, text=True)
        assert done.returncode == 255
        reasons.append(stderr_tail(done.stderr, 1))
    assert reasons == [f"ssh: connect to host 127.0.0.1 port {port}: Connection refused"] * 2


def test_the_dialer_is_started_by_a_shell_that_reads_no_rc_file(tmp_path, monkeypatch):
    """ssh starts its ProxyCommand with `$SHELL -c`: bash there reads ~/.bashrc (stdin is a socket,
    which it takes for a remote login; on a source node SSH_CLIENT says so too). Dialed ssh runs with
    SHELL=/bin/sh, so a slow rc file costs nothing; without it, bash reads it (the control)."""
    import socket
    import subprocess
    import sys

    (tmp_path / ".bashrc").write_text(f"echo read >> {tmp_path / 'read'}\n")
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("SHELL", "/bin/bash")
    monkeypatch.setenv("SSH_CLIENT", "10.0.0.1 50000 22")  # as inside the source's session
    monkeypatch.delenv("SHLVL", raising=False)
    with socket.create_server(("127.0.0.1", 0)) as closed:
        port = closed.getsockname()[1]
    target = SshTarget(host="127.0.0.1", user="x", known_hosts=str(tmp_path / "kh"), port=port)
    argv = ssh_argv(target, ["true"], dial_with=sys.executable)
    assert argv[:3] == ["env", "SHELL=/bin/sh", "ssh"]
    assert subprocess.run(argv, capture_output=True).returncode == 255
    assert not (tmp_path / "read").exists()
    assert subprocess.run(argv[2:], capture_output=True).returncode == 255  # the user's bash instead
    assert (tmp_path / "read").read_text() == "read\n"


def test_no_ssh_on_this_machine_says_so(tmp_path, monkeypatch):
    import shutil

    from components.remote import SshTransport

    (tmp_path / "env").symlink_to(shutil.which("env"))  # env, and no ssh, on the PATH
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(RemoteError) as raised:
        SshTransport(TARGET).run(["true"], timeout=30)
    assert raised.value.hint == "install 'ssh' on this machine"
    # an operation's sessions (NodeImage, Checkpoint) say it before any session starts
    from components.transfer import ssh_sessions

    with pytest.raises(RemoteError, match="install 'ssh' on this machine"), ssh_sessions():
        pass


def test_ssh_argv_quotes_the_remote_command_once():
    argv = ssh_argv(TARGET, ["docker", "tag", "a:b", "c d"])
    assert argv[0] == "ssh" and argv[-3:] == ["aurora@10.0.0.1", "--", "docker tag a:b 'c d'"]


def test_dev_stack_access_resolves_the_jump_through_the_head():
    access = node_access(parse_stack_config(dev_raw()))
    assert access["spark-1"].target.proxy_jump is None
    assert access["spark-2"].target.proxy_jump == "aurora@10.1.230.180:22"
    assert access["spark-2"].docker_host == "ssh://aurora@192.168.200.13:22"
    assert access["spark-2"].node_dict()["fabric_host"] == "192.168.200.13"


def test_remote_error_names_node_and_stderr_tail():
    err = RemoteError(
        "spark-2", ["docker", "load"], 1, b"line1\nno space left on device\n", "free disk space"
    )
    text = str(err)
    assert text.startswith("spark-2: `docker load` failed (exit 1)")
    assert "no space left on device" in text and "next: free disk space" in text
    assert not err.transport_failed
    assert RemoteError("spark-2", ["true"], 255, b"").transport_failed
    assert "could not be reached over SSH" in str(RemoteError("spark-2", ["true"], 255, b""))


def test_local_transport_runs_and_checks():
    result = LocalTransport().run(["sh", "-c", "printf out; printf err >&2; exit 3"])
    assert (result.returncode, result.stdout, result.stderr) == (3, b"out", b"err")
    with pytest.raises(RemoteError, match="exit 3"):
        result.check()
    assert LocalTransport().run(["cat"], stdin=b"abc").stdout == b"abc"
    with pytest.raises(RemoteError, match="timed out"):
        LocalTransport().run(["sleep", "5"], timeout=0.2)


def test_composed_scripts_do_not_run_the_users_bashrc_again(tmp_path):
    """sshd's bash reads ~/.bashrc even for a command (stdin is a socket); pyenv or conda init there
    costs every command ~0.1 s or more. Our inner bash must not read it a second time."""
    import socket
    import subprocess

    (tmp_path / ".bashrc").write_text("echo SOURCED-BASHRC\n")
    env = {"HOME": str(tmp_path), "PATH": "/usr/bin:/bin", "SSH_CLIENT": "10.0.0.9 50000 22"}

    def run(argv):
        ours, theirs = socket.socketpair()  # what sshd gives a command as stdin
        with ours, theirs:
            return subprocess.run(argv, stdin=theirs, capture_output=True, text=True, env=env).stdout

    assert "SOURCED-BASHRC" in run(["bash", "-c", "echo ran"])  # the cost being avoided is real here
    assert run(bash_argv("echo ran")) == "ran\n"
    assert run(bash_argv("false | true; echo $?", pipefail=True)) == "1\n"
    with pytest.raises(TypeError):
        bash_argv(["echo", "x"])


def test_retries_only_transport_failures_until_deadline():
    calls, sleeps = [], []
    clock = iter(range(0, 1000, 1)).__next__

    def flaky():
        calls.append(1)
        return Result(("x",), 255 if len(calls) < 3 else 0)

    assert with_retries(flaky, deadline_s=100, sleep=sleeps.append, clock=clock).ok
    assert len(calls) == 3 and len(sleeps) == 2

    calls.clear()
    failing = with_retries(lambda: calls.append(1) or Result(("x",), 1), sleep=sleeps.append, clock=clock)
    assert failing.returncode == 1 and len(calls) == 1

    calls.clear()
    dead = with_retries(
        lambda: calls.append(1) or Result(("x",), 255), deadline_s=5, sleep=lambda s: None, clock=clock
    )
    assert dead.returncode == 255 and 1 <= len(calls) <= 6


@pytest.mark.parametrize(
    ("change", "node", "address"),
    [
        ({}, True, True),
        ({"host": "spark-2.lan"}, True, False),
        ({"port": 2222}, True, False),
        ({"name": "spark-3"}, False, True),
        ({"proxy_jump": "ops@bastion", "user": "other"}, True, True),
    ],
)
def test_one_rule_for_the_same_node_and_one_for_the_same_address(change, node, address):
    old = {"name": "spark-2", "host": "10.0.0.2", "port": 22, "user": "ops", "known_hosts": "/k"}
    new = {**old, **change}
    assert (same_node(old, new), same_address(old, new)) == (node, address)
