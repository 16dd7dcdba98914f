"""NodeImage: "image X is on node Y" as a declared, verified state (a Pulumi dynamic resource).

create() inspects both nodes, skips or retags when the destination already holds the image, and
otherwise streams `docker save | filter | ssh dest docker load` from the source node straight to the
destination, leaving out the layers the destination already has. The load lands on a temporary tag;
only after the image ID (or, across image stores, the layer list) matches the source's is the real
tag set. read() re-inspects for `pulumi refresh`; delete() removes only a tag this resource placed.

Keep `NodeImageProvider` here under this name, with no import-time side effects: stacks pickle it
by reference to this module.
"""

from __future__ import annotations

import contextlib
import functools
import json
import re
import secrets
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as futures_wait
from dataclasses import dataclass, field
from typing import Any

import pulumi
import pulumi.dynamic as dynamic

from components import image_transfer, transfer
from components.copy_plan import copy_plan
from components.node_programs import program_argv
from components.node_programs.load_image import Exit as LoadExit
from components.remote import (
    SSH_TRANSPORT_FAILURE,
    RemoteError,
    Result,
    bash_argv,
    shell_join,
    stderr_tail,
    with_retries,
)
from components.transfer import (
    TIMING_ENV,  # noqa: F401  (re-exported: where operators look for it)
    Endpoint,
    EndpointError,
    PhaseTimes,
    Tuning,
    TuningError,
    peer_target,
    ssh_sessions,
)

# name:tag, the tag required; stricter than Docker so nothing odd reaches a shell.
IMAGE_REF = re.compile(
    r"^(?:[a-z0-9]+(?:[._-][a-z0-9]+)*(?::[0-9]{1,5})?/)?[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
    r"(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$"
)
NODE_KEYS = (
    "name",
    "host",
    "port",
    "user",
    "identity_file",
    "known_hosts",
    "proxy_jump",
    "fabric_host",
    "image_store",
)
STORES = ("classic", "containerd")
TMP_TAG_PREFIX = "qwen35-tmp-"
GIB = transfer.GIB


class NodeImageError(RuntimeError):
    """A copy could not be made or verified; the message names the node and what to do next."""


class ExportFailed(NodeImageError):
    """Reading layers from the source's store failed (not the link): `docker save` may still work."""


@dataclass(frozen=True)
class Node(Endpoint):
    """One node of a NodeImage: a transfer endpoint plus the image store the stack declares for it
    (None: not declared; checked against the daemon)."""

    image_store: str | None = None

    @classmethod
    def from_dict(cls, role: str, raw: Mapping[str, Any], connect_timeout: int = 10) -> Node:
        try:
            fields = Endpoint.fields_from(role, raw, connect_timeout)
        except EndpointError as exc:
            raise NodeImageError(f"NodeImage {exc}") from None
        store = raw.get("image_store") or None
        if store is not None and store not in STORES:
            raise NodeImageError(
                f"NodeImage {role} {fields['label']}: image_store {store!r}: use one of {', '.join(STORES)}"
            )
        return cls(**fields, image_store=store)


def check_declared_store(node: Node, daemon: Daemon) -> None:
    """The copy tree was planned from the declared stores: a wrong declaration must stop the copy."""
    if node.image_store is not None and node.image_store != daemon.store:
        raise NodeImageError(
            f"{node.label}: its Docker uses the {daemon.store} image store, but the stack declares "
            f"image_store: {node.image_store}; next: set image_store: {daemon.store} for {node.label} "
            "(the copy tree never uses a containerd-store node as a source: it may lack layer blobs)"
        )


def clean_node(raw: Mapping[str, Any] | None) -> dict:
    """The node dict as stored in outputs: known keys only, plain values."""
    raw = raw or {}
    return {key: raw.get(key) for key in NODE_KEYS if raw.get(key) is not None}


@dataclass(frozen=True)
class Daemon:
    """What a node's Docker daemon is: its image store, data root and version."""

    store: str  # "classic" | "containerd"
    root_dir: str
    version: str
    driver: str = ""  # storage driver, e.g. overlay2


@dataclass(frozen=True)
class ImageInfo:
    """One image as `docker image inspect` shows it."""

    image_id: str
    layers: tuple[str, ...]
    size: int = 0


def same_image(a: ImageInfo, a_store: str, b: ImageInfo, b_store: str) -> bool:
    """Identity: the image ID within one store kind, the layer list across store kinds."""
    if a_store == b_store:
        return a.image_id == b.image_id
    return a.layers == b.layers


# ---- facts: a command that reads state and a pure function that parses it -------------------------

SECTION = "@@qwen35@@"
INFO_FORMAT = "{{json .DriverStatus}}\t{{.DockerRootDir}}\t{{.ServerVersion}}\t{{.Driver}}"
IMAGE_FORMAT = "{{json .Id}}\t{{json .RootFS.Layers}}\t{{.Size}}"


def parse_daemon(text: str) -> Daemon:
    status, root, version, *driver = text.strip().split("\t")
    store = "containerd" if "io.containerd.snapshotter" in status else "classic"
    return Daemon(store=store, root_dir=root, version=version, driver=driver[0] if driver else "")


def parse_images(text: str) -> list[ImageInfo]:
    images = []
    for line in text.splitlines():
        if line.strip():
            image_id, layers, size = line.split("\t")
            images.append(ImageInfo(json.loads(image_id), tuple(json.loads(layers) or ()), int(size or 0)))
    return images


def parse_df_available(text: str) -> int:
    """Available bytes from `df -P -B1 PATH` (last line, fourth column)."""
    return int(text.strip().splitlines()[-1].split()[3])


def parse_layer_sizes(text: str, layer_count: int) -> list[int] | None:
    """Per-layer sizes (bottom first) from `docker history` sizes, when they line up with the layers."""
    sizes = [int(s) for s in text.split() if s.isdigit()]
    nonzero = [s for s in reversed(sizes) if s > 0]
    return nonzero if len(nonzero) == layer_count else None


def disk_needed(sizes: Sequence[int], keep_from: int, tuning: Tuning) -> int:
    """Bytes the destination must have free: the layers to write, times the unpack factor, plus reserve."""
    return int(sum(sizes[keep_from:]) * tuning.disk_factor) + tuning.disk_reserve_bytes


@dataclass
class Facts:
    """What one round trip to a node found (see `DockerOn.facts`)."""

    daemon: Daemon
    image: ImageInfo | None
    history: str = ""
    images: list[ImageInfo] = field(default_factory=list)
    free: int = 0
    python: str = "python3"


class Mismatch(Exception):
    """The loaded image is not the wanted one."""

    def __init__(self, loaded: ImageInfo):
        super().__init__(loaded.image_id)
        self.loaded = loaded


class DockerOn:
    """Docker commands on one node, with errors that name the node and what to do."""

    def __init__(self, node: Node, role: str, control_path: str | None = None):
        self.node, self.role = node, role
        self.transport = node.transport(control_path)

    def run(self, argv: list[str], hint: str = "", timeout: float = 120.0, check: bool = True) -> Result:
        try:
            result = with_retries(lambda: self.transport.run(argv, timeout=timeout), deadline_s=20.0)
        except RemoteError as exc:
            raise NodeImageError(f"{self.role} {exc}") from exc
        if check and not result.ok:
            if result.returncode == SSH_TRANSPORT_FAILURE:
                hint = (
                    f"check that {self.node.label} ({self.node.target.host}:{self.node.target.port}) is up, "
                    f"that sshd runs there and that its host key is in {self.node.target.known_hosts}"
                )
            raise NodeImageError(
                f"{self.role} "
                + str(RemoteError(self.node.label, argv, result.returncode, result.stderr, hint))
            )
        return result

    def image(self, ref: str) -> ImageInfo | None:
        result = self.run(["docker", "image", "inspect", "--format", IMAGE_FORMAT, ref], check=False)
        if result.ok:
            return parse_images(result.text)[0]
        if b"No such image" in result.stderr or b"no such image" in result.stderr.lower():
            return None
        self.run(["docker", "image", "inspect", ref], hint=f"check `docker info` on {self.node.label}")
        return None

    def facts(
        self,
        ref: str,
        history: bool = False,
        inventory: bool = False,
        python: bool = False,
        detached: Sequence[str] | None = None,
    ) -> Facts:
        """The daemon and image `ref` (None when absent), optionally its layer sizes, the node's
        inventory (every image's layers, free bytes under Docker's root) and its system python3, in one
        round trip.

        `detached` (an argv) is started first and left running when the session ends, its output
        dropped: it must report through files of its own (see `Peer.early_argv`)."""
        info = shell_join(["docker", "info", "--format", INFO_FORMAT])
        parts = []
        if detached:
            # `&` ends the command: the next part follows on the same line without a `;`.
            parts.append(f"{{ {shell_join(detached)}; }} </dev/null >/dev/null 2>&1 & true")
        parts += [
            f"info=$({info}) || exit $?",
            'printf "%s\\n" "$info"',
            f"echo {SECTION}",
            shell_join(["docker", "image", "inspect", "--format", IMAGE_FORMAT, ref])
            + " 2>/dev/null || true",
        ]
        if history:
            sizes = ["docker", "history", "--no-trunc", "--human=false", "--format", "{{.Size}}", ref]
            parts += [f"echo {SECTION}", f"{shell_join(sizes)} 2>/dev/null || true"]
        if python:
            # The system interpreter (default PATH), not a version manager's shim: pyenv's costs a
            # process tree per call.
            parts += [f"echo {SECTION}", "command -pv python3 || true"]
        if inventory:
            listing = shell_join(["docker", "image", "inspect", "--format", IMAGE_FORMAT])
            parts += [
                f"echo {SECTION}",
                f"{{ docker image ls -a -q --no-trunc | sort -u | xargs -r {listing}; }} || exit $?",
                f"echo {SECTION}",
                'df -P -B1 "$(printf "%s" "$info" | cut -f2)" || exit $?',
            ]
        result = self.run(
            bash_argv("; ".join(parts), pipefail=True),
            hint=f"start Docker on {self.node.label} (systemctl start docker), check `docker info`",
        )
        sections = result.text.split(f"{SECTION}\n")
        found = parse_images(sections[1])
        facts = Facts(parse_daemon(sections[0]), found[0] if found else None)
        rest = sections[2:]
        if history:
            facts.history = rest.pop(0)
        if python:
            facts.python = rest.pop(0).strip() or "python3"
        if inventory:
            facts.images, facts.free = parse_images(rest.pop(0)), parse_df_available(rest.pop(0))
        return facts

    def tag(self, image_id: str, ref: str) -> None:
        self.run(["docker", "tag", image_id, ref], hint=f"check `docker images` on {self.node.label}")

    def untag(self, ref: str) -> Result:
        return self.run(["docker", "image", "rm", ref], check=False)


def load_argv(
    tmp_ref: str, ref: str, wanted: ImageInfo, same_store: bool, python: str = "python3"
) -> list[str]:
    """The destination's end of the copy (`node_programs/load_image.py`): `docker load`, then tag
    `ref` only if the image loaded under `tmp_ref` is the wanted one, and drop `tmp_ref`.

    Identity as in `same_image`: the image ID within one store kind, the layer list across. Load,
    check and promotion share the copy's SSH session: a round trip less per copy."""
    spec = {
        "tmp_ref": tmp_ref,
        "ref": ref,
        "compare": "id" if same_store else "layers",
        "want": wanted.image_id if same_store else list(wanted.layers),
        "inspect_format": IMAGE_FORMAT,
    }
    return program_argv("load_image", [json.dumps(spec, separators=(",", ":"))], python)


# ---- the copy itself ---------------------------------------------------------------------------------


class NodeImageProvider(dynamic.ResourceProvider):
    """Ensures an image is on a node, copying only what is missing from a source node (see module doc)."""

    def create(self, props: dict[str, Any]) -> dynamic.CreateResult:
        outs = ensure_image(props)
        return dynamic.CreateResult(id_=f"{outs['destination_label']}/{outs['image']}", outs=outs)

    def read(self, id_: str, props: dict[str, Any]) -> dynamic.ReadResult:
        current = observe(props)
        if current is None:
            return dynamic.ReadResult(id_="", outs={})
        return dynamic.ReadResult(id_=id_, outs={**props, **current})

    def diff(self, id_: str, olds: dict[str, Any], news: dict[str, Any]) -> dynamic.DiffResult:
        replaces = replace_reasons(olds, news, source_now=_source_now(news))
        changed = bool(replaces) or any(
            olds.get(key) != news.get(key) for key in ("tuning", "source", "destination", "trigger")
        )
        return dynamic.DiffResult(changes=changed, replaces=replaces, delete_before_replace=False)

    def update(self, id_: str, olds: dict[str, Any], news: dict[str, Any]) -> dynamic.UpdateResult:
        # Only tuning, the source node or how the destination is reached changed (anything else
        # replaces): keep what is on the node, remember the new access details for refresh/destroy.
        return dynamic.UpdateResult(outs={**olds, **_inputs(news)})

    def delete(self, id_: str, props: dict[str, Any]) -> None:
        remove_placed_tag(props)


def _inputs(props: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "image": props["image"],
        "source": clean_node(props.get("source")),
        "destination": clean_node(props.get("destination")),
        "tuning": dict(props.get("tuning") or {}),
        "trigger": props.get("trigger") or "",
    }


def _nodes(props: Mapping[str, Any]) -> tuple[str, Node, Node, Tuning]:
    image = props.get("image")
    if not isinstance(image, str) or not IMAGE_REF.match(image):
        raise NodeImageError(
            f"NodeImage: image {image!r} is not a valid name:tag (lowercase name, explicit tag)"
        )
    try:
        tuning = transfer.tuning_from(props.get("tuning"), "NodeImage tuning")
    except TuningError as exc:
        raise NodeImageError(str(exc)) from None
    source = Node.from_dict("source", props.get("source"), tuning.connect_timeout_s)
    destination = Node.from_dict("destination", props.get("destination"), tuning.connect_timeout_s)
    return image, source, destination, tuning


def ensure_image(props: Mapping[str, Any]) -> dict[str, Any]:
    """create(): make `image` present and verified on the destination; the outputs."""
    times = PhaseTimes(f"NodeImage {props.get('image')}")
    try:
        with ssh_sessions(times) as control:
            return _ensure_image(props, control, times)
    finally:
        times.report()


def _ensure_image(
    props: Mapping[str, Any], control: Callable[[str], str], times: PhaseTimes
) -> dict[str, Any]:
    image, source, destination, tuning = _nodes(props)
    same_node = source.key == destination.key
    src = DockerOn(source, "source", control("s"))
    dst = src if same_node else DockerOn(destination, "destination", control("d"))
    peer = None if same_node else transfer.Peer.new(peer_target(destination, tuning))
    pool = ThreadPoolExecutor(max_workers=6)
    # One connection per node, made first and without a remote shell; every command after it rides
    # on it.
    src_master = pool.submit(times.timed("source master", open_master), src)
    dst_master = src_master if same_node else pool.submit(times.timed("destination master", open_master), dst)
    # The source starts connecting to the destination at the start of its inspection and goes on
    # after it: the decision and a copy's start overlap the key exchange, which the copy's first step
    # waits for. A skip or a retag closes the connection unused (one command); a failure there is
    # only reported by a copy, which tries once more. From here on, closing it is owed.
    src_facts = pool.submit(
        times.timed("source facts", _after),
        src_master,
        src.facts,
        image,
        history=not same_node,
        python=True,
        detached=None if peer is None else peer.early_argv(),
    )
    dst_facts = (
        src_facts
        if same_node
        else pool.submit(
            times.timed("destination facts", _after),
            dst_master,
            dst.facts,
            image,
            inventory=True,
            python=True,
        )
    )
    try:
        return _converge(image, src, dst, src_facts, dst_facts, peer, props, tuning, times)
    finally:
        pool.shutdown(wait=True)
        if peer is not None and not peer.closed:  # a skip, a retag or a failed copy
            with times.span("close peer master"), contextlib.suppress(RemoteError):
                # One attempt: a source that cannot be reached must not hold up the error being raised;
                # an abandoned master ends by itself (ControlPersist).
                src.transport.run(peer.close_argv(), timeout=15)


def _after(ready: Future, call: Callable[..., Any], *args, **kwargs) -> Any:
    """`call` once `ready` is done, whatever its outcome (pool work that needs a connection first)."""
    futures_wait([ready])
    return call(*args, **kwargs)


def open_master(docker: DockerOn) -> None:
    """Connect to the node now, without a remote shell; later commands share the connection."""
    transfer.open_master(docker.node.target, docker.transport.control_path)


def _converge(image, src, dst, src_facts, dst_facts, peer, props, tuning, times) -> dict[str, Any]:
    """Skip, retag or copy, given the facts being gathered in `pool` (see `_ensure_image`)."""
    source, destination = src.node, dst.node
    started = times.started
    with times.span("wait for facts"):
        at_source, at_destination = src_facts.result(), dst_facts.result()
    src_daemon, src_image = at_source.daemon, at_source.image
    dst_daemon, present = at_destination.daemon, at_destination.image
    for node, daemon in ((source, src_daemon), (destination, dst_daemon)):
        check_declared_store(node, daemon)
    if src_image is None:
        raise NodeImageError(
            f"source {source.label}: image {image} is not there; next: build or load it on {source.label}"
        )
    base = {
        **_inputs(props),
        "destination_label": destination.label,
        "source_image_id": src_image.image_id,
        "source_store": src_daemon.store,
        "bytes_sent": 0,
        "layer_bytes_sent": 0,
        "layers_sent": 0,
        "layers_left_out": 0,
        "skipped": True,
        "retagged": False,
        "placed_tag": False,
        "layout": "",
    }

    def done(info: ImageInfo, daemon: Daemon, **extra) -> dict[str, Any]:
        return {
            **base,
            "image_id": info.image_id,
            "layers": list(info.layers),
            "store": daemon.store,
            "engine": daemon.version,
            **extra,
            # What delete() may untag: the image this resource tagged, never one refresh saw later.
            "placed_image_id": info.image_id if extra.get("placed_tag") else "",
            "seconds": round(time.monotonic() - started, 3),
        }

    if peer is None:
        return done(src_image, src_daemon)
    if present is not None and same_image(present, dst_daemon.store, src_image, src_daemon.store):
        return done(present, dst_daemon)

    others, free = at_destination.images, at_destination.free
    twin = _existing_twin(others, dst_daemon.store, src_image, src_daemon.store)
    if twin is not None:
        dst.tag(twin.image_id, image)
        return done(twin, dst_daemon, retagged=True, placed_tag=True)
    keep_from = 0
    if dst_daemon.store == "classic":  # the containerd store needs every blob: send all
        keep_from = image_transfer.present_prefix(
            src_image.layers, image_transfer.present_chains(i.layers for i in others)
        )
    sizes = parse_layer_sizes(at_source.history, len(src_image.layers))
    _check_disk(dst, dst_daemon, src_image, sizes, keep_from, free, tuning)
    name, _ = image_transfer.split_reference(image)
    tmp_tag = f"{name}:{TMP_TAG_PREFIX}{secrets.token_hex(4)}"
    copy = functools.partial(
        _stream,
        src,
        dst,
        image,
        src_image,
        keep_from,
        tmp_tag,
        peer,
        tuning,
        python=at_source.python,
        dst_python=at_destination.python,
        same_store=dst_daemon.store == src_daemon.store,
        bytes_total=sum(sizes[keep_from:]) if sizes else src_image.size,
        times=times,
    )
    try:
        report = None
        if _can_export(tuning, src_daemon, dst_daemon):
            export = {
                "root": src_daemon.root_dir,
                "driver": src_daemon.driver,
                "image_id": src_image.image_id,
            }
            try:
                with times.span("stream, verify, promote (layer store)"):
                    report = copy(export=export)
            except ExportFailed:  # the store could not be read, or what it gave did not load: docker save
                dst.untag(tmp_tag)
        if report is None:
            with times.span("stream, verify, promote (docker save)"):
                report = copy()
    except Mismatch as wrong:
        dst.untag(tmp_tag)
        raise NodeImageError(
            f"destination {destination.label}: the loaded image does not match the source "
            f"({wrong.loaded.image_id[:19]}, {len(wrong.loaded.layers)} layers; {source.label} has "
            f"{src_image.image_id[:19]}, {len(src_image.layers)} layers); the temporary tag was removed; "
            f"next: run again, and if it repeats compare `docker image inspect {image}` on both nodes"
        ) from None
    except BaseException:
        dst.untag(tmp_tag)
        raise
    summary = report["summary"] or {}
    return done(
        report["image"],
        dst_daemon,
        skipped=False,
        placed_tag=True,
        bytes_sent=int(report["bytes"]),
        layer_bytes_sent=int(summary.get("layer_bytes", 0)),
        layers_sent=int(summary.get("layers_sent", 0)),
        layers_left_out=int(summary.get("layers_left_out", 0)),
        layout=str(summary.get("layout", "")),
    )


def _can_export(tuning: Tuning, source: Daemon, destination: Daemon) -> bool:
    """Read layers straight from the source's store: classic overlay2 to a classic destination only."""
    return (
        tuning.source_export == "auto"
        and source.store == "classic"
        and source.driver == "overlay2"
        and destination.store == "classic"
    )


def _existing_twin(
    images: list[ImageInfo], store: str, wanted: ImageInfo, wanted_store: str
) -> ImageInfo | None:
    """An image already on the destination that is the wanted one under another (or no) tag."""
    matches = [i for i in images if same_image(i, store, wanted, wanted_store)]
    unique = {i.image_id: i for i in matches}
    return next(iter(unique.values())) if len(unique) == 1 else None


def _check_disk(
    dst: DockerOn,
    daemon: Daemon,
    wanted: ImageInfo,
    sizes: list[int] | None,
    keep_from: int,
    free: int,
    tuning: Tuning,
) -> None:
    """Refuse before sending when the destination's Docker root cannot take what the load writes."""
    if sizes is None:  # layers do not line up with history: assume every layer is missing
        sizes, keep_from = [wanted.size], 0
    need = disk_needed(sizes, keep_from, tuning)
    if free < need:
        raise NodeImageError(
            f"destination {dst.node.label}: not enough disk in {daemon.root_dir}: {free / GIB:.2f} GiB free, "
            f"the copy needs about {need / GIB:.2f} GiB ({tuning.disk_factor:g} x "
            f"{sum(sizes[keep_from:]) / GIB:.2f} GiB of layers + {tuning.disk_reserve_bytes / GIB:.2f} GiB "
            f"reserve); nothing was sent; next: free space "
            f"there (docker image prune, docker builder prune) or lower tuning disk_reserve_bytes"
        )


def _stream(
    src: DockerOn,
    dst: DockerOn,
    image: str,
    wanted: ImageInfo,
    keep_from: int,
    tmp_tag: str,
    peer: transfer.Peer,
    tuning: Tuning,
    *,
    python: str = "python3",
    dst_python: str = "python3",
    same_store: bool = True,
    export: dict | None = None,
    bytes_total: int = 0,
    times: PhaseTimes | None = None,
) -> dict:
    """Send, load, verify and promote in one session on the source (a transfer: producers on the
    source, `load_image` on the destination); the filter's report plus `image` (the verified image
    now tagged `image` on the destination). Raises Mismatch, ExportFailed or NodeImageError."""
    source, destination = src.node, dst.node
    spec = image_transfer.filter_spec(wanted.layers, keep_from, tmp_tag, tuning.compression, export=export)
    producers = [transfer.Stage("layer export (source)", image_transfer.filter_argv(spec, python))]
    if not export:
        producers = [
            transfer.Stage("docker save (source)", ["docker", "save", image]),
            transfer.Stage("save filter (source)", image_transfer.filter_argv(spec, python)),
        ]
    job = transfer.Transfer(
        operation=f"node-image-{destination.label}-{secrets.token_hex(3)}",
        producers=tuple(producers),
        consumer=transfer.Stage(
            "docker load (destination)", load_argv(tmp_tag, image, wanted, same_store, dst_python)
        ),
        bytes_total=bytes_total,
    )
    try:
        result = transfer.run_transfer(
            job, source, destination, peer, tuning, src.transport.control_path, python, times
        )
    except transfer.PeerUnreachable as exc:
        raise NodeImageError(str(exc)) from None
    loaded_report = result.consumer_report or {}
    loaded = parse_images(loaded_report.get("loaded") or "")
    promoted = bool(loaded_report.get("promoted"))
    summary = result.stages[-2].report if len(result.stages) >= 2 else None
    if result.ok and promoted and loaded:
        return {"summary": summary or {}, "bytes": result.bytes_sent, "image": loaded[0]}
    if loaded_report.get("exit") == LoadExit.MISMATCH and loaded:
        raise Mismatch(loaded[0])
    placed = (
        f"{image} on {destination.label} was verified against the source and tagged"
        if promoted
        else f"nothing was tagged {image} on {destination.label}"
    )
    why = result.why
    if loaded_report.get("outcome") and result.stages and result.stages[-1].status:
        why = f"{loaded_report['outcome']} ({why})"
    if loaded_report.get("stderr"):
        result.detail = [*result.detail, *str(loaded_report["stderr"]).splitlines()]
    result.why = why
    message = result.error(
        f"copy of {image}",
        placed,
        "check the link between the nodes and run again (layers already loaded are reused)",
    )
    error = (
        ExportFailed
        if export and result.failure is transfer.Failure.STAGE and not promoted
        else NodeImageError
    )
    raise error(message)


# ---- refresh, diff, delete ----------------------------------------------------------------------------


def observe(props: Mapping[str, Any]) -> dict[str, Any] | None:
    """read(): the destination's image now, or None when the tag is gone."""
    _, _, destination, tuning = _nodes(props)
    with ssh_sessions() as control:
        dst = DockerOn(destination, "destination", control("d"))
        found = dst.facts(props["image"])
        daemon, info = found.daemon, found.image
    if info is None:
        return None
    return {
        "image_id": info.image_id,
        "layers": list(info.layers),
        "store": daemon.store,
        "engine": daemon.version,
    }


def _source_now(news: Mapping[str, Any]) -> tuple[ImageInfo, str] | None:
    """The source's image as it is now, or None when it cannot be seen (diff then uses inputs only)."""
    try:
        image, source, _, _ = _nodes(news)
        src = DockerOn(source, "source")
        found = src.facts(image)
        daemon, info = found.daemon, found.image
    except (NodeImageError, KeyError, TypeError, ValueError):
        return None
    return (info, daemon.store) if info is not None else None


def replace_reasons(
    olds: Mapping[str, Any], news: Mapping[str, Any], source_now: tuple[ImageInfo, str] | None
) -> list[str]:
    """Properties whose change needs a new copy: the image, the destination, the trigger, the source image."""
    reasons = []
    if olds.get("image") != news.get("image"):
        reasons.append("image")
    old_dst, new_dst = clean_node(olds.get("destination")), clean_node(news.get("destination"))
    if any(old_dst.get(k) != new_dst.get(k) for k in ("host", "port", "fabric_host")):
        reasons.append("destination")
    if (olds.get("trigger") or "") != (news.get("trigger") or ""):
        reasons.append("trigger")
    if source_now is not None and "image" not in reasons:
        info, store = source_now
        on_node = ImageInfo(olds.get("image_id", ""), tuple(olds.get("layers") or ()))
        if info.image_id != olds.get("source_image_id") or not same_image(
            on_node, olds.get("store", ""), info, store
        ):
            reasons.append("image")
    return reasons


def remove_placed_tag(props: Mapping[str, Any]) -> None:
    """delete(): untag only what this resource placed, and only while it still points at that image."""
    if not props.get("placed_tag"):
        return
    image, _, destination, _ = _nodes(props)
    with ssh_sessions() as control:
        dst = DockerOn(destination, "destination", control("d"))
        current = dst.image(image)
        placed = props.get("placed_image_id") or props.get("image_id")
        if current is None or current.image_id != placed:
            return
        result = dst.untag(image)
    if not result.ok and b"conflict" not in result.stderr.lower():
        raise NodeImageError(
            f"destination {destination.label}: could not remove {image}: {stderr_tail(result.stderr, 3)}; "
            f"next: remove it by hand (docker image rm {image}) or `pulumi state delete` this resource"
        )


# ---- the resource and the fan-out ----------------------------------------------------------------------


class NodeImage(dynamic.Resource):
    """`image` present and verified on `destination`, copied from `source` (node dicts, see module doc)."""

    image_id: pulumi.Output[str]
    layers: pulumi.Output[list]
    bytes_sent: pulumi.Output[int]
    skipped: pulumi.Output[bool]
    store: pulumi.Output[str]

    def __init__(
        self,
        name: str,
        image: pulumi.Input[str],
        source: Mapping[str, Any],
        destination: Mapping[str, Any],
        tuning: Mapping[str, Any] | None = None,
        trigger: pulumi.Input[str] | None = None,
        opts: pulumi.ResourceOptions | None = None,
    ):
        props = {
            "image": image,
            "source": clean_node(source),
            "destination": clean_node(destination),
            "tuning": dict(tuning or {}),
            "trigger": trigger or "",
            **{key: None for key in OUTPUT_KEYS},
        }
        super().__init__(NodeImageProvider(), name, props, opts)


OUTPUT_KEYS = (
    "image_id",
    "layers",
    "bytes_sent",
    "layer_bytes_sent",
    "layers_sent",
    "layers_left_out",
    "skipped",
    "retagged",
    "placed_tag",
    "placed_image_id",
    "store",
    "engine",
    "source_image_id",
    "source_store",
    "layout",
    "seconds",
    "destination_label",
)


def copy_tree(
    name: str,
    image: pulumi.Input[str],
    accesses: Mapping[str, Any],
    head: str,
    opts: pulumi.ResourceOptions | None = None,
    can_reexport: Callable[[str], bool] | Collection[str] | None = None,
    tuning: Mapping[str, Any] | None = None,
    trigger: pulumi.Input[str] | None = None,
) -> dict[str, NodeImage]:
    """One NodeImage per node, sources arranged as a tree (`copy_plan`); node name -> NodeImage.

    `accesses`: node name -> NodeAccess (or its `node_image_dict()`); `head` holds the image already.
    Each copy depends on the NodeImage of its source, so a node serves only once it has the image.
    """
    nodes = {
        key: (value.node_image_dict() if hasattr(value, "node_image_dict") else dict(value))
        for key, value in accesses.items()
    }
    if head not in nodes:
        raise NodeImageError(f"copy_tree: head {head!r} is not among the nodes {sorted(nodes)}")
    opts = opts or pulumi.ResourceOptions()
    made: dict[str, NodeImage] = {
        head: NodeImage(f"{name}-{head}", image, nodes[head], nodes[head], tuning, trigger, opts)
    }
    workers = [node for node in nodes if node != head]
    for round_ in copy_plan(head, workers, can_reexport):
        for src, dst in round_:
            child = pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(depends_on=[made[src]]))
            made[dst] = NodeImage(f"{name}-{dst}", image, nodes[src], nodes[dst], tuning, trigger, child)
    return made
