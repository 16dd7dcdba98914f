"""Running commands on lab nodes over real SSH, the way the program reaches a Spark."""

from __future__ import annotations

import shlex
import subprocess
from dataclasses import dataclass
from typing import IO

from lab.layout import LabError, LabNode

SSH_TRANSPORT_FAILURE = 255


def ssh_options(node: LabNode) -> list[str]:
    """OpenSSH client options for a lab node, each with its reason."""
    return [
        "-F", "/dev/null",  # ignore the operator's ~/.ssh/config
        "-i", node.identity_file,
        "-p", str(node.port),
        "-o", "IdentitiesOnly=yes",  # only the lab key, not whatever an agent holds
        "-o", "BatchMode=yes",  # never prompt: a test must fail, not hang
        "-o", "StrictHostKeyChecking=yes",  # host keys are pinned in known_hosts
        "-o", f"UserKnownHostsFile={node.known_hosts}",
        "-o", "GlobalKnownHostsFile=/dev/null",
        "-o", "ConnectTimeout=5",  # a dead node fails fast
        "-o", "ServerAliveInterval=5",  # a stalled stream fails in ~15 s instead of hanging
        "-o", "ServerAliveCountMax=3",
        "-o", "LogLevel=ERROR",
    ]  # fmt: skip


def remote_command(argv: list[str] | tuple[str, ...]) -> str:
    """The one place an argument list becomes a shell string."""
    return shlex.join(argv)


def ssh_argv(node: LabNode, argv: list[str] | tuple[str, ...]) -> list[str]:
    """Local argv that runs `argv` on `node` over SSH."""
    return ["ssh", *ssh_options(node), node.target, "--", remote_command(argv)]


def pipeline(*stages: list[str] | tuple[str, ...]) -> list[str]:
    """One argv running `stages` as a shell pipeline that fails when any stage fails."""
    return ["bash", "-o", "pipefail", "-c", " | ".join(remote_command(stage) for stage in stages)]


@dataclass(frozen=True)
class Result:
    """What a command did."""

    argv: tuple[str, ...]
    returncode: int
    stdout: bytes
    stderr: bytes

    @property
    def out(self) -> str:
        return self.stdout.decode(errors="replace").strip()

    @property
    def err(self) -> str:
        return self.stderr.decode(errors="replace").strip()


def run(
    argv: list[str],
    *,
    input: bytes | None = None,
    stdin: IO[bytes] | None = None,
    timeout: float = 300.0,
    check: bool = True,
    where: str = "local",
) -> Result:
    """Run argv; with check, a failure raises LabError naming where and the last stderr lines."""
    try:
        done = subprocess.run(
            argv,
            input=input,
            stdin=stdin if input is None else None,
            capture_output=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired as exc:
        raise LabError(f"lab: {where}: command timed out after {timeout:.0f}s: {argv[-1][:200]}") from exc
    result = Result(tuple(argv), done.returncode, done.stdout, done.stderr)
    if check and result.returncode != 0:
        kind = "ssh transport failed" if result.returncode == SSH_TRANSPORT_FAILURE else "command failed"
        tail = "\n".join(result.err.splitlines()[-8:])
        raise LabError(f"lab: {where}: {kind} (exit {result.returncode}): {argv[-1][:200]}\n{tail}")
    return result


def on_node(
    node: LabNode,
    argv: list[str] | tuple[str, ...],
    *,
    input: bytes | None = None,
    stdin: IO[bytes] | None = None,
    timeout: float = 300.0,
    check: bool = True,
) -> Result:
    """Run argv on the node over SSH."""
    return run(ssh_argv(node, argv), input=input, stdin=stdin, timeout=timeout, check=check, where=node.name)


def docker(
    node: LabNode,
    *args: str,
    input: bytes | None = None,
    stdin: IO[bytes] | None = None,
    timeout: float = 300.0,
    check: bool = True,
) -> Result:
    """`docker ARGS` on the node over SSH (its sshd points DOCKER_HOST at the node's daemon)."""
    return on_node(node, ["docker", *args], input=input, stdin=stdin, timeout=timeout, check=check)
