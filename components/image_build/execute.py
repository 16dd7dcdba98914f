"""The build carried out on the head over SSH: read where the tag points, then keep, re-tag or
build (the context streamed from this machine, every line relayed to the operator), tagging the
real reference only after the build succeeded. The only I/O of the package.

There is no release: as pulumi_docker.Image did, a deleted build's image stays on the head under its
tag, the previous image a rollback re-tags instead of rebuilding (another content tag; one built
again under the same tag is gone with its NodeImage, node-image.md). NodeImage's records decide what
the nodes keep."""

from __future__ import annotations

import contextlib
import secrets
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from components.image_build import programs
from components.image_build.errors import FactsError, ImageBuildError
from components.image_build.facts import (
    HeadImage,
    parse_build_log,
    parse_head_image,
    parse_image_id,
    plain,
)
from components.image_build.plan import (
    Action,
    Build,
    Keep,
    Retag,
    failure_hint,
    plan_create,
    plan_restore,
    recorded_id,
)
from components.nodes import transport_to
from components.provider_kit.progress import tell_operator
from components.remote import (
    SSH_TRANSPORT_FAILURE,
    RemoteError,
    SshTransport,
    require_ssh,
    run_relaying,
    ssh_argv,
)

# A build of the real hybrid pip-installs transformers and runs its proofs: minutes, not hours.
BUILD_TIMEOUT_S = 3600
INSPECT_TIMEOUT_S = 60


def head_transport(props: Mapping[str, Any]) -> SshTransport:
    """The SSH transport to the head of the `node` input (NodeDictError naming it when unusable)."""
    return transport_to("ImageBuild node", props["node"])


def head_image(
    transport: SshTransport, ref: str, recorded: str | None, sources: Mapping[str, str] | None = None
) -> HeadImage:
    """Where `ref` points on the head, whether the recorded image ID is still there, and the ID of
    each source image (`sources`: build arg -> reference) and of those the tag's image was built from."""
    argv = programs.inspect_argv(ref, recorded, (sources or {}).values())
    result = transport.run(argv, timeout=INSPECT_TIMEOUT_S)
    try:
        return parse_head_image(result, ref, recorded, sources)
    except FactsError as exc:
        raise RemoteError(transport.name, argv, result.returncode, result.stderr, str(exc)) from None


def check_context(props: Mapping[str, Any]) -> Path:
    """The context folder on this machine, with its Dockerfile, before anything runs on the head."""
    context = Path(str(props["context"]))
    if not (context / str(props["dockerfile"])).is_file():
        raise ImageBuildError(
            str(props["node"].get("name")), str(props["ref"]), "the build context",
            f"{context / str(props['dockerfile'])} is not a file",
            "the build context ships with this repository (patches/): restore it, or run from the project",
        )  # fmt: skip
    missing = programs.missing_wheels(context, props.get("context_rules") or ())
    if missing:
        raise ImageBuildError(
            str(props["node"].get("name")), str(props["ref"]), "the build context", missing,
            f"put the wheels there (`pip download -d {context / programs.WHEELS_DIR} …`), or drop "
            f"{programs.WHEELS_IN_IMAGE} from image.pip_args; nothing was built",
        )  # fmt: skip
    return context


def build(
    transport: SshTransport, props: Mapping[str, Any], source_ids: Mapping[str, str] | None = None
) -> str:
    """`docker build` on the head under a temporary tag, then the real tag; the new image ID,
    labelled with the source images' IDs (`source_ids`). A failure leaves the real tag as it was
    and no temporary tag behind."""
    context, ref, node = check_context(props), str(props["ref"]), transport.name
    require_ssh(node)
    tag = programs.build_ref(ref, secrets.token_hex(4))
    argv = programs.build_argv(props, tag, source_ids)
    lines: list[str] = []

    def relay(raw: str) -> None:
        line = plain(raw)
        lines.append(line)
        if line.strip():
            tell_operator(f"image-build on {node}: {line}")

    tell_operator(f"image-build on {node}: building {ref} from {context}")
    try:
        result = run_relaying(
            node,
            ssh_argv(transport.target, argv, dial_with=sys.executable),
            argv,
            lambda out: programs.write_context(context, out, props.get("context_rules") or ()),
            BUILD_TIMEOUT_S,
            relay,
            relay_stdout=True,
        )
        if result.returncode == SSH_TRANSPORT_FAILURE:
            result.check("the head could not be reached over SSH: check it is up, then run `pulumi up`")
        if not result.ok:
            log = parse_build_log(lines)
            raise ImageBuildError(node, ref, log.stage, "\n".join(lines), failure_hint(bool(log.refusals)))
        image_id = parse_image_id(transport.run(programs.image_id_argv(tag), timeout=INSPECT_TIMEOUT_S))
        transport.run(programs.tag_argv(image_id, ref), timeout=INSPECT_TIMEOUT_S).check(
            f"the image was built ({image_id}) but could not be tagged {ref}: run `pulumi up` again"
        )
    except FactsError as exc:
        raise ImageBuildError(node, ref, "the build's result", str(exc), "run `pulumi up` again") from None
    finally:
        # Only this build's tag: the image stays under `ref`; a refused build made none (no-op then).
        with contextlib.suppress(RemoteError):
            transport.run(programs.untag_argv(tag), timeout=INSPECT_TIMEOUT_S)
    tell_operator(f"image-build on {node}: {ref} is {image_id}")
    return image_id


def carry_out(
    transport: SshTransport, props: Mapping[str, Any], action: Action, head: HeadImage
) -> dict[str, Any]:
    """Keep, re-tag or build as planned (`head`: what the head held when planned); the outputs."""
    started = time.monotonic()
    ref, node = str(props["ref"]), transport.name
    if isinstance(action, Keep):
        tell_operator(f"image-build on {node}: {ref} is already {action.image_id}: nothing to build")
        image_id, built = action.image_id, False
    elif isinstance(action, Retag):
        tell_operator(f"image-build on {node}: {ref} re-tagged to {action.image_id} (still on the head)")
        transport.run(programs.tag_argv(action.image_id, ref), timeout=INSPECT_TIMEOUT_S).check(
            "the image is on the head but could not be tagged: run `pulumi up` again"
        )
        image_id, built = action.image_id, False
    elif isinstance(action, Build):
        image_id, built = build(transport, props, head.sources), True
    else:
        raise TypeError(f"not an ImageBuild action: {action!r}")
    sources = dict(head.sources)
    if built and not all(sources.values()):
        # A source the head lacked was pulled by the build: its ID is what the build ran on.
        sources = dict(head_image(transport, ref, None, programs.source_refs(props)).sources)
    return {"image_id": image_id, "observed_image_id": image_id, "built": built,
            "source_ids": sources, "observed_source_ids": sources,
            "seconds": round(time.monotonic() - started, 1)}  # fmt: skip


def ensure(props: Mapping[str, Any], olds: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """create (no `olds`): the image under `ref` on the head, kept when a content tag built from the
    head's source images is there already. update: new access details recorded; a tag refresh found
    gone or moved is restored; a source image rebuilt since the build (refresh saw it) builds again."""
    transport = head_transport(props)
    ref, sources = str(props["ref"]), programs.source_refs(props)
    if olds is None:
        head = head_image(transport, ref, None, sources)
        return {**props, **carry_out(transport, props, plan_create(props, head), head)}
    recorded = recorded_id(olds)
    head = head_image(transport, ref, recorded, sources)
    built_from = olds.get("source_ids") if isinstance(olds.get("source_ids"), Mapping) else None
    action = plan_restore(recorded, head, built_from)
    outs = carry_out(transport, props, action, head)
    if not isinstance(action, Build) and built_from is not None:
        # Kept or re-tagged: still the image built from the recorded sources (a source gone from the
        # head since shows as "" in observed_source_ids). A stack recorded before sources were
        # followed records the head's sources now.
        outs["source_ids"] = {arg: built_from.get(arg) or now for arg, now in head.sources.items()}
    if isinstance(action, Keep):
        outs = {**outs, "built": olds.get("built"), "seconds": olds.get("seconds")}
    return {**props, **outs}


def observe(props: Mapping[str, Any]) -> dict[str, Any]:
    """read: the recorded outputs with the image the tag points at now ("" when it is gone) and, once
    the build recorded its sources, the ID of each source image now ("" when it is gone)."""
    found = head_image(head_transport(props), str(props["ref"]), None, programs.source_refs(props))
    outs = {**props, "observed_image_id": found.tag_id or ""}
    if isinstance(props.get("source_ids"), Mapping):
        outs["observed_source_ids"] = dict(found.sources)
    return outs
