"""The build's pure decisions: whether the inputs are usable, what a change does to the image
(`plan_change`), what create and a drift restore carry out, and what a failed build tells the
operator. No I/O: diff and check use these, and the tests are tables."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from components.image_build.facts import IMAGE_ID, HeadImage
from components.image_ref import ImageRefError, parse_image_ref
from components.nodes import same_address, same_node
from components.provider_kit.change import Change
from components.provider_kit.inputs import known

# Inputs that make another image: a change builds anew (the content tag changes with most of them).
REPLACE_KEYS = ("ref", "context_digest", "dockerfile", "platform", "build_args")
# Inputs recorded in place: how the head is reached, the build's network, how the tag was chosen.
# Not `context`: it is where this checkout is on the operator's machine, and an `up` from another
# clone must change nothing (`context_digest` says what is in it).
UPDATE_KEYS = ("node", "network", "content_addressed")
OUTPUT_KEYS = ("image_id", "observed_image_id", "built", "seconds")
PLATFORM = re.compile(r"^[a-z0-9]+/[a-z0-9_]+(/[a-z0-9]+)?$")
NETWORK = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
BUILD_ARG = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
DOCKERFILE = re.compile(r"^[A-Za-z0-9_.][A-Za-z0-9_.-]*$")
DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")


def _problem(field: str, value: Any, pattern: re.Pattern[str], what: str) -> list[tuple[str, str]]:
    if not known(value) or (isinstance(value, str) and pattern.match(value)):
        return []
    return [(field, f"{value!r} is not {what}")]


def validate(props: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Problems with the inputs, each naming its field (no I/O; values not known yet pass)."""
    problems = []
    node = props.get("node")
    if not isinstance(node, Mapping) or not node.get("host") or not node.get("known_hosts"):
        problems.append(("node", "the head's access details (host, known_hosts) are required"))
    ref = props.get("ref")
    if known(ref):
        try:
            parsed = parse_image_ref(ref)
            if not parsed.tag or parsed.digest:
                problems.append(
                    ("ref", f"{ref!r} must be name:tag (a build is tagged, never pinned by digest)")
                )
        except ImageRefError as exc:
            problems.append(("ref", f"{exc}"))
    problems += _problem("platform", props.get("platform"), PLATFORM, "os/arch (linux/arm64)")
    problems += _problem("dockerfile", props.get("dockerfile"), DOCKERFILE, "a file name in the context")
    problems += _problem("context_digest", props.get("context_digest"), DIGEST, "a sha256: digest")
    if known(props.get("network")) and props.get("network"):
        problems += _problem("network", props.get("network"), NETWORK, "a Docker network name")
    context = props.get("context")
    if known(context) and not (isinstance(context, str) and context.startswith("/")):
        problems.append(("context", f"{context!r} is not an absolute path"))
    args = props.get("build_args") or {}
    if known(args) and not isinstance(args, Mapping):
        problems.append(("build_args", f"a map of build-arg names to strings, not {str(args)[:40]!r}"))
    elif known(args):
        for key, value in args.items():
            if not BUILD_ARG.match(str(key)):
                problems.append(("build_args", f"{key!r} is not a build-arg name"))
            elif known(value) and (not isinstance(value, str) or "\n" in value or "\0" in value):
                problems.append((f"build_args.{key}", f"a one-line string, not {str(value)[:40]!r}"))
    return problems


def drifted(props: Mapping[str, Any]) -> bool:
    """A refresh found the head's tag gone or pointing at another image than the one built."""
    return bool(props.get("image_id")) and props.get("observed_image_id") != props.get("image_id")


def plan_change(olds: Mapping[str, Any], news: Mapping[str, Any]) -> Change:
    """From recorded state and new inputs, no I/O: another image replaces (a build on create), access
    details and drift are updates (`up` restores the tag), anything else leaves it alone."""
    replaces = [key for key in REPLACE_KEYS if olds.get(key) != news.get(key)]
    old_node, new_node = olds.get("node"), news.get("node")
    # The image lives in one daemon: another node, or the same name at another address, holds none.
    if not same_node(old_node, new_node) or not same_address(old_node, new_node):
        replaces.append("node")
    updates = [key for key in UPDATE_KEYS if olds.get(key) != news.get(key) and key not in replaces]
    if drifted(olds):
        updates.append("observed_image_id")
    return Change(tuple(replaces), tuple(updates))


@dataclass(frozen=True)
class Build:
    """Run the build (nothing usable is on the head)."""


@dataclass(frozen=True)
class Retag:
    """Point the tag at `image_id`, an image the head still holds; no build."""

    image_id: str


@dataclass(frozen=True)
class Keep:
    """The tag already points at `image_id`: nothing to do."""

    image_id: str


Action = Build | Retag | Keep


def plan_create(props: Mapping[str, Any], head: HeadImage) -> Action:
    """create: a content tag already on the head names an image built from these very inputs (it is
    their hash), so it is kept, not built again; a pinned tag says nothing about content: build."""
    if props.get("content_addressed") and head.tag_id:
        return Keep(head.tag_id)
    return Build()


def plan_restore(recorded_id: str | None, head: HeadImage) -> Action:
    """update: the tag as built (keep), re-pointed at the recorded image (retag), or built again when
    that image is gone from the head too."""
    if recorded_id and head.tag_id == recorded_id:
        return Keep(recorded_id)
    if recorded_id and head.recorded_present:
        return Retag(recorded_id)
    return Build()


def build_id(props: Mapping[str, Any]) -> str:
    """The resource's ID: the head and the reference built there."""
    return f"{props['node'].get('name') or props['node']['host']}/{props['ref']}"


def recorded_id(props: Mapping[str, Any]) -> str | None:
    value = props.get("image_id")
    return value if isinstance(value, str) and IMAGE_ID.match(value) else None


def failure_hint(refused: bool) -> str:
    """What to do after a failed build: a proof's refusal is about the inputs, anything else the head."""
    if refused:
        return (
            "the proof's verdict is above: change the image inputs it names (image.base, image.donor, "
            "image.transformers, image.pip_args) and run `pulumi up` again; nothing was tagged"
        )
    return (
        "the step's output is above; check the head's disk (`docker system df`) and that the base and "
        "donor images are there, then run `pulumi up` again; nothing was tagged"
    )
