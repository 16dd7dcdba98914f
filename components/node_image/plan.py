"""The decision: what to do to make the image present on the destination, as a pure function of
both nodes' facts (`plan`), tested as a table. The executor only carries the plan out."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from components.node_image import image_transfer
from components.node_image.errors import NodeImageError
from components.node_image.facts import Daemon, Facts, ImageInfo, parse_layer_sizes, same_image
from components.node_image.inputs import Node
from components.transfer import GIB, Tuning


@dataclass(frozen=True)
class Skip:
    """Nothing to do: the destination's tag already names the wanted image (or it is the source)."""

    image: ImageInfo  # as the destination holds it
    daemon: Daemon
    tag_was_there: bool  # a tag already there (not the source itself): may be another NodeImage's to share


@dataclass(frozen=True)
class Retag:
    """The wanted image is on the destination under another (or no) tag: tag it."""

    image: ImageInfo
    daemon: Daemon


@dataclass(frozen=True)
class Copy:
    """Send the image, leaving out the layers the destination already holds."""

    leave_out: tuple[str, ...]  # diff IDs of the layers not sent
    keep_from: int  # how many bottom layers are left out as a chain (a classic store's reuse)
    export: bool  # read the layers from the source's layer store instead of `docker save`
    same_store: bool  # both nodes use the same image-store kind (identity: the image ID)
    bytes_to_send: int  # layer bytes to send (an estimate, for progress and the disk check)


Plan = Skip | Retag | Copy


def plan(source: Facts, destination: Facts, tuning: Tuning) -> Plan:
    """Skip, Retag or Copy, from what both nodes hold; raises NodeImageError when the copy must not
    start (a wrong store declaration, the image missing on the source, too little disk)."""
    for facts in (source, destination):
        check_declared_store(facts.node, facts.daemon)
    wanted = source.image
    if wanted is None:
        raise NodeImageError(
            f"source {source.node.label}: image {source.ref} is not there; "
            f"next: build or load it on {source.node.label}"
        )
    if source.node.key == destination.node.key:
        return Skip(wanted, source.daemon, tag_was_there=False)
    store, wanted_store = destination.daemon.store, source.daemon.store
    present = destination.image
    if present is not None and same_image(present, store, wanted, wanted_store):
        return Skip(present, destination.daemon, tag_was_there=True)
    twin = existing_twin(destination.images, store, wanted, wanted_store)
    if twin is not None:
        return Retag(twin, destination.daemon)
    if store == "classic":
        keep_from = image_transfer.present_prefix(
            wanted.layers, image_transfer.present_chains(i.layers for i in destination.images)
        )
        leave_out = tuple(wanted.layers[:keep_from])
    else:
        # containerd: a layer whose blob the content store holds (stored uncompressed under its diff
        # ID when this program loaded it) and that an image there still uses: a blob no image uses
        # may be garbage-collected between this listing and the load.
        keep_from = 0
        in_use = {layer for image in destination.images for layer in image.layers}
        leave_out = tuple(layer for layer in wanted.layers if layer in destination.blobs and layer in in_use)
    sizes = parse_layer_sizes(source.history, len(wanted.layers))
    to_send = (
        sum(size for layer, size in zip(wanted.layers, sizes, strict=True) if layer not in leave_out)
        if sizes is not None
        else wanted.size  # layers do not line up with history: assume every layer is missing
    )
    check_disk(destination, to_send, tuning)
    return Copy(
        leave_out=leave_out,
        keep_from=keep_from,
        export=can_export(tuning, source.daemon, destination.daemon),
        same_store=store == wanted_store,
        bytes_to_send=to_send,
    )


def check_declared_store(node: Node, daemon: Daemon) -> None:
    """The copy tree was planned from the declared stores: a wrong declaration must stop the copy."""
    if node.image_store is not None and node.image_store != daemon.store:
        raise NodeImageError(
            f"{node.label}: its Docker uses the {daemon.store} image store, but the stack declares "
            f"image_store: {node.image_store}; next: set image_store: {daemon.store} for {node.label} "
            "(the copy tree never uses a containerd-store node as a source: it may lack layer blobs)"
        )


def existing_twin(
    images: Sequence[ImageInfo], store: str, wanted: ImageInfo, wanted_store: str
) -> ImageInfo | None:
    """An image already on the destination that is the wanted one under another (or no) tag."""
    matches = [i for i in images if same_image(i, store, wanted, wanted_store)]
    unique = {i.image_id: i for i in matches}
    return next(iter(unique.values())) if len(unique) == 1 else None


def disk_needed(layer_bytes: int, tuning: Tuning) -> int:
    """Bytes the destination must have free: the layers to write, times the unpack factor, plus reserve."""
    return int(layer_bytes * tuning.disk_factor) + tuning.disk_reserve_bytes


def check_disk(destination: Facts, layer_bytes: int, tuning: Tuning) -> None:
    """Refuse before sending when the destination's Docker root cannot take what the load writes."""
    need = disk_needed(layer_bytes, tuning)
    if destination.free < need:
        raise NodeImageError(
            f"destination {destination.node.label}: not enough disk in {destination.daemon.root_dir}: "
            f"{destination.free / GIB:.2f} GiB free, the copy needs about {need / GIB:.2f} GiB "
            f"({tuning.disk_factor:g} x {layer_bytes / GIB:.2f} GiB of layers + "
            f"{tuning.disk_reserve_bytes / GIB:.2f} GiB reserve); nothing was sent; next: free space "
            f"there (docker image prune, docker builder prune) or lower tuning disk_reserve_bytes"
        )


def can_export(tuning: Tuning, source: Daemon, destination: Daemon) -> bool:
    """Read layers straight from the source's store: a classic overlay2 source (to a containerd
    destination as an OCI layout, whose blobs are named by digest)."""
    return tuning.source_export == "auto" and source.store == "classic" and source.driver == "overlay2"
