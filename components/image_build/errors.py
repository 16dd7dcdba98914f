"""What can go wrong with an ImageBuild, as exception types (the package's only ones)."""

from __future__ import annotations

from components.errors import Qwen35Error
from components.remote import stderr_tail


class FactsError(ValueError):
    """The head answered something this program cannot read."""


class ImageBuildError(Qwen35Error, RuntimeError):
    """The build (or the tag after it) failed on the head: which node, which stage, the output's last
    lines, and what to do next."""

    def __init__(self, node: str, ref: str, stage: str, output: str, hint: str):
        self.node, self.ref, self.stage, self.output, self.hint = node, ref, stage, output, hint
        lines = [f"{node}: building {ref} failed at {stage}"]
        tail = stderr_tail(output, lines=25)
        if tail:
            lines.append("  output: " + tail.replace("\n", "\n          "))
        lines.append(f"  next: {hint}")
        super().__init__("\n".join(lines))
