"""The lab's fixed shape: which nodes exist, where each keeps its state, and the handle tests get."""

from __future__ import annotations

import contextlib
import difflib
import fcntl
import os
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from components.errors import Qwen35Error

SSH_PORT = 2222  # default; LAB_SSH_PORT moves a second, private lab out of the way
LAB_USER = "root"


class LabError(Qwen35Error, RuntimeError):
    """A lab step failed; the message says what, where, and what to do next."""


class Engine(str, Enum):
    """Where a node's dockerd comes from."""

    BOOKWORM = "bookworm"  # the machine's own docker.io (20.10)
    TRIXIE = "trixie"  # Debian trixie's docker.io (26.x), unpacked into the cache, never installed


class Store(str, Enum):
    """The daemon's image store."""

    CLASSIC = "classic"  # graph driver (overlay2)
    CONTAINERD = "containerd"  # containerd snapshotter


@dataclass(frozen=True)
class NodeSpec:
    """One lab node as designed: name, loopback address, engine and image store.

    `jump`: the node is reached only through that node, as spark-2 is through spark-1. Its dockerd and
    sshd run in a network namespace of their own (the lab's "fabric"), where its sshd listens on
    `host`; from this machine's network that address refuses connections. The jump node gets a second
    SSH door (`door_port()` on its own address) whose sessions run inside the fabric namespace.
    """

    name: str
    host: str
    engine: Engine
    store: Store
    jump: str | None = None
    # Default log options in the daemon's daemon.json, as a node that rotates its logs sets them: every
    # container the daemon creates then carries them, and the Docker provider must not see that as drift.
    log_opts: tuple[tuple[str, str], ...] = ()


# What log rotation on a Spark commonly looks like in /etc/docker/daemon.json.
ROTATED_LOGS = (("max-size", "10m"), ("max-file", "3"))

NODE_SPECS: tuple[NodeSpec, ...] = (
    NodeSpec("node-a", "127.0.0.2", Engine.BOOKWORM, Store.CLASSIC, log_opts=ROTATED_LOGS),
    NodeSpec("node-b", "127.0.0.3", Engine.BOOKWORM, Store.CLASSIC, log_opts=ROTATED_LOGS),
    NodeSpec("node-c", "127.0.0.4", Engine.TRIXIE, Store.CLASSIC),
    NodeSpec("node-d", "127.0.0.5", Engine.TRIXIE, Store.CONTAINERD),
    NodeSpec("node-e", "127.0.0.6", Engine.BOOKWORM, Store.CLASSIC, jump="node-a"),
)
NODE_NAMES = tuple(spec.name for spec in NODE_SPECS)
# Loopback addresses no node uses, for what tests put beside the nodes: a relay that stands for
# another name of a node, an address where nothing answers. Taken one at a time, each checked free.
SPARE_HOSTS: tuple[str, ...] = tuple(f"127.0.0.{last}" for last in range(10, 40))


@dataclass(frozen=True)
class LabNode:
    """A running lab node as tests and stack config see it: SSH target plus the daemon behind it."""

    name: str
    host: str
    port: int
    user: str
    identity_file: str
    known_hosts: str
    docker_host: str  # unix://… socket the node's SSH sessions get as DOCKER_HOST
    engine: str  # the daemon's own version string, e.g. "20.10.24+dfsg1"
    store: str  # "classic" | "containerd"
    proxy_jump: str | None = None  # `user@host:port` of the jump's door, for a node behind a jump

    @property
    def target(self) -> str:
        return f"{self.user}@{self.host}"


DEFAULT_LAB_DIR = "/run/qwen35-lab"


def lab_dir() -> Path:
    """Runtime state (sockets, pidfiles, keys, logs); short because unix socket paths are limited."""
    return Path(os.environ.get("LAB_DIR", DEFAULT_LAB_DIR))


def ssh_port() -> int:
    """The port every node's sshd listens on (each on its own address)."""
    text = os.environ.get("LAB_SSH_PORT", str(SSH_PORT))
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise LabError(f"lab: LAB_SSH_PORT={text!r} is not a port number")
    return int(text)


def door_port() -> int:
    """The port of a jump node's second door (the one whose sessions see the fabric namespace)."""
    return ssh_port() + 1


def data_dir() -> Path:
    """Docker data roots; must be a real filesystem (overlay2 cannot sit on overlay)."""
    return Path(os.environ.get("LAB_DATA_DIR", "/var/lib/qwen35-lab"))


def cache_dir() -> Path:
    """Slow-to-make things (trixie engine, Debian rootfs) that survive clean clones."""
    base = os.environ.get("QWEN35_CACHE") or "~/.cache/qwen35-spark"
    return Path(base).expanduser() / "lab"


def relocated(text: str) -> str:
    """A committed lab stack file's text (Pulumi.lab.yaml, engine/real_vllm.yaml: the nodes' sockets,
    keys and caches under the default LAB_DIR) for this lab: a private lab's LAB_DIR in their place."""
    return text.replace(f"{DEFAULT_LAB_DIR}/", f"{lab_dir()}/")


# How long a process waits for another that is making the same cached thing (a 3 GB download, a
# debootstrap) before it says so: longer than the slowest such step has taken on a fresh machine.
CACHE_LOCK_DEADLINE_S = 2400.0


@contextlib.contextmanager
def file_lock(path: Path, deadline_s: float, held: str) -> Iterator[None]:
    """Hold an exclusive lock on `path`, waiting at most `deadline_s` for another process; past it a
    LabError says `held` (what the holder is doing, and what to do)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as handle:
        deadline = time.monotonic() + deadline_s
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise LabError(f"lab: another process held {path} for {deadline_s:.0f}s {held}") from None
                time.sleep(0.2)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def cache_lock(name: str, deadline_s: float = CACHE_LOCK_DEADLINE_S) -> AbstractContextManager[None]:
    """Hold `<cache>/locks/<name>.lock` while making a cached thing: `make test` fetches the lab's
    downloads beside the lab tier, which may ask for the same ones; the second waits for the first and
    then finds it made."""
    held = (
        f"while making {name}: if none runs now (`ps -ef | grep -e lab -e pytest`), remove the file and"
        " run again"
    )
    return file_lock(cache_dir() / "locks" / f"{name}.lock", deadline_s, held)


@dataclass(frozen=True)
class NodePaths:
    """Every file one node's dockerd and sshd use."""

    root: Path
    data_root: Path

    @property
    def home(self) -> Path:
        """The node's home directory (HOME of its SSH sessions)."""
        return self.root / "home"

    @property
    def exec_root(self) -> Path:
        return self.root / "exec"

    @property
    def socket(self) -> Path:
        return self.root / "docker.sock"

    @property
    def docker_pid(self) -> Path:
        return self.root / "docker.pid"

    @property
    def docker_log(self) -> Path:
        return self.root / "dockerd.log"

    @property
    def daemon_json(self) -> Path:
        return self.root / "daemon.json"

    @property
    def sshd_config(self) -> Path:
        return self.root / "sshd_config"

    @property
    def sshd_pid(self) -> Path:
        return self.root / "sshd.pid"

    @property
    def sshd_log(self) -> Path:
        return self.root / "sshd.log"

    @property
    def host_key(self) -> Path:
        return self.root / "ssh_host_ed25519_key"

    @property
    def netns(self) -> Path:
        """A node behind a jump: its network namespace (an nsfs bind mount)."""
        return self.root / "netns"

    @property
    def door_config(self) -> Path:
        """A node behind a jump: the sshd config of the jump's door into this node's namespace."""
        return self.root / "door_sshd_config"

    @property
    def door_pid(self) -> Path:
        return self.root / "door.pid"

    @property
    def door_log(self) -> Path:
        return self.root / "door.log"


@dataclass(frozen=True)
class SshPaths:
    """The lab's one client key pair and the known_hosts file pinning every node's host key."""

    root: Path

    @property
    def identity_file(self) -> Path:
        return self.root / "id_ed25519"

    @property
    def authorized_keys(self) -> Path:
        return self.root / "authorized_keys"

    @property
    def known_hosts(self) -> Path:
        return self.root / "known_hosts"


def node_paths(name: str) -> NodePaths:
    return NodePaths(root=lab_dir() / name, data_root=data_dir() / name)


def ssh_paths() -> SshPaths:
    return SshPaths(root=lab_dir() / "ssh")


def select_specs(names: list[str] | tuple[str, ...] | None) -> tuple[NodeSpec, ...]:
    """The specs for `names` (all when None), in lab order; unknown names get a "did you mean"."""
    if names is None:
        return NODE_SPECS
    wanted = set(names)
    for name in wanted:
        if name not in NODE_NAMES:
            close = difflib.get_close_matches(name, NODE_NAMES, n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise LabError(f"lab: unknown node {name!r}{hint}; nodes are {', '.join(NODE_NAMES)}")
    return tuple(spec for spec in NODE_SPECS if spec.name in wanted)


def with_jumps(names: list[str] | tuple[str, ...]) -> list[str]:
    """`names` plus the jump node of every node behind one (a node behind a jump needs its jump up)."""
    wanted = set(names)
    wanted |= {spec.jump for spec in select_specs(list(names)) if spec.jump}
    return [spec.name for spec in NODE_SPECS if spec.name in wanted]


def known_hosts_line(host: str, port: int, public_key: str) -> str:
    """One known_hosts entry; a non-22 port needs the bracketed form."""
    key_type, key_body = public_key.split()[:2]
    address = host if port == 22 else f"[{host}]:{port}"
    return f"{address} {key_type} {key_body}"
