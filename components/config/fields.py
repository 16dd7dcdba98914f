"""What every section shares: the base model, the field types, the name patterns and the checks of
one field, and the error a section raises to report several fields at once.
"""

from __future__ import annotations

import ipaddress
import re
from enum import Enum
from pathlib import Path
from typing import Annotated, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field

from components.image_ref import ImageRefError, parse_image_ref

# The directory of Pulumi.yaml: relative paths in a stack file mean this checkout's files, wherever
# it was cloned (a stack file is committed; one checkout's absolute path is wrong in every other).
PROJECT_DIR = Path(__file__).resolve().parents[2]

# Names that reach Docker and a shell: strict patterns, checked before anything runs.
NODE_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
HOSTNAME = re.compile(
    r"^(?=.{1,253}$)([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$"
)
USER = re.compile(r"^[a-z_][a-z0-9_.-]{0,31}$")
HCA = re.compile(r"^[A-Za-z0-9_.-]{1,64}(:[0-9]{1,2})?$")
ABS_PATH = re.compile(r"^(/|~/)[A-Za-z0-9_./@+-]*$")
# A Linux network interface name (IFNAMSIZ: at most 15 characters).
IFNAME = re.compile(r"^[A-Za-z0-9_.:-]{1,15}$")

Port = Annotated[int, Field(ge=1, le=65535)]
# A node's Docker image store: the one definition (NodeImage, the copy tree and config use it).
ImageStore = Literal["classic", "containerd"]
IMAGE_STORES: tuple[str, ...] = get_args(ImageStore)


class CheckMode(str, Enum):
    """What a check does with what it finds: the one vocabulary of `answers.mode`, `bench.mode`,
    `health.mode`, `fabric.check` and `fabric.node_proof` (each key's comment says what its check
    does under each). The order is the one every refusal lists the values in."""

    # Act on what is found: fail `up` (or, for health, recover the server).
    ENFORCE = "enforce"
    # Record what is found and go on: a failure is a warning.
    REPORT = "report"
    # No check.
    OFF = "off"


class _Model(BaseModel):
    """Every section's base: an unknown key is refused, values are frozen, strings stripped."""

    model_config = ConfigDict(extra="forbid", frozen=True, str_strip_whitespace=True)


def _check_host(value: str) -> str:
    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        pass
    if not HOSTNAME.match(value) or value.replace(".", "").isdigit():
        raise ValueError(f"{value!r} is neither an IP address nor a valid hostname")
    return value


def _check_user(value: str) -> str:
    if not USER.match(value):
        raise ValueError(f"{value!r} is not a valid user name")
    return value


def _check_path(value: str | None) -> str | None:
    if value is not None and not ABS_PATH.match(value):
        raise ValueError(f"{value!r}: give an absolute path (or ~/…) without spaces or shell characters")
    return value


def _check_ref(value: str, *, tag_required: bool = False) -> str:
    try:
        ref = parse_image_ref(value)
    except ImageRefError as exc:
        raise ValueError(str(exc)) from None
    if tag_required and ref.tag is None and ref.digest is not None:
        raise ValueError(
            f"{value!r}: a digest alone gives NodeImage no tag to place on the nodes: "
            "write name:tag@sha256:… (the tag the head holds the image under)"
        )
    return value


def _check_ifname(value: str) -> str:
    if not IFNAME.match(value):
        raise ValueError(f"{value!r} is not a network interface name (e.g. enp1s0f0np0)")
    return value


def _check_hcas(value: list[str] | None) -> list[str] | None:
    for hca in value or ():
        if not HCA.match(hca):
            raise ValueError(f"{hca!r} is not an HCA name (e.g. rocep1s0f0 or rocep1s0f0:1)")
    return value


class _CrossFieldErrors(ValueError):
    """Several `(path, message)` problems from one validator; loading lists each on its own line."""

    def __init__(self, problems: list[tuple[str, str]]):
        self.problems = problems
        super().__init__("; ".join(f"{p}: {m}" for p, m in problems))
