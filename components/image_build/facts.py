"""What the head's Docker says, parsed into values: where the tag points, whether an image ID is
still there, the image a build produced, and where a build's log says it stopped. Pure: the
commands are in `programs.py`, running them is `execute.py`'s."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from components.image_build.errors import FactsError
from components.image_ref import ImageRefError, familiar_reference, parse_image_ref
from components.remote import Result

IMAGE_ID = re.compile(r"^sha256:[0-9a-f]{64}$")
# `docker image inspect` of a name or ID the daemon does not hold (one line per missing object).
_MISSING = re.compile(r"^(Error: |Error response from daemon: )?No such (image|object): ", re.IGNORECASE)
# A Dockerfile step as each builder announces it: the legacy builder's `Step 3/9 : RUN …` and
# BuildKit's `#8 [proof 2/4] RUN …` (plain progress).
_LEGACY_STEP = re.compile(r"^Step \d+/\d+ : (.+)$")
_BUILDKIT_STEP = re.compile(r"^#\d+ \[([^\]]+)\] (.+)$")
# What the patches' RUN steps print when a proof refuses the image (patches/Dockerfile*).
# Colour codes: the legacy builder paints a step's stderr red (`\x1b[91m…\x1b[0m`).
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_PROOF_FAILED = re.compile(r"\b([a-z-]+ proof|graft) failed \(exit (\d+)\)")


def plain(line: str) -> str:
    """A build output line without terminal colour codes (for the operator's display and parsing)."""
    return _ANSI.sub("", line)


# The label a build puts on its image for each source image (a build arg naming an image: the base,
# the donor): the ID that source had when the build ran. A content tag's image is kept only while
# every source still has that ID.
SOURCE_LABEL_PREFIX = "qwen35.source."


def source_label(arg: str) -> str:
    """The label key recording the source image of build arg `arg`: `qwen35.source.base_image`."""
    return SOURCE_LABEL_PREFIX + arg.lower()


@dataclass(frozen=True)
class HeadImage:
    """The head's Docker: the ID the tag points at (None: no such tag), whether the recorded image
    ID is still there (a re-tag can restore the tag without a build), the sources the tag's image
    was built from (its labels: build arg -> image ID), and each source's ID now ("": not there)."""

    tag_id: str | None
    recorded_present: bool
    tag_sources: Mapping[str, str] = field(default_factory=dict)
    sources: Mapping[str, str] = field(default_factory=dict)


def _names(reference: str) -> set[str]:
    """How `docker image inspect` may list `reference` in RepoTags or RepoDigests (`:latest` implied)."""
    try:
        parsed = parse_image_ref(reference)
    except ImageRefError:
        return {familiar_reference(reference)}
    tagged = reference if parsed.tag or parsed.digest else f"{reference}:latest"
    return {familiar_reference(tagged)}


def _inspected(line: str) -> tuple[str, set[str], dict[str, str]]:
    """One line of INSPECT_FORMAT: the ID, every name it is listed under, its labels."""
    image_id, tags, digests, labels = (line.strip().split(" ", 3) + ["null"] * 3)[:4]
    if not IMAGE_ID.match(image_id):
        raise FactsError(f"docker image inspect printed {line[:120]!r}, not an image ID")
    try:
        names = {familiar_reference(n) for n in (json.loads(tags) or []) + (json.loads(digests) or [])}
        found = json.loads(labels) or {}
    except (ValueError, TypeError) as exc:
        raise FactsError(f"docker image inspect printed {line[:120]!r}: {exc}") from None
    return image_id, names, {str(k): str(v) for k, v in found.items()}


def parse_head_image(
    result: Result, ref: str, recorded_id: str | None, sources: Mapping[str, str] | None = None
) -> HeadImage:
    """`docker image inspect --format INSPECT_FORMAT REF [ID] [SOURCE…]` (programs.inspect_argv):
    one line per object found; exit 1 with `No such image` for each one missing (that is an answer,
    not a failure). `sources`: build arg -> the image reference it names."""
    other = [line for line in result.err.splitlines() if line.strip() and not _MISSING.match(line.strip())]
    if result.returncode not in (0, 1) or other:
        raise FactsError(f"docker image inspect failed (exit {result.returncode}): {' '.join(other)[-300:]}")
    sources = dict(sources or {})
    tag_id, present, labels = None, False, {}
    found = dict.fromkeys(sources, "")
    for line in result.text.splitlines():
        if not line.strip():
            continue
        image_id, names, image_labels = _inspected(line)
        if _names(ref) & names:
            tag_id, labels = image_id, image_labels
        present = present or image_id == recorded_id
        for arg, source in sources.items():
            if source == image_id or _names(source) & names:
                found[arg] = image_id
    built_from = {arg: labels[source_label(arg)] for arg in sources if source_label(arg) in labels}
    return HeadImage(tag_id, present, built_from, found)


def parse_image_id(result: Result) -> str:
    """`docker image inspect --format '{{.Id}}' REF` of the image a build just tagged."""
    found = result.out
    if not result.ok or not IMAGE_ID.match(found):
        raise FactsError(
            f"the built image could not be inspected (exit {result.returncode}): {result.err[-300:]}"
        )
    return found


@dataclass(frozen=True)
class BuildLog:
    """A build's output read for people: the last step it started and any proof that refused."""

    last_step: str | None
    refusals: tuple[str, ...]

    @property
    def stage(self) -> str:
        """Where the build stopped, as the error names it: the refusing proof, else the step."""
        step = f"step `{self.last_step[:100]}`" if self.last_step else "the start (no step ran)"
        if self.refusals:
            return f"{self.refusals[-1]} ({step})"
        return step


def parse_build_log(lines: Iterable[str]) -> BuildLog:
    """The steps and proof refusals in a build's output (stdout and stderr, in any order)."""
    last_step, refusals = None, []
    for raw in lines:
        line = plain(raw).strip()
        legacy, buildkit = _LEGACY_STEP.match(line), _BUILDKIT_STEP.match(line)
        if legacy:
            last_step = legacy.group(1)
        elif buildkit and not buildkit.group(2).startswith(("DONE", "CACHED", "ERROR")):
            last_step = f"[{buildkit.group(1)}] {buildkit.group(2)}"
        refused = _PROOF_FAILED.search(line)
        if refused:
            refusals.append(f"the {refused.group(1)} (exit {refused.group(2)})")
    return BuildLog(last_step, tuple(dict.fromkeys(refusals)))
