"""Node-to-node transfers over the fabric, knowing nothing of what is sent (images, checkpoints…).

What a caller provides:
- the two nodes as `Endpoint`s (how the orchestrator reaches each; the destination's fabric address);
- a `Transfer`: producer `Stage`s, argument lists run on the SOURCE whose output is the stream (the
  first reads nothing, each next one reads the previous one's output); a consumer `Stage` run on the
  DESTINATION that reads the stream on stdin and prints one JSON line on stdout (its report); the
  byte total, for progress; an operation name (`[A-Za-z0-9_.-]`, the progress file's name);
- the copy tuning (`Tuning`, the one definition: `components.config.CopyConfig`; `tuning_from`
  validates a resource's `tuning` input).

What it does: over the orchestrator's SSH master to the source (`ssh_sessions`: the operation's first
command to a node makes it), a `SourceSession` (one SSH session on the source for the whole
operation) starts the source's own connection to the destination (`Peer`: pinned keys) together with
the destination's end of the stream (one ssh that becomes the connection's master and runs the end),
while it runs the caller's inspection of the source (`before`); the caller decides,
then `SourceSession.transfer` runs `producers | watch | ssh destination consumer` in that same
session, or `close` ends it unused (`run_transfer` does the transfer alone, in a session of its
own). With a `DestinationEnd` (the orchestrator's own session to the destination: it runs the
caller's inspection of the destination, listens on a socket in a private folder, starts the consumer
when `SourceSession.transfer(…, end=…)` names it, and serves one connection), the source's `Peer`
carries a `Forward` instead: its master forwards a local socket to that end (`-L`), the stream goes
through it into a consumer already running, and the source's connection opens no session on the
destination; where the destination's sshd refuses the forward, the consumer runs over the master as
without one. The watch counts bytes, ends the whole pipeline when no byte moved for `stall_timeout_s`
or `deadline_s` passed, and keeps `$HOME/.qwen35/progress/<operation>.json` on the source up to
date (at most once a second; removed at the end). The orchestrator keeps a backstop for a source
that stops answering (`run_watched`: the stall limit plus `BACKSTOP_MARGIN_S`).

The conversation, told here once (the modules and the node programs point here):

    orchestrator (`ends`, `pipeline`) transfer_source (source node)      transfer_sink (destination)
    --------------------------------- ------------------------------     ----------------------------
    starts `transfer_sink listen`     ----------------------------->     listens on a private socket,
      with SPEC.token                                                      inspects, prints one JSON line
    starts `transfer_source serve`    connects (SSH master, `-L` to
                                      the sink's socket)
    {"consumer": ARGV} to sink        ----------------------------->     starts the consumer
    {"run": RUN} to source            connection 1: `NUDGE\\n`  ---->     held open, never answered
                                      connection 2: `<token>\\n` --->     `+` once the consumer runs
                                                                           (`-`: not served)
                                      stream, half-closed at its end ->  copied to the consumer
                                                         <-------        outcome line: {"status",
                                                                           "stdout", "stderr": last
                                                                           TAIL_LINES lines}
                                      one JSON report on stdout
    reads the report; stderr lines
      `PROGRESS_MARKER <bytes> [<total>]` feed its stall watch
      and the operator's progress

The names in capitals are `components/node_programs/wire.py`'s. The nudge is a throwaway first
channel: the destination's sshd delays the first channel of a fresh connection ~40 ms (Nagle against
a delayed ACK); the nudge takes that wait. An end that does not answer `+` gets no byte: the source
then runs the consumer in a session of its own over the master. Without a `DestinationEnd`, the
source's session starts the destination's end itself (`transfer_sink` with no arguments: its ssh
becomes the master, and the stream starts with a header naming the consumer, which it then becomes).
The source copies the last producer's output to the consumer itself, so it counts every byte; the
stall limit holds while streaming only, not once every byte is sent and the consumer is finishing.
A stage that has its own one-line JSON report writes it to stderr as `REPORT_MARKER {...}` (stdout
is the stream); the source keeps it, and every stage's stderr tail (TAIL_LINES), in its report.
Where the source's connection to the destination fails, or the sink's end closes without an outcome
line, the status is ssh's own SSH_TRANSPORT_FAILURE: a transport failure, never the remote command's.

What it gets back: a `TransferResult`: every stage's exit status and stderr tail (and a stage's own
`qwen35-report {json}` stderr line), the bytes sent, the consumer's JSON report, and the failure
classified (`Failure.NONE / PEER / TRANSPORT / STAGE`); `TransferResult.error()` words it for people
with both nodes named. A source that cannot reach the destination raises `PeerUnreachable` (nothing
was sent). Verification before anything is named final is the consumer's job.

The modules: `values` (what a caller gives and gets back), `endpoints` (whom each end reaches, as
values), `tuning`, `peer` (the
source's connection to the destination), `pipeline` (one run, and its report read), `watch` (the
orchestrator's watch and backstop), `ends` (the two ends' sessions), `sessions` (the operation's SSH
masters), `timing`. On the nodes (`components/node_programs/`): `transfer_source.py` (the connection),
its library `watched_pipeline.py` (the pipeline), `transfer_sink.py` (the destination's end) and
`wire.py` (what both sides share).
"""

from components.transfer.endpoints import Endpoint, EndpointError, peer_target
from components.transfer.ends import DestinationEnd, SourceSession
from components.transfer.peer import Forward, Peer, PeerUnreachable, peer_unreachable
from components.transfer.pipeline import interpret, run_transfer
from components.transfer.sessions import ssh_sessions
from components.transfer.timing import TIMING_ENV, PhaseTimes
from components.transfer.tuning import GIB, Tuning, TuningError, tuning_from
from components.transfer.values import Failure, Stage, StageOutcome, Transfer, TransferResult
from components.transfer.watch import BACKSTOP_MARGIN_S, run_watched

__all__ = [
    "BACKSTOP_MARGIN_S",
    "GIB",
    "DestinationEnd",
    "TIMING_ENV",
    "Endpoint",
    "EndpointError",
    "Failure",
    "Forward",
    "Peer",
    "PeerUnreachable",
    "PhaseTimes",
    "SourceSession",
    "Stage",
    "StageOutcome",
    "Transfer",
    "TransferResult",
    "Tuning",
    "TuningError",
    "interpret",
    "peer_target",
    "peer_unreachable",
    "run_transfer",
    "run_watched",
    "ssh_sessions",
    "tuning_from",
]
