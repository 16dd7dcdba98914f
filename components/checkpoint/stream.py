"""Source → destination stream of checkpoint files, run on the source over SSH.

This is the seam to the shared node-to-node transfer layer (`components/transfer`, being built on the
`nodeimage` branch): until it lands here, this module runs the simplest correct pipeline —
`send | ssh <destination fabric address> receive` on the source, `pipefail`, every stage's exit status
reported — with the SSH options of `components.remote.ssh_options` (host keys pinned, keepalives).
What it lacks against that layer: a stall watchdog (a dead link is still caught by SSH keepalives,
~45 s), the byte-counting progress file, and shared SSH masters.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from components.remote import (
    SSH_TRANSPORT_FAILURE,
    RemoteError,
    SshTarget,
    SshTransport,
    bash_argv,
    shell_join,
    ssh_argv,
    stderr_tail,
)

STATUS_MARKER = "qwen35-pipestatus"


@dataclass(frozen=True)
class StreamResult:
    send_status: int | None
    receive_status: int | None
    returncode: int
    stdout: str
    stderr: str

    @property
    def transport_failed(self) -> bool:
        return self.returncode == SSH_TRANSPORT_FAILURE and self.send_status is None


def pipeline_argv(send: Sequence[str], receive: Sequence[str], peer: SshTarget) -> list[str]:
    """The command run on the source: `send | ssh peer receive`, then each stage's exit status."""
    script = (
        f"{shell_join(list(send))} | {shell_join(ssh_argv(peer, list(receive)))}; "
        f'echo "{STATUS_MARKER} ${{PIPESTATUS[0]}} ${{PIPESTATUS[1]}}" >&2'
    )
    return bash_argv(script, pipefail=True)


def parse_statuses(stderr: str) -> tuple[int | None, int | None, str]:
    send = receive = None
    other = []
    for line in stderr.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == STATUS_MARKER and parts[1].isdigit() and parts[2].isdigit():
            send, receive = int(parts[1]), int(parts[2])
        else:
            other.append(line)
    return send, receive, "\n".join(other)


def run_stream(
    source: SshTarget, peer: SshTarget, send: Sequence[str], receive: Sequence[str], deadline_s: float
) -> StreamResult:
    """Run the pipeline on `source`; the receiving program's report is on stdout."""
    try:
        done = SshTransport(source).run(pipeline_argv(send, receive, peer), timeout=deadline_s)
    except RemoteError as exc:
        return StreamResult(None, None, exc.returncode, "", f"{exc}")
    send_status, receive_status, other = parse_statuses(done.err)
    return StreamResult(send_status, receive_status, done.returncode, done.text, stderr_tail(other, 8))
