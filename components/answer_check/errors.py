"""What can go wrong with an AnswerCheck, as exception types."""

from __future__ import annotations

from components.errors import Qwen35Error
from components.remote import RemoteError, stderr_tail


class CheckFailed(RemoteError):
    """The check ran on the head and could not record the answers (a request failed, or its deadline
    passed)."""

    def _message(self) -> str:
        if self.transport_failed:
            return super()._message()
        lines = [f"{self.node}: the answer check could not record the answers (exit {self.returncode})"]
        lines.append(stderr_tail(self.stderr, lines=20))
        if self.hint:
            lines.append(f"  next: {self.hint}")
        return "\n".join(lines)


class WrongAnswers(Qwen35Error):
    """Under `answers.mode: enforce`, answers the judgement refused: each prompt's first divergent
    token named, with the position, the expected and served tokens and the logprob gap."""

    def __init__(self, node: str, problems: list[str], judged_against: list[str]):
        self.node = node
        self.problems = problems
        against = ", ".join(judged_against) or "nothing"
        lines = [f"answer check on {node}: {len(problems)} problem(s), judged against {against}:"]
        lines += [f"  - {p}" for p in problems]
        lines.append(
            "  next: a served token far below the expected one is a kernel computing wrong (docs/answers.md "
            "lists the known ones on GB10: VLLM_DISABLED_KERNELS, the MoE backend, speculative decoding "
            "with CUDA graphs); fix it and `pulumi up` checks again, or set answers.mode to report"
        )
        super().__init__("\n".join(lines))
