"""The pure decisions: what `pulumi up` does to a NodeImage (`plan_change`, from inputs and state),
and what to do to make the image present on the destination (`plan`, from both nodes' facts), each
tested as a table. The executor only carries them out."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from components.node_image.errors import NodeImageError
from components.node_image.facts import Daemon, Facts, ImageInfo, parse_layer_sizes, same_image
from components.node_image.inputs import Node, clean_node, keep_previous
from components.node_programs.wire import chain_ids
from components.nodes import same_address, same_node
from components.provider_kit.change import Change
from components.provider_kit.inputs import node_problems
from components.transfer import GIB, Tuning

# Inputs recorded in place when they change (unless they also replace): how nodes are reached, tuning.
UPDATE_KEYS = ("tuning", "source", "destination", "trigger")


def plan_change(olds: Mapping[str, Any], news: Mapping[str, Any]) -> Change:
    """From recorded state and new inputs, no I/O: replace (`replace_reasons`), update in place (access
    details, tuning, a trigger recorded in place; retention, which only matters at delete), or leave
    alone."""
    replaces = replace_reasons(olds, news)
    updates = [key for key in UPDATE_KEYS if olds.get(key) != news.get(key) and key not in replaces]
    if keep_previous(olds) != keep_previous(news):
        updates.append("keep_previous")
    return Change(tuple(replaces), tuple(updates))


def replace_reasons(olds: Mapping[str, Any], news: Mapping[str, Any]) -> list[str]:
    """Inputs whose change needs a new copy: the image, the destination node, the trigger, the source's
    image (the source NodeImage's observed ID), or drift that refresh recorded. Pure: no node I/O."""
    reasons = []
    if olds.get("image") != news.get("image"):
        reasons.append("image")
    old_dst, new_dst = clean_node(olds.get("destination")), clean_node(news.get("destination"))
    # Another node, or the same one's daemon at another address: the image lives in a daemon, and one
    # reached elsewhere holds nothing this copy verified.
    if not same_node(old_dst, new_dst) or not same_address(old_dst, new_dst):
        reasons.append("destination")
    if (olds.get("trigger") or "") != (news.get("trigger") or "") and not legacy_trigger(olds, news):
        reasons.append("trigger")
    if "image" not in reasons and (source_changed(olds, news) or drifted(olds)):
        reasons.append("image")
    return reasons


def legacy_trigger(olds: Mapping[str, Any], news: Mapping[str, Any]) -> bool:
    """The trigger recorded from pulumi_docker.Image, whose ID was the image reference itself (so it
    said nothing `image` does not), now the ImageBuild's image ID of the very image this copy holds:
    recorded in place, not a new copy (docs/image-build.md). A leftover of stacks whose image was built
    by pulumi_docker.Image (before 2026-12-01, 61584aa): remove once every stack built before then
    has been updated by `pulumi up` since (its NodeImages then record the build's ID)."""
    new = news.get("trigger") or ""
    held = {olds.get("image_id"), olds.get("verified_image_id"), olds.get("source_image_id")} - {None, ""}
    return bool(olds.get("trigger")) and olds.get("trigger") == olds.get("image") and new in held


def source_changed(olds: Mapping[str, Any], news: Mapping[str, Any]) -> bool:
    """The source NodeImage now reports another image than the one this copy was made from (an
    unknown value during preview counts as changed: the source is being replaced)."""
    wanted = news.get("source_image_id")
    return bool(wanted) and wanted != olds.get("source_image_id")


def drifted(olds: Mapping[str, Any]) -> bool:
    """A refresh found the destination's tag pointing at another image than the one verified there."""
    verified = olds.get("verified_image_id")
    if not verified and olds.get("store") == olds.get("source_store"):
        verified = olds.get("source_image_id")  # state from before `verified_image_id`
    return bool(verified) and bool(olds.get("image_id")) and olds.get("image_id") != verified


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
        keep_from = present_prefix(wanted.layers, present_chains(i.layers for i in destination.images))
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


def present_chains(images_layers: Iterable[Sequence[str]]) -> set[str]:
    """Every chain ID a classic daemon holds, from the layer lists of all its images."""
    found: set[str] = set()
    for layers in images_layers:
        found.update(chain_ids(list(layers)))
    return found


def present_prefix(layers: Sequence[str], chains_on_destination: set[str]) -> int:
    """How many bottom layers the destination already has as a chain (docker load skips those)."""
    count = 0
    for index, chain in enumerate(chain_ids(layers)):
        if chain not in chains_on_destination:
            break
        count = index + 1
    return count


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


def validate(props: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(field, reason) for each input `check` refuses: no I/O; a value not known yet passes."""
    return node_problems(props, "destination")
