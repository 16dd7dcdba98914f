"""A stand-in for vLLM's completions API with logprobs, on 127.0.0.1, for the answer check's tests.

A toy model over a toy tokenizer, deterministic: a word is a token (`word_id`), and the next token
after token p is `top_after(p)` with logprob TOP_LP, `second_after(p)` with SECOND_LP, any other with
OTHER_LP. It answers `/tokenize` (text, or chat messages rendered as `role: content` lines) and
`/v1/completions` with a prompt of token ids, greedily, in vLLM's exact response shape:
    choices[0].logprobs = {"tokens": ["token_id:<n>", …], "token_logprobs": [...],
                           "top_logprobs": [{"token_id:<n>": lp}, …], "text_offset": [...]}
    choices[0].prompt_logprobs = [None, {"<id>": {"logprob", "rank", "decoded_token"}, …}, …]
`broken` makes the model compute wrong (every top token shifted: what a broken kernel does), `ties`
puts a near-tie after the given tokens, `flips` swaps the top two there (another implementation's
rounding deciding a near-tie the other way), `drift` adds to every logprob served.
"""

from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

VOCAB = 1000
TOP_LP, SECOND_LP, OTHER_LP = -0.05, -3.2, -9.0
TIE_LPS = (-0.70, -0.74)  # after a token in `ties`: the top two within 0.04 nats


def word_id(word: str) -> int:
    return 10 + int(hashlib.sha256(word.encode()).hexdigest(), 16) % (VOCAB - 10)


def render(messages: list[dict]) -> list[str]:
    words = [w for m in messages for w in f"{m['role']}: {m['content']}".split()]
    return [*words, "assistant:"]


class ToyModel:
    """The toy model's distribution, as the stand-in serves it."""

    def __init__(self) -> None:
        self.broken = False
        self.ties: set[int] = set()
        self.flips: set[int] = set()
        self.drift = 0.0

    def top_after(self, prev: int) -> int:
        if prev in self.flips:
            return (prev * 31 + 8) % VOCAB
        return (prev * 31 + (9 if self.broken else 7)) % VOCAB

    def second_after(self, prev: int) -> int:
        return (prev * 31 + (7 if prev in self.flips else 8)) % VOCAB

    def logprob(self, prev: int, token: int) -> float:
        top, second = self.top_after(prev), self.second_after(prev)
        if prev in self.ties:
            found = TIE_LPS[0] if token == top else TIE_LPS[1] if token == second else OTHER_LP
        else:
            found = TOP_LP if token == top else SECOND_LP if token == second else OTHER_LP
        return found + self.drift

    def ranked(self, prev: int, token: int, top: int) -> dict:
        """A prompt_logprobs entry: the `top` most likely, and `token` whatever its rank."""
        best = [self.top_after(prev), self.second_after(prev)][: max(top, 1)]
        entry = {}
        for rank, tid in enumerate(best, 1):
            entry[str(tid)] = {"logprob": self.logprob(prev, tid), "rank": rank, "decoded_token": f"w{tid}"}
        if str(token) not in entry:
            lp = self.logprob(prev, token)
            rank = 1 if token == best[0] else 2 if token == self.second_after(prev) else 500
            entry[str(token)] = {"logprob": lp, "rank": rank, "decoded_token": f"w{token}"}
        return entry


def completion(model: ToyModel, body: dict) -> dict:
    ids = [int(t) for t in body["prompt"]]
    prompt_logprobs = [None] + [
        model.ranked(ids[i - 1], ids[i], int(body["prompt_logprobs"])) for i in range(1, len(ids))
    ]
    out, prev = [], ids[-1]
    for _ in range(int(body["max_tokens"])):
        prev = model.top_after(prev)
        out.append(prev)
    chain = [ids[-1], *out]
    lps = [model.logprob(chain[i], chain[i + 1]) for i in range(len(out))]
    logprobs = None
    if body.get("logprobs") is not None:
        logprobs = {
            "tokens": [f"token_id:{t}" for t in out],
            "token_logprobs": lps,
            "top_logprobs": [{f"token_id:{t}": lp} for t, lp in zip(out, lps, strict=True)],
            "text_offset": [4 * i for i in range(len(out))],
        }
    choice = {
        "index": 0,
        "text": " ".join(f"w{t}" for t in out),
        "logprobs": logprobs,
        "finish_reason": "length",
        "prompt_logprobs": prompt_logprobs,
    }
    return {"id": "cmpl-1", "object": "text_completion", "model": body["model"], "choices": [choice]}


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *_args) -> None:
        pass

    def _answer(self, status: int, body: object) -> None:
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        server = self.server
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        server.seen.append({"path": self.path, "auth": self.headers.get("Authorization"), "body": body})
        if self.headers.get("Authorization") != f"Bearer {server.key}":
            return self._answer(401, {"error": "invalid key"})
        if server.garbage:
            return self._answer(200, b"<html>not json</html>")
        if self.path == "/tokenize":
            words = render(body["messages"]) if body.get("messages") else str(body["prompt"]).split()
            tokens = [1, *(word_id(w) for w in words)]  # 1: a BOS, as add_special_tokens gives
            return self._answer(200, {"count": len(tokens), "max_model_len": 32768, "tokens": tokens})
        if self.path == "/v1/completions":
            return self._answer(200, completion(server.model, body))
        return self._answer(404, {"error": "no such path"})


class AnswersServer:
    """The stand-in, started on 127.0.0.1 (a context manager): `.url`, `.seen`, `.model`."""

    def __init__(self, key: str):
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.seen, self.server.key = [], key
        self.server.model, self.server.garbage = ToyModel(), False
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    @property
    def seen(self) -> list[dict]:
        return self.server.seen

    @property
    def model(self) -> ToyModel:
        return self.server.model

    def __enter__(self) -> AnswersServer:
        self.thread.start()
        return self

    def __exit__(self, *_exc) -> None:
        self.server.shutdown()
        self.server.server_close()
