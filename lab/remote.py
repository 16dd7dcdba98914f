"""Running commands on lab nodes over real SSH, the way the program reaches a Spark."""

from __future__ import annotations

from typing import IO

from components.remote import (
    SSH_TRANSPORT_FAILURE,
    RemoteError,
    Result,
    SshTarget,
    SshTransport,
    bash_argv,
    shell_join,
)
from components.remote import ssh_argv as program_ssh_argv
from components.remote import ssh_options as program_ssh_options
from lab.layout import LabError, LabNode


def ssh_target(node: LabNode) -> SshTarget:
    """The lab node as the program's transport sees a Spark: same options, same pinned keys."""
    return SshTarget(
        host=node.host,
        user=node.user,
        port=node.port,
        known_hosts=node.known_hosts,
        identity_file=node.identity_file,
        proxy_jump=node.proxy_jump,  # node-e: through node-a's door, checked against the same known_hosts
        name=node.name,
        connect_timeout=5,  # loopback: a dead node fails fast
    )


def ssh_options(node: LabNode) -> list[str]:
    """OpenSSH client options for a lab node: the program's own (components.remote.ssh_options)."""
    return program_ssh_options(ssh_target(node))


def remote_command(argv: list[str] | tuple[str, ...]) -> str:
    """An argument list as a shell string, through the program's one quoting function."""
    return shell_join(list(argv))


def ssh_argv(node: LabNode, argv: list[str] | tuple[str, ...]) -> list[str]:
    """Local argv that runs `argv` on `node` over SSH."""
    return program_ssh_argv(ssh_target(node), list(argv))


def pipeline(*stages: list[str] | tuple[str, ...]) -> list[str]:
    """One argv running `stages` as a shell pipeline that fails when any stage fails."""
    return bash_argv(" | ".join(remote_command(stage) for stage in stages), pipefail=True)


def on_node(
    node: LabNode,
    argv: list[str] | tuple[str, ...],
    *,
    input: bytes | None = None,
    stdin: IO[bytes] | None = None,
    timeout: float = 300.0,
    check: bool = True,
) -> Result:
    """Run argv on the node over SSH, with the program's own transport; with check, a failure raises
    LabError naming the node and the last stderr lines."""
    try:
        result = SshTransport(ssh_target(node)).run(
            list(argv), stdin=input if input is not None else stdin, timeout=timeout
        )
    except RemoteError as exc:  # timed out, or no ssh on this machine
        raise LabError(f"lab: {node.name}: {exc}") from exc
    if check and result.returncode != 0:
        kind = "ssh transport failed" if result.returncode == SSH_TRANSPORT_FAILURE else "command failed"
        tail = "\n".join(result.err.splitlines()[-8:])
        command = shell_join(list(argv))[:200]
        raise LabError(f"lab: {node.name}: {kind} (exit {result.returncode}): {command}\n{tail}")
    return result


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
