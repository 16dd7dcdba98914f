"""The NodeImage's I/O, as every node resource names it: `ensure` (create: gather both nodes' facts,
`plan`, then skip, retag or copy through the transfer layer), `observe` (refresh) and `release`
(delete: give up the hold on the tag). Argv come from `programs.py`, decisions from `plan.py`."""

from __future__ import annotations

import contextlib
import dataclasses
import secrets
import signal
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from components import transfer
from components.node_image.docker_on import DockerOn
from components.node_image.errors import ExportFailed, Mismatch, NodeImageError
from components.node_image.facts import Daemon, Facts, ImageInfo, facts_stderr, parse_facts, parse_images
from components.node_image.inputs import inputs, keep_previous, parse
from components.node_image.plan import Copy, Retag, Skip, plan
from components.node_image.programs import (
    export_spec,
    facts_argv,
    filter_argv,
    filter_spec,
    load_argv,
    save_argv,
    temporary_tag,
)
from components.node_programs.image_tag import Exit as TagExit
from components.provider_kit.progress import tell_operator
from components.remote import SSH_TRANSPORT_FAILURE, RemoteError, Result, SshTarget, with_retries
from components.transfer import PhaseTimes, Tuning, peer_target, ssh_sessions


class Peers:
    """The source's connections to the destination, a fresh one (its own private folder) for every
    attempt: a previous attempt's detached close may still remove its folder and end its master. The
    source session's connections forward to the destination's end (`forward`); a later attempt's
    runs the consumer in a session of its own."""

    def __init__(self, target: SshTarget, forward: transfer.Forward | None = None):
        self.target, self.forward = target, forward
        self.made: list[transfer.Peer] = []

    def new(self, forwarded: bool = False) -> transfer.Peer:
        peer = transfer.Peer.new(self.target, self.forward if forwarded else None)
        self.made.append(peer)
        return peer

    def unclosed(self) -> list[transfer.Peer]:
        return [peer for peer in self.made if not peer.closed]


@dataclass(frozen=True)
class CopyJob:
    """One NodeImage operation once both nodes are inspected: what every step after the plan needs."""

    image: str
    src: DockerOn
    dst: DockerOn
    at_source: Facts
    at_destination: Facts
    peers: Peers | None  # None: source and destination are one node
    end: transfer.DestinationEnd | None  # the destination's end, listening (None: one node)
    tuning: Tuning
    claim: str  # this resource's claim on the tag, should it place or share it
    times: PhaseTimes


def ensure(props: Mapping[str, Any], olds: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """create(): make `image` present and verified on the destination; the outputs."""
    times = PhaseTimes(f"NodeImage {props.get('image')}")
    try:
        with ssh_sessions(times) as control:
            return _ensure(props, control, times)
    finally:
        times.report()


def _ensure(props: Mapping[str, Any], control: Callable[[str], str], times: PhaseTimes) -> dict[str, Any]:
    image, source, destination, tuning = parse(props)
    same_node = source.key == destination.key
    src = DockerOn(source, "source", control("s"))
    dst = src if same_node else DockerOn(destination, "destination", control("d"))
    pool = ThreadPoolExecutor(max_workers=4)
    # One connection per node: each node's first command makes it (ControlMaster=auto) and every
    # command after it rides on it. Nothing waits for a connection of its own first: both nodes'
    # sessions start at once. The destination's inspects it and then listens (the destination's end
    # of a copy); the source's inspects it and meanwhile connects to the destination, forwarding to
    # that end: no session on the destination from the source, no login shell on the copy's path.
    end = peers = src_facts = None
    session: transfer.SourceSession | None = None
    try:
        if not same_node:
            end = transfer.DestinationEnd(
                destination,
                facts_argv(image, inventory=True, python=True),
                dst.transport.control_path,
                times=times,
                deadline_s=tuning.deadline_s + transfer.BACKSTOP_MARGIN_S,  # not before the source's
            )
            peers = Peers(peer_target(destination, tuning), end.forward)
        if same_node:
            src_facts = pool.submit(times.timed("source facts", src.facts), image, python=True)
        else:
            src_facts = pool.submit(times.timed("source facts", source_session), src, peers, image, times)
        dst_facts = (
            src_facts
            if same_node
            else pool.submit(times.timed("destination facts", destination_facts), dst, end, image)
        )
        with times.span("wait for facts"):
            if same_node:
                at_source = at_destination = src_facts.result()
            else:
                session, at_source = src_facts.result()
                at_destination = dst_facts.result()
        decided = plan(at_source, at_destination, tuning)
        job = CopyJob(
            image, src, dst, at_source, at_destination, peers, end, tuning, secrets.token_hex(8), times
        )
        return carry_out(decided, props, job, session)
    finally:
        pool.shutdown(wait=True)
        if session is None and src_facts is not None and not same_node and src_facts.exception() is None:
            session = src_facts.result()[0]
        if session is not None:
            with times.span("end source session"):
                session.close()
        if end is not None:
            with times.span("end destination session"):
                end.close()
        for peer in peers.unclosed() if peers is not None else []:  # a session died before ending it
            with times.span("close peer master"), contextlib.suppress(RemoteError):
                # One attempt: a source that cannot be reached must not hold up the error being raised;
                # an abandoned master ends by itself.
                src.transport.run(peer.close_argv(), timeout=15)


def destination_facts(dst: DockerOn, end: transfer.DestinationEnd, image: str) -> Facts:
    """The destination's facts from its end's session; should that session fail to start, the
    ordinary inspection (with its retries) instead, and no end listens."""
    status, out, err = end.before()
    if status == SSH_TRANSPORT_FAILURE:
        return dst.facts(image, inventory=True, python=True)
    if status != 0:
        raise dst.facts_failed(status, facts_stderr(out, err))
    return parse_facts(dst.node, image, out, history=False, inventory=True, python=True)


def source_session(
    src: DockerOn, peers: Peers, image: str, times: PhaseTimes
) -> tuple[transfer.SourceSession, Facts]:
    """The source's session and its facts; a session that could not reach the node is retried with
    backoff for up to 20 s (transport failures only), each attempt with a connection of its own."""
    argv = facts_argv(image, history=True, python=True)
    attempt = _SessionAttempt(src, peers, argv, times)
    result = with_retries(attempt.open, deadline_s=20.0, first_delay_s=1.0, max_delay_s=10.0)
    if result.returncode != 0:
        raise src.facts_failed(result.returncode, facts_stderr(result.text, result.stderr.decode()))
    facts = parse_facts(src.node, image, result.text, history=True, inventory=False, python=True)
    return attempt.session, facts


@dataclass
class _SessionAttempt:
    """One try at the source's session for `with_retries`: the session that answered, once one has."""

    src: DockerOn
    peers: Peers
    argv: list[str]
    times: PhaseTimes
    session: transfer.SourceSession | None = None

    def open(self) -> Result:
        session = transfer.SourceSession(
            self.src.node, self.peers.new(forwarded=True), self.argv, self.src.transport.control_path,
            times=self.times,
        )  # fmt: skip
        status, out, err = session.before()
        if status == 0:
            self.session = session
        else:
            session.close()
        return Result(tuple(self.argv), status, out.encode(), err.encode(), self.src.node.label)


def carry_out(
    decided: Skip | Retag | Copy,
    props: Mapping[str, Any],
    job: CopyJob,
    session: transfer.SourceSession | None,
) -> dict[str, Any]:
    """The outputs after doing what the plan says."""
    base = _base_outputs(props, job)
    _warn_blobs_unlisted(job)
    if isinstance(decided, Skip):
        shared = _share_tag(job, session) if decided.tag_was_there else {}
        return _outputs(base, decided.image, decided.daemon, job.times, **shared)
    if isinstance(decided, Retag):
        return _outputs(base, decided.image, decided.daemon, job.times, **_retag(decided, job, session))
    report = copy_image(decided, job, session)
    return _outputs(base, report["image"], job.at_destination.daemon, job.times, **_copied(report, job.claim))


def _base_outputs(props: Mapping[str, Any], job: CopyJob) -> dict[str, Any]:
    """The outputs of a NodeImage that sent nothing, before the image it verified is known."""
    return {
        **inputs(props),
        "destination_label": job.dst.node.label,
        "source_image_id": job.at_source.image.image_id,
        "source_store": job.at_source.daemon.store,
        "bytes_sent": 0,
        "layer_bytes_sent": 0,
        "layers_sent": 0,
        "layers_left_out": 0,
        "skipped": True,
        "retagged": False,
        "placed_tag": False,
        "holds_tag": False,
        "claim": "",
        "layout": "",
        # False: the destination's containerd content store could not be read, every layer is sent
        "blobs_listed": not job.at_destination.blobs_unlisted,
    }


def _warn_blobs_unlisted(job: CopyJob) -> None:
    """Tell the operator why no layer is left out when the content store could not be read."""
    unlisted = job.at_destination.blobs_unlisted
    if unlisted:
        tell_operator(
            f"NodeImage {job.image}: {job.dst.node.label}'s containerd content store could not be read "
            f"({'; '.join(unlisted)}): no layer is left out; thin copies need the "
            f"SSH user to read the content store"
        )


def _outputs(
    base: dict[str, Any], info: ImageInfo, daemon: Daemon, times: PhaseTimes, **extra: Any
) -> dict[str, Any]:
    """The outputs once `info` is verified on the destination; `extra` what the step changed."""
    return {
        **base,
        "image_id": info.image_id,
        "layers": list(info.layers),
        "store": daemon.store,
        "engine": daemon.version,
        **extra,
        # What delete() may untag: the image this resource tagged, never one refresh saw later.
        "placed_image_id": info.image_id if extra.get("placed_tag") else "",
        # What refresh compares against: the image verified on the destination.
        "verified_image_id": info.image_id,
        "seconds": round(time.monotonic() - times.started, 3),
    }


def _share_tag(job: CopyJob, session: transfer.SourceSession | None) -> dict[str, Any]:
    """The tag was there: when a NodeImage placed it (this resource's predecessor in a replacement),
    share it, so the predecessor's delete leaves it in place. The source's session, unused, ends
    meanwhile."""
    ending = _end_meanwhile(session, job.times)
    with job.times.span("join tag holders"):
        joined = job.dst.tags(
            "join", {"ref": job.image, "claim": job.claim}, job.at_destination.python, job.end
        )
    ending.join()
    held = bool(joined.get("joined"))
    # Waiting: no holder recorded (by hand, or a resource from before the records placed it): the
    # claim is kept so that such a predecessor's delete can hand the tag over (image_tag leave).
    waits = bool(joined.get("waiting"))
    return {"holds_tag": held, "claim": job.claim if held or waits else ""}


def _retag(decided: Retag, job: CopyJob, session: transfer.SourceSession | None) -> dict[str, Any]:
    """Point the tag at the image the destination already holds; the source's session ends meanwhile."""
    ending = _end_meanwhile(session, job.times)
    with job.times.span("retag"):
        job.dst.tags(
            "retag",
            {"ref": job.image, "image_id": decided.image.image_id, "claim": job.claim},
            job.at_destination.python,
            job.end,
        )
    ending.join()
    return {"retagged": True, "placed_tag": True, "holds_tag": True, "claim": job.claim}


def _copied(report: dict, claim: str) -> dict[str, Any]:
    """What a copy changed in the outputs, from the transfer's report."""
    summary = report["summary"] or {}
    return {
        "skipped": False,
        "placed_tag": True,
        "holds_tag": True,
        "claim": claim,
        "bytes_sent": int(report["bytes"]),
        "layer_bytes_sent": int(summary.get("layer_bytes", 0)),
        "layers_sent": int(summary.get("layers_sent", 0)),
        "layers_left_out": int(summary.get("layers_left_out", 0)),
        "layout": str(summary.get("layout", "")),
    }


def _end_meanwhile(session: transfer.SourceSession | None, times: PhaseTimes) -> threading.Thread:
    """End the source's session (nothing to send) in a thread, while the destination is told."""
    ending = threading.Thread(target=times.timed("end source session", session.close) if session else None)
    ending.start()
    return ending


def copy_image(decided: Copy, job: CopyJob, session: transfer.SourceSession | None) -> dict:
    """Copy as planned: from the layer store when the plan says so (falling back to `docker save`
    when the store cannot be read), verify, promote; the transfer's report. The first attempt runs in
    the source's open session; a second one (a fallback) in a session, and over a connection to the
    destination, of its own."""
    image, src, dst, at_source, times = job.image, job.src, job.dst, job.at_source, job.times
    wanted = at_source.image
    sessions = [session] if session is not None else []
    tmp_tag = temporary_tag(image, secrets.token_hex(4))

    def stream(export: dict | None, how: Copy = decided) -> dict:
        attempt = sessions.pop() if sessions else None
        peer = attempt.peer if attempt is not None and attempt.peer is not None else job.peers.new()
        return _stream(how, job, tmp_tag, export, peer, attempt)

    try:
        report = None
        if decided.export:
            export = export_spec(at_source.daemon, wanted.image_id, job.at_destination.daemon.store)
            try:
                with times.span("stream, verify, promote (layer store)"):
                    report = stream(export)
            except ExportFailed:  # the store could not be read, or what it gave did not load: docker save
                dst.untag(tmp_tag)
        if report is None:
            with times.span("stream, verify, promote (docker save)"):
                report = thin_or_whole(decided, stream, dst, tmp_tag)
    except Mismatch as wrong:
        dst.untag(tmp_tag)
        raise NodeImageError(
            f"destination {dst.node.label}: the loaded image does not match the source "
            f"({wrong.loaded.image_id[:19]}, {len(wrong.loaded.layers)} layers; {src.node.label} has "
            f"{wanted.image_id[:19]}, {len(wanted.layers)} layers); the temporary tag was removed; "
            f"next: run again, and if it repeats compare `docker image inspect {image}` on both nodes"
        ) from None
    except BaseException:
        dst.untag(tmp_tag)
        raise
    return report


def thin_or_whole(decided: Copy, stream: Callable[..., dict], dst: DockerOn, tmp_tag: str) -> dict:
    """A containerd destination left some layers out because its content store listed their blobs;
    should the load still fail or not verify (a blob gone between the listing and the load), send
    every layer once more."""
    if not decided.leave_out or decided.keep_from:  # a classic store's chain reuse: no second try
        return stream(None)
    try:
        return stream(None)
    except (Mismatch, NodeImageError) as first:
        if isinstance(first, NodeImageError) and "cannot SSH" in str(first):
            raise
        dst.untag(tmp_tag)
        return stream(None, dataclasses.replace(decided, leave_out=()))


def _stream(
    decided: Copy,
    job: CopyJob,
    tmp_tag: str,
    export: dict | None,
    peer: transfer.Peer,
    session: transfer.SourceSession | None,
) -> dict:
    """One transfer: producers on the source, `image_tag load` on the destination; the filter's
    report plus `image` (the verified image now tagged). Raises Mismatch, ExportFailed or
    NodeImageError."""
    moving = _transfer_of(decided, job, tmp_tag, export)
    return _verified(_run(moving, job, peer, session), job, export)


def _transfer_of(decided: Copy, job: CopyJob, tmp_tag: str, export: dict | None) -> transfer.Transfer:
    """What to run: the layer store's export (`export`) or `docker save` through the filter on the
    source, into `image_tag load` on the destination."""
    image, wanted, tuning = job.image, job.at_source.image, job.tuning
    spec = filter_spec(
        wanted.layers,
        decided.keep_from,
        tmp_tag,
        tuning.compression,
        export=export,
        leave_out=decided.leave_out,
    )
    python = job.at_source.python
    producers = [transfer.Stage("layer export (source)", filter_argv(spec, python))]
    if not export:
        producers = [
            transfer.Stage("docker save (source)", save_argv(image)),
            transfer.Stage("save filter (source)", filter_argv(spec, python)),
        ]
    load = load_argv(tmp_tag, image, wanted, decided.same_store, job.at_destination.python, job.claim)
    return transfer.Transfer(
        operation=f"node-image-{job.dst.node.label}-{secrets.token_hex(3)}",
        producers=tuple(producers),
        consumer=transfer.Stage("docker load (destination)", load),
        bytes_total=decided.bytes_to_send,
    )


def _run(
    moving: transfer.Transfer,
    job: CopyJob,
    peer: transfer.Peer,
    session: transfer.SourceSession | None,
) -> transfer.TransferResult:
    """Run the transfer in the source's open session, else over `peer` in a session of its own."""
    src, destination, tuning = job.src, job.dst.node, job.tuning
    try:
        if session is not None:
            result = session.transfer(
                moving, destination, tuning, end=job.end if peer and peer.forward else None
            )
        else:
            result = transfer.run_transfer(
                moving, src.node, destination, peer, tuning, src.transport.control_path, "python3", job.times
            )
    except transfer.PeerUnreachable as exc:
        raise NodeImageError(str(exc)) from None
    if result.forward.startswith("not used"):  # visible: the destination paid one more session
        tell_operator(
            f"NodeImage {job.image} on {destination.label}: the destination's end was not reached through "
            f"the forward ({result.forward.removeprefix('not used: ')}); the load ran in a session of its "
            f"own (the destination's sshd may refuse stream-local forwarding)"
        )
    return result


def _verified(result: transfer.TransferResult, job: CopyJob, export: dict | None) -> dict:
    """The filter's report, bytes sent and the image the destination verified and tagged; raises
    Mismatch, ExportFailed (the layer store's export failed) or NodeImageError."""
    image, destination = job.image, job.dst.node
    loaded_report = result.consumer_report or {}
    loaded = parse_images(loaded_report.get("loaded") or "")
    promoted = bool(loaded_report.get("promoted"))
    summary = result.stages[-2].report if len(result.stages) >= 2 else None
    if result.ok and promoted and loaded:
        if loaded_report.get("warning"):
            tell_operator(f"NodeImage {image} on {destination.label}: {loaded_report['warning']}")
        return {"summary": summary or {}, "bytes": result.bytes_sent, "image": loaded[0]}
    if loaded_report.get("exit") == TagExit.MISMATCH and loaded:
        raise Mismatch(loaded[0])
    placed = (
        f"{image} on {destination.label} was verified against the source and tagged"
        if promoted
        else f"nothing was tagged {image} on {destination.label}"
    )
    if loaded_report.get("outcome") and result.stages and result.stages[-1].status:
        result.why = f"{loaded_report['outcome']} ({result.why})"
    if loaded_report.get("stderr"):
        result.detail = [*result.detail, *str(loaded_report["stderr"]).splitlines()]
    message = result.error(
        f"copy of {image}",
        placed,
        "check the link between the nodes and run again (layers already loaded are reused)",
    )
    if export and result.failure is transfer.Failure.STAGE and not promoted and _export_failed(result):
        raise ExportFailed(message)  # the layer store's export failed: `docker save` may still do
    raise NodeImageError(message)


def _export_failed(result: transfer.TransferResult) -> bool:
    """The export itself is at fault: its producer failed on its own, or what it gave did not match."""
    if not result.stages:
        return False
    return (result.consumer_report or {}).get("exit") == TagExit.MISMATCH or _producer_failed(
        result.stages[0]
    )


def _producer_failed(producer: transfer.StageOutcome) -> bool:
    """The source's export failed on its own, not because the destination stopped reading (its load
    failed first: a broken pipe)."""
    if not producer.status or producer.status == -signal.SIGPIPE:
        return False
    return not str((producer.report or {}).get("error") or "").startswith("BrokenPipeError")


# ---- refresh and delete --------------------------------------------------------------------------------


def observe(props: Mapping[str, Any]) -> dict[str, Any] | None:
    """read(): the recorded outputs with the destination's image now, or None when the tag is gone."""
    image, _, destination, _ = parse(props)
    with ssh_sessions() as control:
        found = DockerOn(destination, "destination", control("d")).facts(image)
    if found.image is None:
        return None
    return {
        **props,
        "image_id": found.image.image_id,
        "layers": list(found.image.layers),
        "store": found.daemon.store,
        "engine": found.daemon.version,
    }


def release(props: Mapping[str, Any]) -> None:
    """delete(): give up this resource's hold on the tag. The tag goes only when this resource held it,
    no other NodeImage holds it now (a replacement's successor does), and it still points at the image
    that was placed; an image it placed that the tag no longer names (a build under the same tag) goes
    when nothing else names or uses it. A resource that never placed or shared the tag contacts the
    node only for a built image (its `trigger` is the build's ID), to remove that image the same way:
    on the head, a build under the same tag displaced it. That removal is best effort: a node it cannot
    reach gets a warning, never a failed delete."""
    claim = props.get("claim") or ""
    # State written before tag records existed (before 2026-11-30, fe8fcd9), as `legacy_placed_id`
    # tells image_tag: remove both once every NodeImage made before then is deleted or holds a claim.
    legacy = not claim and props.get("placed_tag")
    built = bool(props.get("trigger")) and props.get("trigger") == props.get("image_id")
    if not claim and not legacy and not built:
        return
    image, _, destination, _ = parse(props)
    if not claim and not legacy:
        try:
            with ssh_sessions() as control:
                left = DockerOn(destination, "destination", control("d")).tags(
                    "drop", {"ref": image, "placed_id": props["image_id"]}
                )
        except (NodeImageError, RemoteError) as exc:
            tell_operator(
                f"NodeImage {image} on {destination.label}: the build's previous image "
                f"{props['image_id']} was not checked for removal ({exc}); "
                "`docker image prune` there frees it"
            )
            return
        _say_kept(image, destination.label, left)
        return
    spec = {
        "ref": image,
        "claim": claim,
        "legacy_placed_id": (props.get("placed_image_id") or props.get("image_id") or "") if legacy else "",
        # What this resource placed or verified at its creation (never what a refresh saw later):
        # removed should the tag have moved on to another image and left it untagged.
        "placed_id": props.get("placed_image_id") or props.get("verified_image_id") or "",
        # The tag stays as a previous image (bounded): a rollback to it copies nothing.
        "keep": keep_previous(props),
    }
    with ssh_sessions() as control:
        report = DockerOn(destination, "destination", control("d")).tags("leave", spec)
    _say_kept(image, destination.label, report)


def _say_kept(image: str, node: str, report: Mapping[str, Any]) -> None:
    """An image the tag moved away from that Docker would not remove (a container or a tag uses it)."""
    if report.get("displaced_kept"):
        tell_operator(
            f"NodeImage {image} on {node}: the previous image {report['displaced_kept']} stays "
            f"({report.get('displaced_why')})"
        )
