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
# Inputs recorded in place: how the head is reached, the build's network, how the tag was chosen,
# which build args name the images the build follows (`sources`: a stack made before they were
# followed records its sources' IDs on its first `up`, building nothing).
# Not `context`: it is where this checkout is on the operator's machine, and an `up` from another
# clone must change nothing (`context_digest` says what is in it).
UPDATE_KEYS = ("node", "network", "content_addressed", "sources")
# `source_ids`: each source image's ID the build ran on; `observed_source_ids`: as the last read
# found them on the head ("" where gone).
OUTPUT_KEYS = ("image_id", "observed_image_id", "source_ids", "observed_source_ids", "built", "seconds")
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
    problems += _sources_problems(props.get("sources"), props.get("build_args"))
    problems += _rules_problems(props.get("context_rules"))
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


def _sources_problems(sources: Any, args: Any) -> list[tuple[str, str]]:
    if not known(sources) or sources is None:
        return []
    if not isinstance(sources, list | tuple) or not all(isinstance(s, str) for s in sources):
        return [("sources", f"a list of build-arg names, not {str(sources)[:40]!r}")]
    if not known(args) or not isinstance(args, Mapping):
        return []
    return [
        ("sources", f"{name!r} is not one of the build args ({', '.join(sorted(args)) or 'none'})")
        for name in sources
        if name not in args
    ]


def _rules_problems(rules: Any) -> list[tuple[str, str]]:
    if not known(rules) or rules is None:
        return []
    if isinstance(rules, list | tuple) and all(isinstance(r, str) and "\n" not in r for r in rules):
        return []
    return [("context_rules", f"a list of one-line .dockerignore rules, not {str(rules)[:40]!r}")]


def drifted(props: Mapping[str, Any]) -> bool:
    """A refresh found the head's tag gone or pointing at another image than the one built."""
    return bool(props.get("image_id")) and props.get("observed_image_id") != props.get("image_id")


def moved_sources(built_from: Any, now: Any) -> list[str]:
    """The source images (build args) the head now holds under another ID than the build ran on.
    A source gone from the head is not one: nothing could be built from it, and the image stands."""
    if not isinstance(built_from, Mapping) or not isinstance(now, Mapping):
        return []
    return sorted(arg for arg, was in built_from.items() if was and now.get(arg) and now[arg] != was)


def sources_drifted(props: Mapping[str, Any]) -> bool:
    """A refresh found a base or donor image rebuilt under its reference since the build."""
    return bool(moved_sources(props.get("source_ids"), props.get("observed_source_ids")))


def built_from_current(head: HeadImage, sources: Any) -> bool:
    """The tag's image was built from every source image the head holds now (its labels say so)."""
    return all(
        head.sources.get(arg) and head.tag_sources.get(arg) == head.sources[arg] for arg in sources or ()
    )


def plan_change(olds: Mapping[str, Any], news: Mapping[str, Any]) -> Change:
    """From recorded state and new inputs, no I/O: another image replaces (a build on create), access
    details and drift are updates (`up` restores the tag), anything else leaves it alone. A
    replacement creates first: the new image is tagged before the old resource goes (and its delete
    leaves the head alone), so what runs keeps its image throughout."""
    replaces = [key for key in REPLACE_KEYS if olds.get(key) != news.get(key)]
    old_node, new_node = olds.get("node"), news.get("node")
    # The image lives in one daemon: another node, or the same name at another address, holds none.
    if not same_node(old_node, new_node) or not same_address(old_node, new_node):
        replaces.append("node")
    updates = [key for key in UPDATE_KEYS if olds.get(key) != news.get(key) and key not in replaces]
    if drifted(olds):
        updates.append("observed_image_id")
    # A base or donor rebuilt under the same reference: the same inputs, another image; `up` builds
    # under the same tag, and what runs the image follows its new ID.
    if sources_drifted(olds):
        updates.append("observed_source_ids")
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
    their hash) and, its labels say, from the source images the head holds now: it is kept, not built
    again. A pinned tag says nothing about content, and a source rebuilt since is another input: build."""
    if props.get("content_addressed") and head.tag_id and built_from_current(head, props.get("sources")):
        return Keep(head.tag_id)
    return Build()


def plan_restore(
    recorded_id: str | None, head: HeadImage, built_from: Mapping[str, str] | None = None
) -> Action:
    """update: a source image rebuilt since the build (`built_from`: the recorded source IDs) builds
    again; otherwise the tag as built (keep), re-pointed at the recorded image (retag), or built again
    when that image is gone from the head too."""
    if moved_sources(built_from, head.sources):
        return Build()
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
