"""Docker commands on one node over SSH, with errors that name the node and what to do."""

from __future__ import annotations

import json

from components.node_image.errors import NodeImageError
from components.node_image.facts import (
    INFO_FORMAT,
    INSPECT_FORMAT,
    Facts,
    ImageInfo,
    parse_blobs,
    parse_daemon,
    parse_images,
)
from components.node_image.inputs import Node
from components.node_programs import program_argv
from components.node_programs.image_tag import Exit as TagExit
from components.remote import (
    SSH_TRANSPORT_FAILURE,
    RemoteError,
    Result,
    stderr_tail,
    with_retries,
)
from components.transfer import DestinationEnd


def facts_argv(ref: str, history: bool = False, inventory: bool = False, python: bool = False) -> list[str]:
    """One command for a node's facts (`node_programs/docker_facts.py`): the daemon and image `ref`,
    optionally its layer sizes and the node's inventory (every image's layers, free bytes under
    Docker's root, a containerd store's layer blobs); always the node's system python3 (`python` is
    kept for callers: it costs nothing more)."""
    spec = {
        "ref": ref,
        "history": history,
        "inventory": inventory,
        "info_format": INFO_FORMAT,
        "image_format": INSPECT_FORMAT,
    }
    return program_argv("docker_facts", [json.dumps(spec, separators=(",", ":"))])


def parse_facts(node: Node, ref: str, text: str, history: bool, inventory: bool, python: bool) -> Facts:
    """The Facts in `docker_facts`' report (pure)."""
    report = json.loads(text.strip().splitlines()[-1])
    found = parse_images(report.get("image") or "")
    facts = Facts(node, ref, parse_daemon(report["info"]), found[0] if found else None)
    facts.history = report.get("history") or ""
    facts.python = report.get("python") or "python3"
    if inventory:
        facts.images, facts.free = parse_images(report.get("images") or ""), int(report.get("free") or 0)
        facts.blobs = parse_blobs("\n".join(report.get("blobs") or []))
        facts.blobs_unlisted = tuple(str(why) for why in report.get("blobs_unlisted") or [])
    return facts


def facts_stderr(stdout: str, stderr: str) -> str:
    """What went wrong in a failed `docker_facts`: the stderr its report carries, else the session's."""
    try:
        return str(json.loads(stdout.strip().splitlines()[-1]).get("stderr") or stderr)
    except (ValueError, IndexError, AttributeError):
        return stderr


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
        result = self.run(facts_argv(ref, history, inventory, python), check=False)
        if not result.ok:
            raise self.facts_failed(result.returncode, facts_stderr(result.out, result.err))
        return parse_facts(self.node, ref, result.text, history, inventory, python)

    def facts_failed(self, status: int, stderr: str) -> NodeImageError:
        """The error for facts gathered elsewhere (the source's session) that failed."""
        argv = ["docker_facts"]
        hint = f"start Docker on {self.node.label} (systemctl start docker), check `docker info`"
        if status == SSH_TRANSPORT_FAILURE:
            hint = (
                f"check that {self.node.label} ({self.node.target.host}:{self.node.target.port}) is up, "
                f"that sshd runs there and that its host key is in {self.node.target.known_hosts}"
            )
        return NodeImageError(
            f"{self.role} " + str(RemoteError(self.node.label, argv[:1], status, stderr, hint))
        )

    def tags(self, mode: str, spec: dict, python: str = "python3", end: DestinationEnd | None = None) -> dict:
        """Run `image_tag MODE SPEC` on the node (retag, join, leave); its report. `end`: the
        destination's end, with nothing to serve, runs it in its session (no new one)."""
        argv = program_argv("image_tag", [mode, json.dumps(spec, separators=(",", ":"))], python)
        ran = end.run(argv) if end is not None else None
        if ran is not None:
            result = Result(tuple(argv), ran[0], ran[1].encode(), ran[2].encode(), self.node.label)
        else:
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
        result = self.run(["docker", "image", "inspect", "--format", INSPECT_FORMAT, ref], check=False)
        if result.ok:
            return parse_images(result.text)[0]
        if b"No such image" in result.stderr or b"no such image" in result.stderr.lower():
            return None
        self.run(["docker", "image", "inspect", ref], hint=f"check `docker info` on {self.node.label}")
        return None

    def untag(self, ref: str) -> Result:
        return self.run(["docker", "image", "rm", ref], check=False)
