"""The source's own SSH connection to the destination over the fabric.

A control master on the source node, its socket in a private folder there (0700, ours). With a
`Forward` (the destination's end already listening, started by the orchestrator: `DestinationEnd`),
the master is made with a stream-local forward (`-L <folder>/f:<the end's socket>`) and carries no
session at all: the stream goes through the forward into a consumer already running. Without one, the
source's
session (`transfer_source serve`) starts it while the source is still being inspected, in one step
with the destination's end (`sink_argv`: its ssh, `ControlMaster=auto` in a folder just made,
becomes the master); a retry, or a transfer without an early end, connects first (`connect`) and then
runs over the master. A run waits for the connection, and ends the master when done, as does the
session's end when nothing was sent. `close_argv` ends it should the session itself have died.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass

from components.errors import Qwen35Error
from components.node_programs import program_argv
from components.node_programs.transfer_source import Exit
from components.remote import SshTarget, ssh_argv, ssh_command, ssh_options, stderr_tail
from components.transfer.endpoints import Endpoint

# The interpreter that runs the source's ssh dialer (`tcp_dial`): the node's, as every node program's.
NODE_PYTHON = "python3"


class PeerUnreachable(Qwen35Error, RuntimeError):
    """The source could not connect to the destination: nothing was sent."""


@dataclass(frozen=True)
class Forward:
    """Where the destination's end listens (`transfer_sink listen`) and the token it expects."""

    socket: str
    token: str


@dataclass
class Peer:
    """The source's connection to the destination (`target`), its master's socket under `folder`;
    with `forward`, the master also forwards `<folder>/f` to the destination's end."""

    target: SshTarget
    folder: str
    closed: bool = False  # a transfer's run ended the master (or will, detached)
    forward: Forward | None = None

    @classmethod
    def new(cls, target: SshTarget, forward: Forward | None = None) -> Peer:
        return cls(target, f"/tmp/qni-{secrets.token_hex(6)}", forward=forward)

    @property
    def control_path(self) -> str:
        return f"{self.folder}/m"

    def argv(self, argv: list[str]) -> list[str]:
        """`argv` run on the destination from the source, over the master (a new connection should it
        be gone, through the dialer run by the node's python3)."""
        return ssh_argv(self.target, argv, self.control_path, dial_with=NODE_PYTHON)

    def spec(self) -> dict:
        """What `transfer_source` needs to make, check and end the master (every ssh argv ready-made)."""
        control = ["ssh", "-F", "/dev/null", "-o", f"ControlPath={self.control_path}"]
        forward = (
            # (StreamLocalBindUnlink: a socket left in the folder by an earlier attempt's master)
            [
                "-o",
                "ExitOnForwardFailure=yes",
                "-o",
                "StreamLocalBindUnlink=yes",
                "-L",
                f"{self.folder}/f:{self.forward.socket}",
            ]
            if self.forward
            else []
        )
        spec = {
            "folder": self.folder,
            "control": self.control_path,
            "connect_timeout": self.target.connect_timeout,
            "check": [*control, "-O", "check", "x"],
            "exit": [*control, "-O", "exit", "x"],
            "connect": [
                *ssh_command(NODE_PYTHON),
                # First value wins in ssh: this overrides the ControlMaster=auto of ssh_options.
                "-o",
                "ControlMaster=yes",
                *ssh_options(self.target, self.control_path, dial_with=NODE_PYTHON),
                *forward,
                "-f",
                "-N",
                self.target.destination,
            ],  # fmt: skip
        }
        if self.forward:
            spec["forward"] = {"local": f"{self.folder}/f", "token": self.forward.token}
        return spec

    def sink_argv(self, python: str = "python3") -> list[str]:
        """The destination's end, opened early over the master: it learns its consumer from the stream."""
        return self.argv(program_argv("transfer_sink", [], python))

    def close_argv(self, python: str = "python3") -> list[str]:
        """End the master and remove its folder (run on the source)."""
        return program_argv("transfer_source", ["close", json.dumps({"peer": self.spec()})], python)


def peer_unreachable(
    source: Endpoint, destination: Endpoint, peer: Peer, status: int, stderr: str
) -> PeerUnreachable:
    """The error for a transfer whose first step, the source's SSH connection to the destination,
    failed: nothing was sent."""
    target = peer.target
    where = f"{target.user}@{target.host}:{target.port}"
    tail = stderr_tail(stderr, 4)
    if status == Exit.PEER_FOLDER:
        return PeerUnreachable(
            f"source {source.label}: could not make the private folder {peer.folder} for the SSH "
            f"connection to {destination.label}; nothing was sent:\n  stderr: {tail}\n"
            f"  next: check /tmp on {source.label} (free space, permissions) and run again"
        )
    return PeerUnreachable(
        f"source {source.label} cannot SSH to destination {destination.label} at {where} (exit {status}); "
        f"nothing was sent:\n  stderr: {tail}\n"
        f"  next: on {source.label}, make `ssh -p {target.port} {target.user}@{target.host}` work "
        "unattended: "
        f"key {target.identity_file or '(default)'} authorized on {destination.label}, host key for "
        f"{target.host} in {target.known_hosts} (or set tuning peer_identity_file / peer_known_hosts)"
    )
