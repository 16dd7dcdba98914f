"""`answers.reference` read: a file of token ids and logprobs per prompt, made by an implementation
other than vLLM (docs/answers.md gives its format). Read at program time (components/layout.py), so
its content is an input: a new reference checks again. Pure apart from `read_reference`'s one read.

    {"version": "answers-v1",              the prompt set it was made for (prompts.VERSION)
     "made_by": "transformers 5.17, CPU",  free text, shown in the stack output
     "prompts": {"<prompt id>": {
         "prompt_ids": [...],              optional: the prompt's token ids (sent as they are)
         "tokens": [...],                  the continuation's token ids (greedy)
         "logprobs": [...],                the reference's logprob of each, same length
         "alternatives": [[[id, lp], ...], ...],  optional: its top tokens at each position
         "texts": [...]}}}                 optional: each token's text, for messages
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from components.answer_check.prompts import VERSION, prompt_ids


def reference_problems(data: object) -> list[str]:
    """What is wrong with a reference's content, each naming the prompt and field (empty: usable)."""
    if not isinstance(data, Mapping) or not isinstance(data.get("prompts"), Mapping):
        return ["is not a JSON object with `prompts` by prompt id (docs/answers.md gives the format)"]
    problems = []
    if data.get("version") != VERSION:
        problems.append(
            f"was made for prompt set {data.get('version')!r}, this program sends {VERSION!r}: make it again"
        )
    known = set(prompt_ids())
    for pid, entry in data["prompts"].items():
        if pid not in known:
            problems.append(f"prompt {pid!r} is not in prompt set {VERSION} ({', '.join(sorted(known))})")
            continue
        problems += [f"prompt {pid!r}: {p}" for p in _entry_problems(entry)]
    return problems


def _entry_problems(entry: object) -> list[str]:
    if not isinstance(entry, Mapping):
        return ["is not an object"]
    tokens, logprobs = entry.get("tokens"), entry.get("logprobs")
    if not isinstance(tokens, list) or not tokens or not all(isinstance(t, int) for t in tokens):
        return ["`tokens` must be a non-empty list of token ids"]
    problems = []
    if not isinstance(logprobs, list) or len(logprobs) != len(tokens):
        problems.append(f"`logprobs` must give one logprob per token ({len(tokens)})")
    elif not all(isinstance(v, int | float) and v <= 0 for v in logprobs):
        problems.append("`logprobs` must be numbers at most 0")
    ids = entry.get("prompt_ids")
    if ids is not None and (not isinstance(ids, list) or not all(isinstance(t, int) for t in ids)):
        problems.append("`prompt_ids` must be a list of token ids")
    for key in ("alternatives", "texts"):
        value = entry.get(key)
        if value is not None and (not isinstance(value, list) or len(value) != len(tokens)):
            problems.append(f"`{key}` must give one entry per token ({len(tokens)})")
    return problems


def read_reference(path: str, project_dir: Path) -> tuple[dict[str, Any] | None, list[str]]:
    """The reference at `path` (relative to `project_dir`), or the problems that refuse it."""
    where = Path(path) if Path(path).is_absolute() else project_dir / path
    try:
        data = json.loads(where.read_text())
    except OSError as exc:
        return None, [f"cannot read {where}: {exc.strerror or exc}"]
    except ValueError as exc:
        return None, [f"{where} is not JSON: {exc}"]
    problems = reference_problems(data)
    return (None, problems) if problems else (dict(data), [])
