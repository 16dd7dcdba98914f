"""Answer check: does the deployed server compute the right answers? Runs ON THE HEAD, standard
library only.

For each prompt of the set it is given (`ANSWER_SPEC`, a JSON text its prelude assigns: the prompts,
each as text or chat messages, with the token ids a reference gives and the continuations to score),
against vLLM's OpenAI-compatible server:
1. the prompt's token ids: the reference's where it gives them, else the server's own tokenizer
   (`POST /tokenize`; chat messages are rendered there through the model's chat template);
2. generation: `POST /v1/completions` with the ids, greedy (temperature 0), `max_tokens`,
   `logprobs: 1` and `prompt_logprobs: 1`: the generated token ids and their logprobs, and the
   prompt's mean negative log-likelihood (every prompt token after the first);
3. teacher forcing, once per distinct continuation (its own generation, and each given one): the
   prompt's ids followed by the continuation's, `max_tokens: 1`, `prompt_logprobs: --top`: at each
   continuation position the served logprob of the continuation's token and the served top tokens.
Every request sends `return_tokens_as_token_ids: true`, so generated tokens come back as
`token_id:<n>`. It judges nothing: the provider does (components/answer_check/judge.py).

vLLM's response shape, as this program reads it (`choices[0]` of a completion):
    logprobs: {"tokens": ["token_id:791", …], "token_logprobs": [-0.02, …],
               "top_logprobs": [{"token_id:791": -0.02}, …], "text_offset": [0, …]}
    prompt_logprobs: [None, {"<token id>": {"logprob": -3.1, "rank": 1, "decoded_token": "…"}, …}, …]
(one entry per prompt token; the first is None, as nothing precedes it; each dict holds the prompt's
own token, whatever its rank, and the top tokens asked for).

Everything ends by `--deadline` seconds, each request by `--request-timeout` too; a request that
fails or is cut fails the check (exit 3) naming the prompt and the stage. The API key comes from
$QWEN35_API_KEY (`wire.PROBE_API_KEY_ENV`, set by the stdin prelude), never from argv. Progress lines
(`ANSWERS_PROGRESS_PREFIX`) go to stderr; the report is one JSON line on stdout.

(No `from __future__` import here: it runs after a prelude, see `node_programs.program_stdin`.)
"""

import argparse
import hashlib
import json
import math
import os
import sys
import time
import urllib.request
from collections.abc import Callable
from enum import IntEnum

from components.node_programs.wire import PROBE_API_KEY_ENV, http_failure

ANSWERS_PROGRESS_PREFIX = "answers "  # the stderr lines AnswerCheck relays to the operator
TOKEN_ID_PREFIX = "token_id:"  # how vLLM names a token under return_tokens_as_token_ids
ANSWER_LIMIT = 32 << 20  # bytes: the long prompt's prompt_logprobs are the largest answer, ~1 MB


class Exit(IntEnum):
    OK = 0
    FAILED = 3  # a request failed, answered in another shape, or the deadline passed
    REJECTED = 4  # the server refused the API key


class AnswerError(RuntimeError):
    """One request failed: the prompt, the stage and why."""

    def __init__(self, where: str, detail: str, rejected: bool = False):
        self.rejected = rejected
        super().__init__(f"answer check: {where}: {detail}")


class Client:
    """JSON requests to one server, each bounded by its own timeout and the check's deadline."""

    def __init__(
        self, base: str, api_key: str | None, end: float, request_s: float, clock: Callable[[], float]
    ):
        self.base = base.rstrip("/")
        self.api_key = api_key
        self.end = end
        self.request_s = request_s
        self.clock = clock

    def post(self, where: str, path: str, payload: dict) -> dict:
        """POST `payload` to `path`; the JSON object answered, or AnswerError naming `where`."""
        left = self.end - self.clock()
        if left <= 0:
            raise AnswerError(where, "the check's deadline passed before this request")
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        url = self.base + path
        request = urllib.request.Request(url, json.dumps(payload).encode(), headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=min(left, self.request_s)) as answer:
                raw = answer.read(ANSWER_LIMIT + 1)
        except OSError as exc:  # urllib's URLError and HTTPError among them
            detail, rejected = http_failure(exc, url)
            raise AnswerError(where, detail, rejected=rejected) from None
        if len(raw) > ANSWER_LIMIT:
            raise AnswerError(where, f"{url} answered over {ANSWER_LIMIT} bytes")
        try:
            found = json.loads(raw)
        except ValueError:
            raise AnswerError(where, f"{url} answered with no JSON: {raw[:120]!r}") from None
        if not isinstance(found, dict):
            raise AnswerError(where, f"{url} answered {type(found).__name__}, not an object")
        return found


# A logprob below this is recorded as it (vLLM may answer -inf for a token the model rules out; JSON
# has no infinity, and any gap this wide fails every tolerance alike).
FLOOR_LOGPROB = -1e4


def logprob(value: object) -> float:
    """A logprob as recorded: a finite number, rounded."""
    number = float(value)  # type: ignore[arg-type]
    if math.isnan(number):
        raise ValueError("a logprob that is NaN")
    return round(max(number, FLOOR_LOGPROB), 5)


def token_id(name: str) -> int:
    """The id in vLLM's `token_id:<n>` (return_tokens_as_token_ids)."""
    if not isinstance(name, str) or not name.startswith(TOKEN_ID_PREFIX):
        raise ValueError(
            f"a token named {name!r}, not {TOKEN_ID_PREFIX}<n>: is return_tokens_as_token_ids on?"
        )
    return int(name[len(TOKEN_ID_PREFIX) :])


def prompt_token_logprob(entry: object, token: int) -> float:
    """The logprob of prompt token `token` from its prompt_logprobs entry (a dict by token id)."""
    if not isinstance(entry, dict) or str(token) not in entry:
        raise ValueError(f"prompt_logprobs has no entry for token {token}")
    return logprob(entry[str(token)]["logprob"])


def ranked(entry: dict, top: int) -> list[list]:
    """A prompt_logprobs entry's tokens as [[id, logprob], …], the most likely first (rank, then
    logprob: the prompt's own token is there whatever its rank), at most `top`."""
    pairs = sorted(
        ((int(key), logprob(value["logprob"]), value.get("rank")) for key, value in entry.items()),
        key=lambda p: (p[2] if isinstance(p[2], int) else 1 << 30, -p[1]),
    )
    return [[tid, lp] for tid, lp, _ in pairs[: max(top, 1)]]


def mean_nll(ids: list[int], prompt_logprobs: list) -> float | None:
    """The prompt's mean negative log-likelihood per token, over every token after the first."""
    if not isinstance(prompt_logprobs, list) or len(prompt_logprobs) != len(ids):
        raise ValueError(f"prompt_logprobs has {len(prompt_logprobs or [])} entries for {len(ids)} tokens")
    if len(ids) < 2:
        return None
    total = sum(-prompt_token_logprob(prompt_logprobs[i], ids[i]) for i in range(1, len(ids)))
    return round(total / (len(ids) - 1), 5)


def digest(ids: list[int]) -> str:
    """A short digest of a prompt's token ids: two runs sent the same prompt when these match."""
    return hashlib.sha256(",".join(map(str, ids)).encode()).hexdigest()[:16]


def completion(body: dict) -> dict:
    """`choices[0]` of a completion answer."""
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise ValueError(f"no choices in the answer: {str(body)[:200]}")
    return choices[0]


def generated(choice: dict, ids: list[int]) -> dict:
    """The generation's tokens, their logprobs, its text and the prompt's mean NLL."""
    logprobs = choice.get("logprobs") or {}
    tokens = [token_id(name) for name in logprobs.get("tokens") or []]
    values = [logprob(v) if v is not None else None for v in logprobs.get("token_logprobs") or []]
    if len(values) != len(tokens):
        raise ValueError(f"{len(tokens)} tokens and {len(values)} logprobs")
    return {
        "generated": tokens,
        "generated_logprobs": values,
        "text": str(choice.get("text") or ""),
        "finish_reason": choice.get("finish_reason"),
        "prompt_nll": mean_nll(ids, choice.get("prompt_logprobs")),
    }


def scored(choice: dict, ids: list[int], continuation: list[int], top: int) -> dict:
    """A teacher-forced continuation read back: at each of its positions the served logprob of its
    token, the served top token and its logprob, and the `top` most likely tokens."""
    entries = choice.get("prompt_logprobs")
    if not isinstance(entries, list) or len(entries) != len(ids) + len(continuation):
        raise ValueError(
            f"prompt_logprobs has {len(entries or [])} entries for {len(ids) + len(continuation)}"
        )
    logprobs, top_ids, top_logprobs, alternatives = [], [], [], []
    for at, token in enumerate(continuation):
        entry = entries[len(ids) + at]
        best = ranked(entry, top)
        logprobs.append(prompt_token_logprob(entry, token))
        top_ids.append(best[0][0])
        top_logprobs.append(best[0][1])
        alternatives.append(best)
    return {
        "tokens": list(continuation),
        "logprobs": logprobs,
        "top_ids": top_ids,
        "top_logprobs": top_logprobs,
        "alternatives": alternatives,
    }


def request(
    model: str, prompt: list[int], max_tokens: int, logprobs: int | None, prompt_logprobs: int
) -> dict:
    """A greedy completion's body: token ids in, token ids out, vLLM's prompt_logprobs."""
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "prompt_logprobs": prompt_logprobs,
        "return_tokens_as_token_ids": True,
    }
    if logprobs is not None:
        body["logprobs"] = logprobs
    return body


def tokenized(client: Client, model: str, prompt: dict) -> list[int]:
    """The prompt's token ids by the server's tokenizer (chat messages through its chat template,
    thinking off, the assistant's turn opened)."""
    if prompt.get("messages"):
        payload = {
            "model": model,
            "messages": prompt["messages"],
            "add_generation_prompt": True,
            "chat_template_kwargs": {"enable_thinking": False},
        }
    else:
        payload = {"model": model, "prompt": prompt["text"], "add_special_tokens": True}
    answer = client.post(f"prompt {prompt['id']}: tokenize", "/tokenize", payload)
    tokens = answer.get("tokens")
    if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
        raise AnswerError(
            f"prompt {prompt['id']}: tokenize", f"no token ids in the answer: {str(answer)[:200]}"
        )
    # The long prompt is sized in tokens (its text in words): cut where the set says.
    return tokens[: int(prompt["limit"])] if prompt.get("limit") else tokens


def receipt(client: Client, model: str, prompt: dict, max_tokens: int, top: int) -> dict:
    """One prompt's receipt: its ids, generation and every distinct continuation scored."""
    name = prompt["id"]
    own = tokenized(client, model, prompt)
    ids = [int(t) for t in prompt["prompt_ids"]] if prompt.get("prompt_ids") else own
    try:
        answer = client.post(
            f"prompt {name}: generate", "/v1/completions", request(model, ids, max_tokens, 1, 1)
        )
        found = {
            "id": name,
            "prompt_tokens": len(ids),
            "prompt_digest": digest(ids),
            **generated(completion(answer), ids),
        }
        found["tokenizer_agrees"] = own == ids
        found["scored"] = []
        continuations = [found["generated"], *(list(map(int, c)) for c in prompt.get("force") or [])]
        for continuation in continuations:
            if not continuation or any(s["tokens"] == continuation for s in found["scored"]):
                continue
            body = request(model, ids + continuation, 1, None, top)
            answer = client.post(f"prompt {name}: teacher forcing", "/v1/completions", body)
            found["scored"].append(scored(completion(answer), ids, continuation, top))
    except (ValueError, KeyError, TypeError) as exc:
        raise AnswerError(f"prompt {name}", f"an answer not in vLLM's shape: {exc}") from None
    return found


def run(
    client: Client, model: str, spec: dict, max_tokens: int, top: int, say: Callable[[str], None]
) -> list:
    """Every prompt's receipt, in the set's order."""
    receipts = []
    prompts = spec.get("prompts") or []
    for number, prompt in enumerate(prompts, 1):
        say(f"{ANSWERS_PROGRESS_PREFIX}{number}/{len(prompts)}: {prompt['id']}")
        receipts.append(receipt(client, model, prompt, max_tokens, top))
    return receipts


def main(argv: list | None = None, spec: dict | None = None) -> int:
    parser = argparse.ArgumentParser(prog="answer_check", description="Record the served answers.")
    parser.add_argument("--url", required=True, help="server base URL as seen from here")
    parser.add_argument("--model", required=True, help="served model name")
    parser.add_argument("--max-tokens", type=int, required=True, help="tokens generated per prompt")
    parser.add_argument("--top", type=int, required=True, help="top tokens read at each forced position")
    parser.add_argument("--deadline", type=float, required=True, help="seconds for the whole check")
    parser.add_argument("--request-timeout", type=float, required=True, help="seconds for one request")
    args = parser.parse_args(argv)
    if spec is None:
        # The prelude's assignment (programs.answer_program): the prompt set as a JSON text.
        spec = json.loads(globals().get("ANSWER_SPEC") or "{}")
    started = time.monotonic()
    key = os.environ.get(PROBE_API_KEY_ENV) or None
    client = Client(args.url, key, started + args.deadline, args.request_timeout, time.monotonic)

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    try:
        receipts = run(client, args.model, spec, args.max_tokens, args.top, say)
    except AnswerError as exc:
        print(str(exc), file=sys.stderr)
        return Exit.REJECTED if exc.rejected else Exit.FAILED
    report = {
        "version": spec.get("version"),
        "receipts": receipts,
        "elapsed_s": round(time.monotonic() - started, 1),
        "checked_at": round(time.time()),
    }
    print(json.dumps(report, allow_nan=False))
    return Exit.OK


if __name__ == "__main__":
    sys.exit(main())
