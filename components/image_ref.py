"""Docker image references as operators type them: one parser, used wherever config names an image.

Accepted (the grammar of distribution/reference, kept strict so nothing a shell or Docker would
misread gets through): `name`, `name:tag`, `org/name:tag`, `host[:port]/path/name:tag`,
`name@sha256:<64 hex>`, `name:tag@sha256:<64 hex>`. Refused: anything else, with the reason.

Pure and stdlib-only: the Pulumi program, the dynamic providers and the tests all import it. Its
splitting (`split_tag`, the registry rule) and containerd's full form live in the shipped library
`node_programs/wire.py`, so the node programs read a reference exactly as the orchestrator does.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from components.errors import Qwen35Error
from components.node_programs.wire import DEFAULT_TAG, full_reference, split_tag
from components.node_programs.wire import is_registry as _is_registry

# A path component: lowercase alphanumerics joined by '.', '_', '__' or runs of '-'.
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_PATH = re.compile(rf"^{_COMPONENT}(?:/{_COMPONENT})*$")
_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
# Docker's own limit on the name (registry and path) part.
MAX_NAME = 255
_HUB_PREFIXES = ("docker.io/library/", "docker.io/", "index.docker.io/library/", "index.docker.io/")


class ImageRefError(Qwen35Error, ValueError):
    """A string that is not a reference this program accepts; the message says what is wrong."""


@dataclass(frozen=True)
class ImageRef:
    """A parsed reference. `name` is as typed (registry included when given); tag and digest optional."""

    name: str
    tag: str | None = None
    digest: str | None = None

    def __str__(self) -> str:
        return self.name + (f":{self.tag}" if self.tag else "") + (f"@{self.digest}" if self.digest else "")

    @property
    def registry(self) -> str | None:
        """The registry host[:port] when the name carries one (`nvcr.io`, `localhost:5000`)."""
        first, slash, _ = self.name.partition("/")
        return first if slash and _is_registry(first) else None

    @property
    def tagged(self) -> str:
        """`name:tag` (tag `latest` when none was given), without the digest: what `docker tag` holds."""
        return f"{self.name}:{self.tag or DEFAULT_TAG}"

    @property
    def pullable(self) -> str:
        """What Docker resolves: `name@digest` when pinned (Docker ignores a tag beside a digest)."""
        return f"{self.name}@{self.digest}" if self.digest else self.tagged

    @property
    def familiar(self) -> str:
        """The short form `docker images` shows: `docker.io/library/x:1` -> `x:1`."""
        return familiar_reference(str(self))

    @property
    def full(self) -> str:
        """The fully qualified form containerd records: `x:1` -> `docker.io/library/x:1`."""
        return full_reference(str(self))


def parse_image_ref(text: object) -> ImageRef:
    """Parse one reference or raise ImageRefError saying what is wrong (the caller names the field)."""
    if not isinstance(text, str):
        raise ImageRefError(f"{text!r} is not a string")
    if not text:
        raise ImageRefError("empty image reference")
    if text != text.strip() or any(ch.isspace() for ch in text):
        raise ImageRefError(f"{text!r} contains whitespace")
    if not text.isascii() or not text.isprintable():
        raise ImageRefError(f"{text!r} contains characters Docker does not accept in a reference")
    remainder, at, digest = text.partition("@")
    if at and not _DIGEST.match(digest):
        raise ImageRefError(f"{text!r}: the digest must be sha256: followed by 64 lowercase hex digits")
    name, tag = split_tag(remainder, None)  # a registry port is never taken for a tag
    if tag is not None and not _TAG.match(tag):
        raise ImageRefError(
            f"{text!r}: tag {tag!r} is not valid (letters, digits, '_', '.', '-'; "
            "not starting with '.' or '-'; at most 128)"
        )
    if not name:
        raise ImageRefError(f"{text!r} has no image name")
    if len(name) > MAX_NAME:
        raise ImageRefError(f"{text!r}: the name is longer than {MAX_NAME} characters")
    first, slash, rest = name.partition("/")
    path = rest if slash and _is_registry(first) else name
    if slash and not rest:
        raise ImageRefError(f"{text!r} ends with '/'")
    if not _PATH.match(path):
        raise ImageRefError(
            f"{text!r}: {path!r} is not a valid repository name (lowercase letters, digits and "
            "single '.', '_', '__' or '-' between them, path parts joined by '/')"
        )
    return ImageRef(name=name, tag=tag, digest=digest or None)


def familiar_reference(reference: str) -> str:
    """`docker.io/library/x:1` -> `x:1` (how `docker image inspect` and RepoTags show names)."""
    for prefix in _HUB_PREFIXES:
        if reference.startswith(prefix):
            return reference[len(prefix) :]
    return reference


def split_tagged(reference: str) -> tuple[str, str]:
    """`name:tag` -> (`name`, `tag`); a registry port is never taken for a tag. Tag required."""
    ref = parse_image_ref(reference)
    if ref.tag is None or ref.digest is not None:
        raise ImageRefError(f"{reference!r} is not of the form name:tag")
    return ref.name, ref.tag
