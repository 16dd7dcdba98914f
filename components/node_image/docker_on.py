"""Docker commands on one node over SSH, with errors that name the node and what to do."""

from __future__ import annotations

import json

from components.node_image.errors import NodeImageError
from components.node_image.facts import (
    IMAGE_FORMAT,
    INFO_FORMAT,
    SECTION,
    Facts,
    ImageInfo,
    parse_blobs,
    parse_daemon,
    parse_df_available,
    parse_images,
)
from components.node_image.nodes import Node
from components.node_programs import program_argv
from components.node_programs.image_tag import Exit as TagExit
from components.remote import (
    SSH_TRANSPORT_FAILURE,
    RemoteError,
    Result,
    bash_argv,
    shell_join,
    stderr_tail,
    with_retries,
)

# Where containerd keeps content (layer blobs by digest), under its root: the one dockerd starts
# itself (<docker root>/containerd/daemon) or the system's (Docker 29's default).
CONTENT_BLOBS = "io.containerd.content.v1.content/blobs/sha256"
SYSTEM_CONTAINERD_ROOT = "/var/lib/containerd"


def facts_argv(ref: str, history: bool = False, inventory: bool = False, python: bool = False) -> list[str]:
    """One command for a node's facts: the daemon and image `ref`, optionally its layer sizes, the
    node's inventory (every image's layers, free bytes under Docker's root, a containerd store's
    layer blobs) and its system python3."""
    info = shell_join(["docker", "info", "--format", INFO_FORMAT])
    parts = [
        f"info=$({info}) || exit $?",
        'printf "%s\\n" "$info"',
        f"echo {SECTION}",
        shell_join(["docker", "image", "inspect", "--format", IMAGE_FORMAT, ref]) + " 2>/dev/null || true",
    ]
    if history:
        sizes = ["docker", "history", "--no-trunc", "--human=false", "--format", "{{.Size}}", ref]
        parts += [f"echo {SECTION}", f"{shell_join(sizes)} 2>/dev/null || true"]
    if python:
        # The system interpreter (default PATH), not a version manager's shim: pyenv's costs a
        # process tree per call.
        parts += [f"echo {SECTION}", "command -pv python3 || true"]
    if inventory:
        listing = shell_join(["docker", "image", "inspect", "--format", IMAGE_FORMAT])
        parts += [
            f"echo {SECTION}",
            f"{{ docker image ls -a -q --no-trunc | sort -u | xargs -r {listing}; }} || exit $?",
            f"echo {SECTION}",
            'df -P -B1 "$(printf "%s" "$info" | cut -f2)" || exit $?',
            f"echo {SECTION}",
            # Layer blobs a containerd-store daemon already holds (nothing on a classic store): the
            # content store of the containerd dockerd manages, or of the system's. Unreadable (not
            # root): nothing is listed, every layer is sent.
            "case $info in *io.containerd.snapshotter*) "
            f'for d in "$(printf "%s" "$info" | cut -f2)/containerd/daemon" {SYSTEM_CONTAINERD_ROOT}; '
            f'do ls "$d/{CONTENT_BLOBS}" 2>/dev/null; done; true;; esac',
        ]
    return bash_argv("; ".join(parts), pipefail=True)


def parse_facts(node: Node, ref: str, text: str, history: bool, inventory: bool, python: bool) -> Facts:
    """The Facts in `facts_argv`'s output (pure)."""
    sections = text.split(f"{SECTION}\n")
    found = parse_images(sections[1])
    facts = Facts(node, ref, parse_daemon(sections[0]), found[0] if found else None)
    rest = sections[2:]
    if history:
        facts.history = rest.pop(0)
    if python:
        facts.python = rest.pop(0).strip() or "python3"
    if inventory:
        facts.images, facts.free = parse_images(rest.pop(0)), parse_df_available(rest.pop(0))
        facts.blobs = parse_blobs(rest.pop(0))
    return facts


class DockerOn:
    """Docker commands on one node, with errors that name the node and what to do."""

    def __init__(self, node: Node, role: str, control_path: str | None = None):
        self.node, self.role = node, role
        self.transport = node.transport(control_path)

    def run(self, argv: list[str], hint: str = "", timeout: float = 120.0, check: bool = True) -> Result:
        try:
            result = with_retries(lambda: self.transport.run(argv, timeout=timeout), deadline_s=20.0)
        except RemoteError as exc:
            raise NodeImageError(f"{self.role} {exc}") from exc
        if check and not result.ok:
            if result.returncode == SSH_TRANSPORT_FAILURE:
                hint = (
                    f"check that {self.node.label} ({self.node.target.host}:{self.node.target.port}) is up, "
                    f"that sshd runs there and that its host key is in {self.node.target.known_hosts}"
                )
            raise NodeImageError(
                f"{self.role} "
                + str(RemoteError(self.node.label, argv, result.returncode, result.stderr, hint))
            )
        return result

    def facts(self, ref: str, history: bool = False, inventory: bool = False, python: bool = False) -> Facts:
        """The node's facts (see `facts_argv`) in one round trip."""
        result = self.run(
            facts_argv(ref, history, inventory, python),
            hint=f"start Docker on {self.node.label} (systemctl start docker), check `docker info`",
        )
        return parse_facts(self.node, ref, result.text, history, inventory, python)

    def facts_failed(self, status: int, stderr: str) -> NodeImageError:
        """The error for facts gathered elsewhere (the source's session) that failed."""
        argv = facts_argv("…")
        hint = f"start Docker on {self.node.label} (systemctl start docker), check `docker info`"
        if status == SSH_TRANSPORT_FAILURE:
            hint = (
                f"check that {self.node.label} ({self.node.target.host}:{self.node.target.port}) is up, "
                f"that sshd runs there and that its host key is in {self.node.target.known_hosts}"
            )
        return NodeImageError(
            f"{self.role} " + str(RemoteError(self.node.label, argv[:1], status, stderr, hint))
        )

    def tags(self, mode: str, spec: dict, python: str = "python3") -> dict:
        """Run `image_tag MODE SPEC` on the node (retag, join, leave); its report."""
        argv = program_argv("image_tag", [mode, json.dumps(spec, separators=(",", ":"))], python)
        result = self.run(argv, check=False)
        try:
            report = json.loads(result.out.splitlines()[-1]) if result.out else {}
        except ValueError:
            report = {}
        if result.returncode == SSH_TRANSPORT_FAILURE or (result.returncode and not report):
            self.run(argv, hint=f"check `docker images` on {self.node.label}")  # raises, naming the node
        if report.get("exit", 0) == TagExit.TAG_FAILED:
            raise NodeImageError(
                f"{self.role} {self.node.label}: {report.get('outcome')} for {spec.get('ref')}: "
                f"{stderr_tail(report.get('stderr') or '', 3)}; next: check `docker images` on "
                f"{self.node.label}, remove the tag by hand if needed (docker image rm {spec.get('ref')})"
            )
        return report

    def image(self, ref: str) -> ImageInfo | None:
        result = self.run(["docker", "image", "inspect", "--format", IMAGE_FORMAT, ref], check=False)
        if result.ok:
            return parse_images(result.text)[0]
        if b"No such image" in result.stderr or b"no such image" in result.stderr.lower():
            return None
        self.run(["docker", "image", "inspect", ref], hint=f"check `docker info` on {self.node.label}")
        return None

    def untag(self, ref: str) -> Result:
        return self.run(["docker", "image", "rm", ref], check=False)
