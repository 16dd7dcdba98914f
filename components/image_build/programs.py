"""What the build runs on the head, as argument lists, and its stdin: the build context as a tar
made on the operator's machine. Building these touches no node (the context functions read this
machine's files)."""

from __future__ import annotations

import hashlib
import posixpath
import re
import tarfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, BinaryIO

from components.image_build.facts import source_label

# Wheels for a build without a package index: patches/wheels/ (ignored by git and left out of the
# context by patches/.dockerignore) is sent, and lands at this path, only when `image.pip_args`
# name the path (context_rules); otherwise stray wheels there neither change the tag nor
# reach the image.
WHEELS_DIR = "wheels"
WHEELS_IN_IMAGE = "/opt/qwen35/wheels"
# Never build inputs, whatever `.dockerignore` says.
_IGNORED = {"__pycache__", ".pytest_cache"}
# Docker's own file of context exclusions (its syntax: one pattern a line, `#` comments, `!` an
# exception, `*` `?` `[…]` within a path segment, `**` across segments; a match of a folder is a
# match of everything in it; the last pattern that matches decides).
DOCKERIGNORE = ".dockerignore"
# The build's own tag until the image is proven and tagged as `ref`: a refused or broken build
# never moves the real tag.
BUILD_TAG_PREFIX = "qwen35-build-"
# One line per object: its ID, tags, digests and labels (the tag's image and the sources it was
# built from, whether a recorded ID is there, each source image's ID).
INSPECT_FORMAT = "{{.Id}} {{json .RepoTags}} {{json .RepoDigests}} {{json .Config.Labels}}"


def _segment_regex(pattern: str) -> str:
    """A `.dockerignore` pattern as a regular expression over a `/`-separated relative path."""
    out, i = [], 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
            continue
        if pattern.startswith("**", i):
            out.append(".*")
            i += 2
            continue
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[" and "]" in pattern[i + 1 :]:
            end = pattern.index("]", i + 2 if pattern[i + 1 : i + 2] in ("!", "^") else i + 1)
            body = pattern[i + 1 : end]
            out.append("[" + ("^" + body[1:] if body[:1] in ("!", "^") else body).replace("\\", "\\\\") + "]")
            i = end
        elif c == "\\" and i + 1 < len(pattern):
            i += 1
            out.append(re.escape(pattern[i]))
        else:
            out.append(re.escape(c))
        i += 1
    return "".join(out)


def ignore_rules(context: Path, extra: Iterable[str] = ()) -> list[tuple[re.Pattern[str], bool]]:
    """The context's `.dockerignore` patterns, then `extra` (the same syntax), each compiled with
    whether it is an exception (`!`)."""
    path = context / DOCKERIGNORE
    lines = path.read_text().splitlines() if path.is_file() else []
    rules = []
    for raw in [*lines, *extra]:
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        keep = line.startswith("!")
        cleaned = posixpath.normpath(line.removeprefix("!").strip()).lstrip("/")
        if cleaned in ("", "."):
            continue
        rules.append((re.compile(f"^{_segment_regex(cleaned)}$"), keep))
    return rules


def ignored(relative: str, rules: list[tuple[re.Pattern[str], bool]]) -> bool:
    """Whether the rules leave `relative` (a file, `/`-separated) out: a pattern matches the file or
    a folder above it, and the last that matches decides."""
    parts = relative.split("/")
    candidates = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    left_out = False
    for pattern, keep in rules:
        if any(pattern.match(candidate) for candidate in candidates):
            left_out = not keep
    return left_out


def context_files(context: Path, extra: Iterable[str] = ()) -> list[Path]:
    """The files the build sends, in a stable order: the context's files less those `.dockerignore`
    (and the `extra` rules after it) leaves out."""
    rules = ignore_rules(context, extra)
    return sorted(
        p
        for p in context.rglob("*")
        if p.is_file()
        and not (_IGNORED & set(p.relative_to(context).parts))
        and p.suffix != ".pyc"
        and not ignored(p.relative_to(context).as_posix(), rules)
    )


def context_rules(args: Mapping[str, str]) -> list[str]:
    """The `.dockerignore` rules a build adds to the context's own: the wheels folder back in when
    its pip flags (the PIP_ARGS build arg) install from it."""
    return [f"!{WHEELS_DIR}"] if WHEELS_IN_IMAGE in args.get("PIP_ARGS", "") else []


def missing_wheels(context: Path, extra: Iterable[str] = ()) -> str | None:
    """Why a build whose rules send the wheels folder (context_rules) cannot install from it (None:
    it can)."""
    if f"!{WHEELS_DIR}" in list(extra) and not any((context / WHEELS_DIR).glob("*.whl")):
        return f"image.pip_args name {WHEELS_IN_IMAGE} but {context / WHEELS_DIR} holds no wheel"
    return None


def context_digest(context: Path, extra: Iterable[str] = ()) -> str:
    """A digest of the files the build sends (names, contents, run bits): a new one is a new image.
    Each file is hashed as it is read, a block at a time."""
    digest = hashlib.sha256()
    for path in context_files(context, extra):
        mode = b"x" if path.stat().st_mode & 0o111 else b"-"
        digest.update(str(path.relative_to(context)).encode() + b"\0" + mode)
        with path.open("rb") as data:
            digest.update(hashlib.file_digest(data, "sha256").digest())
    return "sha256:" + digest.hexdigest()


def write_context(context: Path, out: BinaryIO, extra: Iterable[str] = ()) -> None:
    """The context as `docker build -` reads it: a tar with fixed owners and times, written file by
    file as it is made (the head reads it from ssh's stdin; nothing lands on either machine's disk)."""
    with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        for path in context_files(context, extra):
            info = tarfile.TarInfo(path.relative_to(context).as_posix())
            info.size = path.stat().st_size
            info.mode = 0o755 if path.stat().st_mode & 0o111 else 0o644
            info.mtime, info.uid, info.gid = 0, 0, 0
            with path.open("rb") as data:
                tar.addfile(info, data)


def build_ref(ref: str, token: str) -> str:
    """The build's temporary tag in the same repository: `name:qwen35-build-<token>`."""
    return f"{ref.rpartition(':')[0]}:{BUILD_TAG_PREFIX}{token}"


def source_refs(props: Mapping[str, Any]) -> dict[str, str]:
    """The images the build follows: each build arg named in `sources` -> the reference it passes."""
    args = props.get("build_args") or {}
    return {arg: str(args[arg]) for arg in props.get("sources") or () if args.get(arg)}


def build_argv(props: Mapping[str, Any], tag: str, source_ids: Mapping[str, str] | None = None) -> list[str]:
    """`docker build` on the head's daemon of the context read from stdin, tagged `tag` only, labelled
    with the ID of each source image it builds from (`source_ids`, build arg -> ID)."""
    argv = ["docker", "build", "--file", str(props["dockerfile"]), "--platform", str(props["platform"])]
    if props.get("network"):
        argv += ["--network", str(props["network"])]
    for key, value in sorted((props.get("build_args") or {}).items()):
        argv += ["--build-arg", f"{key}={value}"]
    for key, value in sorted((source_ids or {}).items()):
        if value:
            argv += ["--label", f"{source_label(key)}={value}"]
    # The legacy builder keeps a failed step's container unless told: a refused build leaves none.
    return [*argv, "--tag", tag, "--rm", "--force-rm", "-"]


def inspect_argv(ref: str, recorded_id: str | None = None, sources: Iterable[str] = ()) -> list[str]:
    """Where `ref` points, whether the recorded image ID is still on the head, and the ID of each
    source image, in one call."""
    objects = [ref, *([recorded_id] if recorded_id else []), *dict.fromkeys(sources)]
    return ["docker", "image", "inspect", "--format", INSPECT_FORMAT, *objects]


def image_id_argv(ref: str) -> list[str]:
    return ["docker", "image", "inspect", "--format", "{{.Id}}", ref]


def tag_argv(image: str, ref: str) -> list[str]:
    """Point `ref` at `image` (an ID or another tag)."""
    return ["docker", "tag", image, ref]


def untag_argv(tag: str) -> list[str]:
    """Drop a tag only: the image stays under its other tag, and its parents are never pruned."""
    return ["docker", "image", "rm", "--no-prune", tag]
