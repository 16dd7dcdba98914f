"""The answer check program (`components/node_programs/answer_check.py`) as the head runs it: its
argv, its source with the prompt set and the API key, and what its exit status means (its report is
parsed in `facts.py`).

It arrives on stdin (`python3 -`, `program_stdin`): the API key set in its environment by its
prelude, as the readiness probe's and the bench's are (never in a command line or a log), and the
prompt set, with the reference's token ids and the continuations to score, as the JSON text
`ANSWER_SPEC` the prelude assigns.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from components.answer_check.prompts import VERSION, prompt_set
from components.node_programs import program_stdin, stdin_argv
from components.node_programs.answer_check import Exit as AnswerExit
from components.node_programs.wire import PROBE_API_KEY_ENV

# What the program's exit status tells the operator to do (declared once, in the node program).
EXIT_HINTS = {
    AnswerExit.FAILED: "the prompt, the stage and the server's answer are above: read the server's log on "
    "the head (`docker logs`), fix the cause, then `pulumi up` checks again",
    AnswerExit.REJECTED: "set qwen35-spark:api_key to the server's key",
}


def answer_argv(props: Mapping[str, Any]) -> list[str]:
    """The command run on the head: the program arrives on stdin."""
    settings = props["settings"]
    argv = [
        "--url", str(props["url"]),
        "--model", str(props["model"]),
        "--max-tokens", str(int(settings["max_tokens"])),
        "--top", str(int(settings["top"])),
        "--deadline", f"{float(settings['deadline_s']):g}",
        "--request-timeout", f"{float(settings['request_timeout_s']):g}",
    ]  # fmt: skip
    return stdin_argv(argv)


def answer_spec(props: Mapping[str, Any], forced: Mapping[str, Sequence[Sequence[int]]]) -> dict[str, Any]:
    """What the program is given: the prompt set (the long prompt sized by the settings), each prompt
    with the reference's token ids where it gives them and the continuations to score (`forced`)."""
    reference = ((props.get("reference") or {}).get("prompts")) or {}
    prompts = []
    for prompt in prompt_set(int(props["settings"]["long_prompt_tokens"])):
        given = reference.get(prompt["id"]) or {}
        entry = {key: prompt[key] for key in ("id", "text", "messages", "limit") if key in prompt}
        if given.get("prompt_ids"):
            entry["prompt_ids"] = [int(t) for t in given["prompt_ids"]]
        entry["force"] = [[int(t) for t in tokens] for tokens in forced.get(prompt["id"]) or []]
        prompts.append(entry)
    return {"version": VERSION, "prompts": prompts}


def answer_program(api_key: str | None, spec: Mapping[str, Any]) -> bytes:
    """The program's source, with the API key in its environment and the spec assigned (stdin)."""
    return program_stdin(
        "answer_check",
        assign={"ANSWER_SPEC": json.dumps(spec, separators=(",", ":"))},
        environ={PROBE_API_KEY_ENV: api_key} if api_key else None,
    )
