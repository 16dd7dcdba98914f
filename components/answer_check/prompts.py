"""The answer check's prompt set: fixed, versioned, shipped with the program (pure data, no I/O).

Change a prompt, add one or remove one, and `VERSION` changes with it: a reference made for another
version is refused (its token ids are another prompt's), and a stack's next `up` checks again.

Three kinds, each a dict with an `id`:
- short texts (`text`), sent as the server's tokenizer reads them;
- chat turns (`messages`), rendered through the model's chat template by the server (`/tokenize`,
  thinking off);
- one long prompt (`long`: a passage repeated to about `long_prompt_tokens` words), where attention
  over a long context is exercised: a model that reads it right predicts the repeats almost surely,
  so its mean NLL is low, and a broken attention kernel shows there first.
Some carry a known `answer` (`known_answers`): what a real model says first, scored against
`answers.min_correct`.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

VERSION = "answers-v1"

# Short texts: plain continuations, and known answers a real model gets right at temperature 0.
SHORT = (
    {"id": "capital-france", "text": "The capital of France is", "answer": "Paris"},
    {"id": "capital-japan", "text": "Q: What is the capital of Japan?\nA:", "answer": "Tokyo"},
    {"id": "sum", "text": "Q: What is 17 + 25?\nA:", "answer": "42"},
    {"id": "sequence", "text": "2, 4, 6, 8, 10,", "answer": "12"},
    {"id": "story", "text": "Once upon a time, in a small village by the sea, there lived"},
    {"id": "code", "text": 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n'},
)

# Chat turns, the way clients send them to /v1/chat/completions.
CHAT = (
    {
        "id": "chat-gold",
        "messages": [
            {"role": "user", "content": "What is the chemical symbol for gold? Answer with the symbol only."}
        ],
        "answer": "Au",
    },
    {
        "id": "chat-turns",
        "messages": [
            {"role": "system", "content": "You are a concise assistant."},
            {"role": "user", "content": "Name a primary colour."},
            {"role": "assistant", "content": "Red."},
            {"role": "user", "content": "Name another one."},
        ],
    },
)

# The long prompt's passage (repeated): plain sentences whose words most tokenizers keep whole.
PASSAGE = (
    "The lighthouse stands on a rock at the edge of the bay. Every evening the keeper climbs the "
    "stairs, trims the wick and lights the lamp, and the beam turns over the water until morning. "
    "Ships that pass far out see the light and know where the rocks are."
)
LONG_ID = "long"


def long_text(tokens: int) -> str:
    """The passage repeated to about `tokens` words (about as many tokens), ending at a sentence."""
    words = PASSAGE.split()
    repeats = max(tokens // len(words), 1)
    return " ".join([PASSAGE] * repeats)


def prompt_set(long_prompt_tokens: int) -> list[dict[str, Any]]:
    """The prompts, in the order they are sent; the long one sized to `long_prompt_tokens`."""
    return [
        *(dict(p) for p in SHORT),
        *(dict(p) for p in CHAT),
        # `limit`: the server's token ids are cut there, whatever a word takes (a byte-level tokenizer,
        # as the lab's, spends about six tokens a word).
        {"id": LONG_ID, "text": long_text(long_prompt_tokens), "limit": long_prompt_tokens},
    ]


def prompt_ids() -> list[str]:
    """Every prompt's id."""
    return [p["id"] for p in prompt_set(0)]


def known_answers() -> dict[str, str]:
    """The prompts with a known answer: id -> the answer."""
    return {p["id"]: p["answer"] for p in prompt_set(0) if p.get("answer")}


def set_digest(long_prompt_tokens: int) -> str:
    """A digest of the prompts as sent: a change to any text changes it, whatever `VERSION` says."""
    text = json.dumps(prompt_set(long_prompt_tokens), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]
