"""Execute's connector to one node's Docker over SSH (I/O): it runs `programs.py`'s argv there,
parses with `facts.py`, and raises errors that name the node and what to do."""

from __future__ import annotations

from components.node_image.errors import NodeImageError
from components.node_image.facts import (
    Facts,
    ImageInfo,
    facts_stderr,
    parse_facts,
    parse_images,
    parse_tag_report,
)
from components.node_image.inputs import Node
from components.node_image.programs import facts_argv, inspect_argv, tag_argv, untag_argv
from components.node_programs.image_tag import Exit as TagExit
from components.remote import (
    SSH_TRANSPORT_FAILURE,
    RemoteError,
    Result,
    stderr_tail,
    with_retries,
)
from components.transfer import DestinationEnd


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
                hint = self._unreachable_hint()
            raise NodeImageError(
                f"{self.role} "
                + str(RemoteError(self.node.label, argv, result.returncode, result.stderr, hint))
            )
        return result

    def _unreachable_hint(self) -> str:
        target = self.node.target
        return (
            f"check that {self.node.label} ({target.host}:{target.port}) is up, "
            f"that sshd runs there and that its host key is in {target.known_hosts}"
        )

    def facts(self, ref: str, history: bool = False, inventory: bool = False, python: bool = False) -> Facts:
        """The node's facts (see `programs.facts_argv`) in one round trip."""
        result = self.run(facts_argv(ref, history, inventory, python), check=False)
        if not result.ok:
            raise self.facts_failed(result.returncode, facts_stderr(result.out, result.err))
        return parse_facts(self.node, ref, result.text, history, inventory, python)

    def facts_failed(self, status: int, stderr: str) -> NodeImageError:
        """The error for facts gathered elsewhere (the source's session) that failed."""
        argv = ["docker_facts"]
        hint = f"start Docker on {self.node.label} (systemctl start docker), check `docker info`"
        if status == SSH_TRANSPORT_FAILURE:
            hint = self._unreachable_hint()
        return NodeImageError(
            f"{self.role} " + str(RemoteError(self.node.label, argv[:1], status, stderr, hint))
        )

    def tags(self, mode: str, spec: dict, python: str = "python3", end: DestinationEnd | None = None) -> dict:
        """Run `image_tag MODE SPEC` on the node (retag, join, leave, drop); its report. `end`: the
        destination's end, with nothing to serve, runs it in its session (no new one)."""
        argv = tag_argv(mode, spec, python)
        ran = end.run(argv) if end is not None else None
        if ran is not None:
            result = Result(tuple(argv), ran[0], ran[1].encode(), ran[2].encode(), self.node.label)
        else:
            result = self.run(argv, check=False)
        report = parse_tag_report(result.out)
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
        result = self.run(inspect_argv(ref), check=False)
        if result.ok:
            return parse_images(result.text)[0]
        if b"No such image" in result.stderr or b"no such image" in result.stderr.lower():
            return None
        self.run(inspect_argv(ref, formatted=False), hint=f"check `docker info` on {self.node.label}")
        return None

    def untag(self, ref: str) -> Result:
        return self.run(untag_argv(ref), check=False)
