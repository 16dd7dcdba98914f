"""What the head's Docker says, parsed into values: where the tag points, whether an image ID is
still there, the image a build produced, and where a build's log says it stopped. Pure: the
commands are in `programs.py`, running them is `execute.py`'s."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass

from components.image_build.errors import FactsError
from components.image_ref import familiar_reference
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


@dataclass(frozen=True)
class HeadImage:
    """The head's Docker: the ID the tag points at (None: no such tag), and whether the recorded
    image ID is still there (a re-tag can restore the tag without a build)."""

    tag_id: str | None
    recorded_present: bool


# How Docker Hub's default registry and namespace may be spelled; the daemon lists the short form.
def parse_head_image(result: Result, ref: str, recorded_id: str | None) -> HeadImage:
    """`docker image inspect --format '{{.Id}} {{json .RepoTags}}' REF [ID]`: one line per object
    found; exit 1 with `No such image` for each one missing (that is an answer, not a failure)."""
    other = [line for line in result.err.splitlines() if line.strip() and not _MISSING.match(line.strip())]
    if result.returncode not in (0, 1) or other:
        raise FactsError(f"docker image inspect failed (exit {result.returncode}): {' '.join(other)[-300:]}")
    tag_id, present = None, False
    for line in result.text.splitlines():
        if not line.strip():
            continue
        image_id, _, tags = line.strip().partition(" ")
        if not IMAGE_ID.match(image_id):
            raise FactsError(f"docker image inspect printed {line[:120]!r}, not an image ID")
        if familiar_reference(ref) in {familiar_reference(t) for t in json.loads(tags or "null") or []}:
            tag_id = image_id
        present = present or image_id == recorded_id
    return HeadImage(tag_id, present)


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
