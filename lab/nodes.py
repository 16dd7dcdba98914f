"""Lab nodes: one dockerd and one sshd per node, started, reused, checked and stopped."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from components.node_programs.wire import image_store
from lab.engines import SYSTEM_PATH, dockerd_binary, engine_bin_dirs, find_binary
from lab.layout import (
    LAB_USER,
    NODE_SPECS,
    SPARE_HOSTS,
    LabError,
    LabNode,
    NodePaths,
    NodeSpec,
    SshPaths,
    Store,
    data_dir,
    door_port,
    file_lock,
    known_hosts_line,
    lab_dir,
    node_paths,
    select_specs,
    ssh_paths,
    ssh_port,
    with_jumps,
)
from lab.netns import ensure_netns, in_netns, netns_argv

DOOR_SCRIPT = Path(__file__).resolve().parent / "door.py"
DOCKERD_DEADLINE = 60.0
SSHD_DEADLINE = 15.0
STOP_DEADLINE = 30.0


# ---- pure pieces: command lines and config files -------------------------------------------------


def dockerd_argv(binary: str, paths: NodePaths) -> list[str]:
    """dockerd for one node: its own roots, socket and pidfile; no bridge or iptables (they are shared)."""
    return [
        binary,
        "--data-root", str(paths.data_root),
        "--exec-root", str(paths.exec_root),
        "--host", f"unix://{paths.socket}",
        "--pidfile", str(paths.docker_pid),
        "--config-file", str(paths.daemon_json),  # never the machine's /etc/docker/daemon.json
        "--bridge=none",
        "--iptables=false",
        "--ip6tables=false",
        "--ip-forward=false",
        "--ip-masq=false",
    ]  # fmt: skip


def daemon_config(spec: NodeSpec) -> dict:
    """The node's daemon.json: its image store, and the default log options it rotates logs with."""
    config: dict = {}
    if spec.store is Store.CONTAINERD:
        config["features"] = {"containerd-snapshotter": True}
    if spec.log_opts:
        config["log-opts"] = dict(spec.log_opts)
    return config


def _sshd_lines(host_key: Path, keys: SshPaths, name: str, paths: NodePaths) -> list[str]:
    """What every lab sshd shares: pinned host key, key-only root login, sessions on `name`'s daemon."""
    return [
        f"HostKey {host_key}",
        f"AuthorizedKeysFile {keys.authorized_keys}",
        "PermitRootLogin prohibit-password",
        "PubkeyAuthentication yes",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "UsePAM no",
        "X11Forwarding no",
        "PrintMotd no",
        "MaxSessions 50",
        "MaxStartups 50:30:100",
        # Its own home, as a separate machine has: sessions read no startup files or client
        # configuration of the machine running the lab (here, root's ~/.bashrc runs pyenv init).
        f"SetEnv DOCKER_HOST=unix://{paths.socket} LAB_NODE={name} HOME={paths.home}",
        "LogLevel INFO",
        "",
    ]


def sshd_config_text(spec: NodeSpec, paths: NodePaths, keys: SshPaths) -> str:
    """sshd on the node's own address; every session lands on the node's daemon via DOCKER_HOST.

    A node behind a jump runs this sshd inside its own network namespace: the address is the node's
    there, and nothing listens on it in this machine's network."""
    listen = [f"ListenAddress {spec.host}:{ssh_port()}", f"PidFile {paths.sshd_pid}"]
    return "\n".join(listen + _sshd_lines(paths.host_key, keys, spec.name, paths))


def door_config_text(jump: NodeSpec, keys: SshPaths) -> str:
    """The jump node's second door (`sshd -i` per connection): the jump's own host key and daemon."""
    jump_paths = node_paths(jump.name)
    return "\n".join(_sshd_lines(jump_paths.host_key, keys, jump.name, jump_paths))


def jump_spec(spec: NodeSpec) -> NodeSpec:
    """The spec of the node `spec` is reached through."""
    (jump,) = [other for other in NODE_SPECS if other.name == spec.jump]
    return jump


def door_address(spec: NodeSpec) -> str:
    """`user@host:port` of the door into `spec`'s namespace: its ProxyJump."""
    return f"{LAB_USER}@{jump_spec(spec).host}:{door_port()}"


def lab_node(spec: NodeSpec, engine_version: str) -> LabNode:
    keys = ssh_paths()
    return LabNode(
        name=spec.name,
        host=spec.host,
        port=ssh_port(),
        user=LAB_USER,
        identity_file=str(keys.identity_file),
        known_hosts=str(keys.known_hosts),
        docker_host=f"unix://{node_paths(spec.name).socket}",
        engine=engine_version,
        store=spec.store.value,
        proxy_jump=door_address(spec) if spec.jump else None,
    )


def store_of(info: dict) -> str:
    """'containerd' when the daemon stores images in containerd's snapshotter, else 'classic'."""
    return Store(image_store(info.get("DriverStatus"))).value


# ---- facts: what is running ----------------------------------------------------------------------


def engine_get(sock: Path, path: str, timeout: float = 3.0) -> dict | None:
    """GET an Engine API path over the unix socket; None when the daemon does not answer 200."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(timeout)
            conn.connect(str(sock))
            conn.sendall(f"GET {path} HTTP/1.0\r\nHost: docker\r\n\r\n".encode())
            chunks = []
            while chunk := conn.recv(65536):
                chunks.append(chunk)
    except OSError:
        return None
    head, _, body = b"".join(chunks).partition(b"\r\n\r\n")
    if not head.startswith((b"HTTP/1.0 200", b"HTTP/1.1 200")):
        return None
    if path == "/_ping":
        return {"ping": body.decode(errors="replace")}
    try:
        return json.loads(body)
    except ValueError:
        return None


def read_pid(pidfile: Path) -> int | None:
    try:
        return int(pidfile.read_text().strip())
    except (OSError, ValueError):
        return None


def process_cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie we spawned ourselves still answers kill(0); it is not running.
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def owned_pid(pidfile: Path, marker: str) -> int | None:
    """The pid in `pidfile` if that process is alive and its command line names `marker` (not reused)."""
    pid = read_pid(pidfile)
    if pid and pid_alive(pid) and marker in process_cmdline(pid):
        return pid
    return None


def running_dockerd(name: str) -> int | None:
    paths = node_paths(name)
    return owned_pid(paths.docker_pid, str(paths.data_root))


def running_sshd(name: str) -> int | None:
    paths = node_paths(name)
    return owned_pid(paths.sshd_pid, str(paths.sshd_config))


def running_door(name: str) -> int | None:
    """The door into `name`'s namespace (a node behind a jump), if it runs."""
    paths = node_paths(name)
    return owned_pid(paths.door_pid, str(paths.door_config))


@dataclass(frozen=True)
class NodeState:
    """What `status` reports for one node."""

    name: str
    dockerd_pid: int | None
    sshd_pid: int | None
    engine: str | None
    store: str | None
    # A node behind a jump: the jump's door into its namespace (None: not behind a jump, or down).
    door_pid: int | None = None
    behind_jump: bool = False

    @property
    def running(self) -> bool:
        door = self.door_pid is not None or not self.behind_jump
        return bool(self.dockerd_pid and self.sshd_pid and self.engine and door)


def node_state(spec: NodeSpec) -> NodeState:
    paths = node_paths(spec.name)
    dockerd_pid = running_dockerd(spec.name)
    sshd_pid = running_sshd(spec.name)
    version = engine_get(paths.socket, "/version") if dockerd_pid else None
    info = engine_get(paths.socket, "/info") if version else None
    return NodeState(
        name=spec.name,
        dockerd_pid=dockerd_pid,
        sshd_pid=sshd_pid,
        engine=version.get("Version") if version else None,
        store=store_of(info) if info else None,
        door_pid=running_door(spec.name) if spec.jump else None,
        behind_jump=bool(spec.jump),
    )


# ---- operations ----------------------------------------------------------------------------------


def require_root() -> None:
    if os.geteuid() != 0:
        raise LabError("lab: must run as root (dockerd and sshd need it)")


LOG_MARK = "---- lab: starting dockerd"


def log_tail(path: Path, lines: int = 15) -> str:
    """The last lines of a log, from the latest start only."""
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return f"(no log at {path})"
    starts = [i for i, line in enumerate(text) if line.startswith(LOG_MARK)]
    text = text[starts[-1] + 1 :] if starts else text
    return f"last lines of {path}:\n" + "\n".join(text[-lines:])


def ensure_client_keys(keys: SshPaths) -> None:
    keys.root.mkdir(parents=True, exist_ok=True)
    os.chmod(keys.root, 0o700)
    if not keys.identity_file.exists():
        _keygen(keys.identity_file, "qwen35-lab-client")
    public = Path(f"{keys.identity_file}.pub").read_text()
    _write_if_changed(keys.authorized_keys, public, mode=0o600)


def ensure_host_keys_and_known_hosts(keys: SshPaths) -> None:
    """A host key for every node (so known_hosts never changes with the subset started)."""
    lines = []
    for spec in NODE_SPECS:
        paths = node_paths(spec.name)
        paths.root.mkdir(parents=True, exist_ok=True)
        if not paths.host_key.exists():
            _keygen(paths.host_key, f"{spec.name}-host")
        public = Path(f"{paths.host_key}.pub").read_text()
        lines.append(known_hosts_line(spec.host, ssh_port(), public))
    for spec in NODE_SPECS:
        if spec.jump:  # the jump's door answers with the jump's own host key
            public = Path(f"{node_paths(spec.jump).host_key}.pub").read_text()
            lines.append(known_hosts_line(jump_spec(spec).host, door_port(), public))
    _write_if_changed(keys.known_hosts, "\n".join(lines) + "\n", mode=0o644)


def _keygen(path: Path, comment: str) -> None:
    done = subprocess.run(
        [find_binary("ssh-keygen"), "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise LabError(f"lab: ssh-keygen for {path} failed: {done.stderr.strip()}")


def _write_if_changed(path: Path, text: str, mode: int) -> None:
    if not path.exists() or path.read_text() != text:
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(text)
        os.chmod(tmp, mode)
        tmp.replace(path)


def bind_error(host: str, port: int) -> OSError | None:
    """Why a TCP listener could not bind host:port now (None: it could), checked by binding."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            return exc
    return None


def check_port_free(spec: NodeSpec, port: int | None = None, host: str | None = None) -> None:
    host = host or spec.host
    port = port or ssh_port()
    exc = bind_error(host, port)
    if exc is None:
        return
    if exc.errno == errno.EADDRINUSE:
        raise LabError(
            f"lab: {spec.name}: {host}:{port} is taken by another process (see: ss -ltnp 'sport = :{port}')"
        )
    raise LabError(f"lab: {spec.name}: cannot bind {host}:{port}: {exc}")


def spare_address(port: int, avoid: tuple[str, ...] = ()) -> str:
    """A loopback address of the lab's own (`SPARE_HOSTS`) where `port` is free, so a test can listen
    there, or find nothing listening; the first such address not in `avoid`."""
    taken = []
    for host in SPARE_HOSTS:
        if host in avoid:
            continue
        if bind_error(host, port) is not None:
            taken.append(host)
            continue
        return host
    raise LabError(
        f"lab: no spare loopback address has port {port} free (taken: {', '.join(taken)}); "
        f"see: ss -ltnp 'sport = :{port}'"
    )


@contextlib.contextmanager
def node_network(spec: NodeSpec) -> Iterator[None]:
    """The network the node's own processes see: its namespace when it is behind a jump."""
    if spec.jump:
        with in_netns(node_paths(spec.name).netns):
            yield
    else:
        yield


def start_dockerd(spec: NodeSpec) -> str:
    """Start (or reuse) the node's dockerd; returns the engine version it reports."""
    paths = node_paths(spec.name)
    if running_dockerd(spec.name):
        # A daemon.json changes nothing in a running dockerd (log-opts are not reloadable).
        wanted = json.dumps(daemon_config(spec)) + "\n"
        if not paths.daemon_json.exists() or paths.daemon_json.read_text() != wanted:
            raise LabError(
                f"lab: {spec.name}'s dockerd runs with an older daemon.json than the lab wants "
                f"({wanted.strip()}): run `make lab-down`, then try again"
            )
        version = engine_get(paths.socket, "/version")
        if version:
            return version["Version"]
    for name in ("containerd", "runc"):
        find_binary(name)
    binary = dockerd_binary(spec.engine)
    paths.root.mkdir(parents=True, exist_ok=True)
    paths.data_root.mkdir(parents=True, exist_ok=True)
    _write_if_changed(paths.daemon_json, json.dumps(daemon_config(spec)) + "\n", mode=0o644)
    path_var = ":".join([*(str(p) for p in engine_bin_dirs(spec.engine)), SYSTEM_PATH])
    env = {"PATH": path_var, "HOME": "/root", "LANG": "C.UTF-8"}
    # A pidfile left by a daemon that died (or is an unreaped zombie) stops dockerd from starting.
    paths.docker_pid.unlink(missing_ok=True)
    argv = dockerd_argv(binary, paths)
    if spec.jump:
        ensure_netns(paths.netns)
        argv = netns_argv(paths.netns, argv)
    with open(paths.docker_log, "ab") as log:
        log.write(f"{LOG_MARK} {time.strftime('%Y-%m-%dT%H:%M:%S')}\n".encode())
        log.flush()
        process = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=paths.root,
            start_new_session=True,  # survives the CLI; `down` stops it by pidfile
        )
    deadline = time.monotonic() + DOCKERD_DEADLINE
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise LabError(
                f"lab: {spec.name}: dockerd exited with {process.returncode}; {log_tail(paths.docker_log)}"
            )
        version = engine_get(paths.socket, "/version")
        if version:
            return version["Version"]
        time.sleep(0.2)
    raise LabError(
        f"lab: {spec.name}: dockerd did not answer on {paths.socket} within {DOCKERD_DEADLINE:.0f}s; "
        f"{log_tail(paths.docker_log)}"
    )


def start_sshd(spec: NodeSpec, keys: SshPaths) -> None:
    paths = node_paths(spec.name)
    paths.home.mkdir(mode=0o700, exist_ok=True)
    _write_if_changed(paths.sshd_config, sshd_config_text(spec, paths, keys), mode=0o600)
    if running_sshd(spec.name):
        return
    if spec.jump:
        ensure_netns(paths.netns)
    with node_network(spec):
        check_port_free(spec)
    sshd = find_binary("sshd")
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation directory
    test = subprocess.run([sshd, "-t", "-f", str(paths.sshd_config)], capture_output=True, text=True)
    if test.returncode != 0:
        raise LabError(f"lab: {spec.name}: sshd rejects {paths.sshd_config}: {test.stderr.strip()}")
    argv = [sshd, "-f", str(paths.sshd_config), "-E", str(paths.sshd_log)]
    started = subprocess.run(
        netns_argv(paths.netns, argv) if spec.jump else argv, capture_output=True, text=True
    )
    if started.returncode != 0:
        raise LabError(
            f"lab: {spec.name}: sshd failed to start ({started.stderr.strip()}); {log_tail(paths.sshd_log)}"
        )
    deadline = time.monotonic() + SSHD_DEADLINE
    while time.monotonic() < deadline:
        with node_network(spec):
            accepts = _accepts(spec.host, ssh_port())
        if running_sshd(spec.name) and accepts:
            return
        time.sleep(0.1)
    raise LabError(
        f"lab: {spec.name}: sshd not listening on {spec.host}:{ssh_port()} within {SSHD_DEADLINE:.0f}s; "
        f"{log_tail(paths.sshd_log)}"
    )


def _accepts(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


def start_door(spec: NodeSpec, keys: SshPaths) -> None:
    """The jump's second door into `spec`'s namespace: on the jump's address, port `door_port()`."""
    paths = node_paths(spec.name)
    jump = jump_spec(spec)
    _write_if_changed(paths.door_config, door_config_text(jump, keys), mode=0o600)
    if running_door(spec.name):
        return
    check_port_free(jump, door_port())
    sshd = find_binary("sshd")
    test = subprocess.run([sshd, "-t", "-f", str(paths.door_config)], capture_output=True, text=True)
    if test.returncode != 0:
        raise LabError(f"lab: {spec.name}: sshd rejects {paths.door_config}: {test.stderr.strip()}")
    serve = netns_argv(paths.netns, [sshd, "-i", "-f", str(paths.door_config), "-E", str(paths.door_log)])
    paths.door_pid.unlink(missing_ok=True)
    with open(paths.door_log, "ab") as log:
        process = subprocess.Popen(
            [sys.executable, "-I", str(DOOR_SCRIPT), "--listen", f"{jump.host}:{door_port()}",
             "--pidfile", str(paths.door_pid), "--", *serve],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # survives the CLI; `down` stops it by pidfile
        )  # fmt: skip
    deadline = time.monotonic() + SSHD_DEADLINE
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise LabError(f"lab: {spec.name}: the door on {jump.name} exited; {log_tail(paths.door_log)}")
        if running_door(spec.name) and _accepts(jump.host, door_port()):
            return
        time.sleep(0.1)
    raise LabError(
        f"lab: {spec.name}: the door on {jump.host}:{door_port()} did not listen within "
        f"{SSHD_DEADLINE:.0f}s; {log_tail(paths.door_log)}"
    )


LOCK_DEADLINE = 600.0


@contextlib.contextmanager
def lab_lock() -> Iterator[None]:
    """Serialize up/down across processes (several engineers and test sessions share this machine)."""
    require_root()
    with file_lock(lab_dir() / "lock", LOCK_DEADLINE, "in a lab up or down"):
        yield


def up(nodes: list[str] | tuple[str, ...] | None = None) -> dict[str, LabNode]:
    """Start the named nodes (all by default), reusing whatever already runs; name -> LabNode."""
    with lab_lock():
        return up_locked(nodes)


def up_locked(nodes: list[str] | tuple[str, ...] | None = None) -> dict[str, LabNode]:
    """`up` for a caller that already holds `lab_lock`."""
    specs = select_specs(with_jumps(nodes) if nodes is not None else None)
    for name in ("sshd", "ssh", "ssh-keygen", "dockerd"):
        find_binary(name)
    keys = ssh_paths()
    ensure_client_keys(keys)
    ensure_host_keys_and_known_hosts(keys)
    started: dict[str, LabNode] = {}
    for spec in specs:
        version = start_dockerd(spec)
        start_sshd(spec, keys)
        if spec.jump:
            start_door(spec, keys)
        started[spec.name] = lab_node(spec, version)
    return started


def stop_pids(pids: list[int], deadline: float) -> dict[int, bool]:
    """SIGTERM all at once, wait up to `deadline` seconds, then SIGKILL; pid -> stopped on its own."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    end = time.monotonic() + deadline
    while time.monotonic() < end and any(pid_alive(pid) for pid in pids):
        time.sleep(0.1)
    clean = {}
    for pid in pids:
        clean[pid] = not pid_alive(pid)
        if not clean[pid]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    return clean


def lab_processes(markers: list[str]) -> dict[int, str]:
    """Processes (other than this one) whose command line names one of `markers`."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        cmdline = process_cmdline(int(entry.name))
        if cmdline and any(marker in cmdline for marker in markers) and pid_alive(int(entry.name)):
            found[int(entry.name)] = cmdline
    return found


def lab_mounts(prefixes: list[str]) -> list[str]:
    """Mount points under the lab's directories, deepest first."""
    points = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        point = line.split()[1].replace("\\040", " ")
        if any(point == p or point.startswith(p + "/") for p in prefixes):
            points.append(point)
    return sorted(points, key=len, reverse=True)


def down(nodes: list[str] | tuple[str, ...] | None = None) -> list[str]:
    """Stop the named nodes (all by default) and verify nothing of theirs is left; returns notes."""
    with lab_lock():
        return down_locked(nodes)


def down_locked(nodes: list[str] | tuple[str, ...] | None = None) -> list[str]:
    """`down` for a caller that already holds `lab_lock`."""
    notes = []
    specs = select_specs(nodes)
    for spec in specs:
        door = running_door(spec.name) if spec.jump else None
        if door:
            stop_pids([door], 5.0)
            notes.append(f"{spec.name}: stopped the door on {spec.jump} (pid {door})")
    sshds = {spec.name: running_sshd(spec.name) for spec in specs}
    for name, pid in sshds.items():
        if pid:
            stop_pids([pid], 5.0)
            notes.append(f"{name}: stopped sshd (pid {pid})")
    # dockerd stops its containers (up to their stop timeout) and its own containerd on SIGTERM;
    # all daemons at once, so a slow container on one node does not hold up the others.
    dockerds = {spec.name: running_dockerd(spec.name) for spec in specs}
    clean = stop_pids([pid for pid in dockerds.values() if pid], STOP_DEADLINE)
    for name, pid in dockerds.items():
        if pid:
            how = "stopped" if clean[pid] else "killed (no clean stop within deadline)"
            notes.append(f"{name}: {how} dockerd (pid {pid})")
    markers = [str(p) for s in specs for p in (node_paths(s.name).root, node_paths(s.name).data_root)]
    leftovers = lab_processes(markers)
    for pid, cmdline in leftovers.items():
        notes.append(f"killed leftover pid {pid}: {cmdline[:120]}")
    stop_pids(list(leftovers), 5.0)
    for point in lab_mounts(markers):
        subprocess.run(["umount", "-l", point], capture_output=True)
        notes.append(f"unmounted {point}")
    if nodes is None:  # the whole lab is down: no test session's record applies any more
        (lab_dir() / "sessions.json").unlink(missing_ok=True)
    still = lab_processes(markers)
    mounts = lab_mounts(markers)
    if still or mounts:
        raise LabError(
            "lab: down left things behind: "
            + "; ".join([f"pid {p}: {c[:100]}" for p, c in still.items()] + [f"mount {m}" for m in mounts])
        )
    return notes


def status(nodes: list[str] | tuple[str, ...] | None = None) -> dict[str, NodeState]:
    return {spec.name: node_state(spec) for spec in select_specs(nodes)}


def running_nodes() -> dict[str, LabNode]:
    """LabNodes for the nodes whose dockerd and sshd both run now (no starting)."""
    found = {}
    for spec in NODE_SPECS:
        state = node_state(spec)
        if state.running and state.engine:
            found[spec.name] = lab_node(spec, state.engine)
    return found


def purge() -> None:
    """Remove the lab's data roots and runtime state (after down)."""
    for path in (data_dir(), lab_dir()):
        if path.exists():
            shutil.rmtree(path)
