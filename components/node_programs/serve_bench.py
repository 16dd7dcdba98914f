"""Serve bench: how fast does the deployed server answer? Runs ON THE HEAD, standard library only.

After one unmeasured warm-up request, three measurements against `/v1/completions`, each streamed
(`stream_options.include_usage`, so tokens are counted from the server's own usage, not from chunks)
with `ignore_eos` and `max_tokens`, so lengths are what was asked:
- decode: one stream of `--output-tokens` after a short prompt: time to first token (TTFT) and
  decode tokens/s (the tokens after the first over the time after the first);
- prefill: one prompt of about `--prompt-tokens`, one token generated: prompt tokens / TTFT;
- aggregate: `--concurrency` such streams at once: every generated token over the wall time.
Every prompt starts with a fresh nonce, so prefix caching never serves one from an earlier request.
Everything ends by `--deadline` seconds; a request cut by it fails the bench (exit 3) naming the stage.
Each stream must end as vLLM ends one: a `finish_reason`, then `data: [DONE]`, with the usage's
`completion_tokens` equal to the `max_tokens` asked; a stream cut short (a clean close after some
tokens) or broken mid-chunk fails its stage, naming it and the cause, rather than giving figures.

With `--log-container`, the server's log is read for NCCL's `Using network …` line (printed with
NCCL_DEBUG=INFO), so a slow figure can say whether NCCL ran over sockets.

Shipped like the readiness probe (`python3 -` with the program on stdin); the API key comes from
$QWEN35_API_KEY (`wire.PROBE_API_KEY_ENV`, set by the stdin prelude), never from argv. Progress lines
(`BENCH_PROGRESS_PREFIX`) go to stderr; the report is one JSON line on stdout.

(No `from __future__` import here: it may run after a prelude, see `node_programs.program_stdin`.)
"""

import argparse
import binascii
import http.client
import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import IntEnum

from components.node_programs.wire import PROBE_API_KEY_ENV, bench_prompt_slack, http_failure

BENCH_PROGRESS_PREFIX = "bench "  # the stderr lines ServeBench relays to the operator
SHORT_PROMPT = "Write a long story about a lighthouse keeper and the sea."
# Common English words that Qwen's (and most BPE) tokenizers keep as one token each with their space.
FILLER = ("the", "of", "and", "to", "in", "is", "it", "that", "was", "for", "on", "with", "as", "at", "by")
WARMUP_TOKENS = 8
# NCCL prints `NCCL INFO Using network IB` (Socket, or a plugin's name such as `IBext_v8` or
# `AWS Libfabric`) at init (src/init.cc), and `… via NET/<name>/<dev>` per channel. The same two
# forms as components/nccl.py's parser reads (a unit test holds them equal; this file is stdlib-only).
_NCCL_NETWORK = re.compile(r"NCCL INFO Using network (.+?)\s*$")
_NCCL_CHANNEL = re.compile(r"NCCL INFO Channel \d+/\d+ : .* via NET/([^/]+)/\d+")
LOG_SCAN_LINES = 200_000
LOG_SCAN_S = 20.0


class Exit(IntEnum):
    OK = 0
    FAILED = 3  # a request failed or the deadline passed (the stage is named on stderr)
    REJECTED = 4  # the server refused the API key


class BenchError(RuntimeError):
    """One measurement failed: its stage and why."""

    def __init__(self, stage: str, detail: str, rejected: bool = False):
        self.stage = stage
        self.rejected = rejected
        super().__init__(f"serve bench: {stage}: {detail}")


@dataclass(frozen=True)
class StreamFigures:
    """One streamed request, timed: seconds from its start, and its tokens as counted."""

    ttft_s: float | None
    elapsed_s: float
    completion_tokens: int
    prompt_tokens: int | None
    # "usage": the server's own counts; "chunks": chunks carrying a choice (no usage was sent).
    counted: str
    started_at: float = 0.0

    @property
    def decode_tps(self) -> float | None:
        """Tokens after the first over the time after the first (the first is the prefill's)."""
        if self.ttft_s is None or self.completion_tokens < 2 or self.elapsed_s <= self.ttft_s:
            return None
        return (self.completion_tokens - 1) / (self.elapsed_s - self.ttft_s)

    @property
    def prefill_tps(self) -> float | None:
        """Prompt tokens over the time to the first token (TTFT-based: includes the queue and one step)."""
        if not self.prompt_tokens or not self.ttft_s:
            return None
        return self.prompt_tokens / self.ttft_s


@dataclass(frozen=True)
class Sse:
    """A stream's events as (time, JSON payload), and whether it ended with `data: [DONE]`."""

    events: list[tuple[float, dict]]
    done: bool


def parse_sse(lines: Iterable[tuple[float, bytes]], stage: str) -> Sse:
    """Server-sent events as (time, JSON payload): `data:` lines only, up to `data: [DONE]`; an error
    event or one that is not JSON fails `stage`."""
    events = []
    for at, raw in lines:
        line = raw.decode("utf-8", errors="replace").strip()
        if not line.startswith("data:"):
            continue
        data = line[len("data:") :].strip()
        if data == "[DONE]":
            return Sse(events, done=True)
        try:
            payload = json.loads(data)
        except ValueError:
            raise BenchError(stage, f"an event that is not JSON: {data[:120]!r}") from None
        if isinstance(payload, dict) and payload.get("error"):
            raise BenchError(stage, f"the server sent an error: {str(payload['error'])[:300]}")
        if isinstance(payload, dict):
            events.append((at, payload))
    return Sse(events, done=False)


def _usage(events: list[tuple[float, dict]]) -> dict | None:
    """The last usage the stream carried (vLLM sends it in a chunk of its own, before `[DONE]`)."""
    return next((p["usage"] for _, p in reversed(events) if isinstance(p.get("usage"), dict)), None)


def end_problem(sse: Sse, asked: int) -> str | None:
    """Why a stream did not end as vLLM ends one asked for `asked` tokens with ignore_eos (None: it
    did): `data: [DONE]`, a `finish_reason` on its last choice, and usage counting `asked` tokens."""
    chunks = sum(1 for _, payload in sse.events if payload.get("choices"))
    if not sse.done:
        return (
            f"the stream ended after {chunks} token chunk(s) without `data: [DONE]`: the server or a "
            "proxy closed it before the engine finished (see the server's log)"
        )
    reasons = [
        choice.get("finish_reason")
        for _, payload in sse.events
        for choice in payload.get("choices") or []
        if isinstance(choice, dict) and choice.get("finish_reason")
    ]
    if not reasons:
        return f"the stream ended without a finish_reason ({chunks} token chunk(s)): no engine ended it"
    usage = _usage(sse.events)
    if usage and usage.get("completion_tokens") is not None:
        if int(usage["completion_tokens"]) != asked:
            return (
                f"the server generated {usage['completion_tokens']} of the {asked} tokens asked "
                f"(finish_reason {reasons[-1]!r}): a server that ignores `ignore_eos`, or an engine that "
                "cut the request (see the server's log)"
            )
    elif reasons[-1] != "length":
        return (
            f"the stream finished with finish_reason {reasons[-1]!r}, not 'length', and carried no usage: "
            f"fewer than the {asked} tokens asked (a server that ignores `ignore_eos`)"
        )
    return None


def stream_figures(started: float, events: list[tuple[float, dict]]) -> StreamFigures:
    """A stream's figures from its events (times on the clock `started` was read from). It ends at its
    last token chunk, as `vllm bench serve` times it: the usage chunk after it carries no token."""
    token_times = [at for at, payload in events if payload.get("choices")]
    usage = _usage(events)
    end = token_times[-1] if token_times else (events[-1][0] if events else started)
    if usage and usage.get("completion_tokens") is not None:
        tokens, prompt, counted = int(usage["completion_tokens"]), usage.get("prompt_tokens"), "usage"
    else:
        tokens, prompt, counted = len(token_times), None, "chunks"
    return StreamFigures(
        ttft_s=(token_times[0] - started) if token_times else None,
        elapsed_s=end - started,
        completion_tokens=tokens,
        prompt_tokens=int(prompt) if prompt is not None else None,
        counted=counted,
        started_at=started,
    )


def aggregate_tps(streams: list[StreamFigures]) -> float | None:
    """Every stream's generated tokens over the wall time from the first start to the last end."""
    if not streams:
        return None
    first = min(s.started_at for s in streams)
    last = max(s.started_at + s.elapsed_s for s in streams)
    tokens = sum(s.completion_tokens for s in streams)
    return tokens / (last - first) if last > first and tokens else None


def _round(value: float | None, digits: int = 2) -> float | None:
    return None if value is None else round(value, digits)


def figures(decode: StreamFigures, prefill: StreamFigures, streams: list[StreamFigures]) -> dict:
    """The bench's figures, as the stack output records them."""
    counted = {s.counted for s in (decode, prefill, *streams)}
    return {
        "decode_tps": _round(decode.decode_tps),
        "ttft_s": _round(decode.ttft_s, 3),
        "output_tokens": decode.completion_tokens,
        "prefill_tps": _round(prefill.prefill_tps, 1),
        "prefill_ttft_s": _round(prefill.ttft_s, 3),
        "prompt_tokens": prefill.prompt_tokens,
        "aggregate_tps": _round(aggregate_tps(streams)),
        "concurrency": len(streams),
        # "usage" unless some stream carried no usage (its tokens were counted from chunks).
        "counted": "usage" if counted == {"usage"} else "chunks",
    }


def nccl_network(lines: Iterable[str]) -> str | None:
    """The networks NCCL said it used (`IB`, `Socket`, a plugin's name; several joined by `,`), from its
    `Using network` lines, else its channel lines; None if it never said."""
    named: dict[str, None] = {}
    channels: dict[str, None] = {}
    for line in lines:
        if match := _NCCL_NETWORK.search(line):
            named.setdefault(match.group(1), None)
        elif match := _NCCL_CHANNEL.search(line):
            channels.setdefault(match.group(1), None)
    return ",".join(named or channels) or None


def nonce() -> str:
    return binascii.hexlify(os.urandom(6)).decode()


def long_prompt(tokens: int, words_per_token: float = 1.0) -> str:
    """A prompt of about `tokens` tokens at `words_per_token` (a nonce first: no cached prefix serves it)."""
    words = [FILLER[i % len(FILLER)] for i in range(max(int((tokens - 8) * words_per_token), 1))]
    return f"[{nonce()}] " + " ".join(words)


def sized_prompt(client: "Client", model: str, tokens: int) -> str:
    """A prompt of about `tokens` tokens as the server's own tokenizer counts them (vLLM's /tokenize;
    a word a token where the server has none): tokenizers differ several-fold in words per token."""
    prompt = long_prompt(tokens)
    for _ in range(2):
        counted = client.count_tokens(model, prompt)
        if not counted or abs(counted - tokens) <= bench_prompt_slack(tokens):
            return prompt
        words = len(prompt.split()) - 1
        prompt = long_prompt(tokens, words_per_token=max(words, 1) / max(counted - 8, 1))
    return prompt


def body(model: str, prompt: str, max_tokens: int) -> dict:
    return {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        # vLLM's extension: generate max_tokens whatever the model would end with.
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


class Client:
    """Streams completions from one server, every read bounded by the bench's deadline."""

    def __init__(self, base: str, api_key: str | None, end: float, clock: Callable[[], float]):
        self.url = base.rstrip("/") + "/v1/completions"
        self.api_key = api_key
        self.end = end
        self.clock = clock

    def stream(self, stage: str, payload: dict) -> StreamFigures:
        headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        request = urllib.request.Request(self.url, json.dumps(payload).encode(), headers, method="POST")
        started = self.clock()
        left = self.end - started
        if left <= 0:
            raise BenchError(stage, "the bench's deadline passed before it started")
        try:
            with urllib.request.urlopen(request, timeout=left) as answer:
                sse = parse_sse(self._lines(stage, answer), stage)
        except http.client.HTTPException as exc:
            # IncompleteRead (closed inside a chunk), RemoteDisconnected: not URLErrors, so named here.
            said = f"{type(exc).__name__}: {exc}"
            detail = f"the connection broke before the stream ended ({said}): the server or a proxy cut it"
            raise BenchError(stage, detail) from None
        except OSError as exc:  # urllib's URLError and HTTPError among them
            detail, rejected = http_failure(exc, self.url)
            raise BenchError(stage, detail, rejected=rejected) from None
        problem = end_problem(sse, int(payload["max_tokens"]))
        if problem:
            raise BenchError(stage, problem)
        figures = stream_figures(started, sse.events)
        if figures.ttft_s is None:
            raise BenchError(stage, f"the stream carried no token ({len(sse.events)} events)")
        return figures

    def count_tokens(self, model: str, prompt: str) -> int | None:
        """The prompt's token count by the server's tokenizer (vLLM's /tokenize), None without one."""
        url = self.url.removesuffix("/v1/completions") + "/tokenize"
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        payload = json.dumps({"model": model, "prompt": prompt, "add_special_tokens": True}).encode()
        try:
            timeout = max(min(self.end - self.clock(), 30.0), 1.0)
            with urllib.request.urlopen(
                urllib.request.Request(url, payload, headers), timeout=timeout
            ) as answer:
                count = json.loads(answer.read()).get("count")
        except (OSError, ValueError):
            return None
        return int(count) if isinstance(count, int) else None

    def _lines(self, stage: str, answer) -> Iterable[tuple[float, bytes]]:
        for raw in answer:
            now = self.clock()
            if now > self.end:
                raise BenchError(stage, "the bench's deadline passed during the stream")
            yield now, raw


def concurrent(client: Client, model: str, count: int, tokens: int) -> list[StreamFigures]:
    """`count` streams of `tokens` each, all started together; the first failure is raised."""
    results: list[StreamFigures | None] = [None] * count
    failures: list[BenchError] = []

    def one(i: int) -> None:
        try:
            results[i] = client.stream("concurrent", body(model, f"[{nonce()}] {SHORT_PROMPT}", tokens))
        except BenchError as exc:
            failures.append(exc)
        except Exception as exc:  # noqa: BLE001 -- a thread's traceback would leave only "did not end"
            failures.append(BenchError("concurrent", f"{type(exc).__name__}: {exc}"))

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(max(client.end - client.clock(), 0) + 5)
    if failures:
        raise failures[0]
    if any(r is None for r in results):
        raise BenchError("concurrent", "a stream did not end by the bench's deadline")
    return [r for r in results if r is not None]


def run(
    client: Client, model: str, output_tokens: int, prompt_tokens: int, count: int, say: Callable[[str], None]
) -> dict:
    """The warm-up, then decode, prefill and aggregate; their figures."""
    say(f"{BENCH_PROGRESS_PREFIX}warm-up ({WARMUP_TOKENS} tokens)")
    client.stream("warm-up", body(model, f"[{nonce()}] {SHORT_PROMPT}", WARMUP_TOKENS))
    say(f"{BENCH_PROGRESS_PREFIX}decode: one stream of {output_tokens} tokens")
    decode = client.stream("decode", body(model, f"[{nonce()}] {SHORT_PROMPT}", output_tokens))
    say(f"{BENCH_PROGRESS_PREFIX}prefill: a prompt of about {prompt_tokens} tokens")
    prefill = client.stream("prefill", body(model, sized_prompt(client, model, prompt_tokens), 1))
    say(f"{BENCH_PROGRESS_PREFIX}aggregate: {count} streams of {output_tokens} tokens at once")
    streams = concurrent(client, model, count, output_tokens)
    return figures(decode, prefill, streams)


def log_network(container: str) -> str | None:
    """NCCL's network from the container's log (its first LOG_SCAN_LINES lines, LOG_SCAN_S at most)."""
    try:
        reader = subprocess.Popen(
            ["docker", "logs", container], stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
    except OSError:
        return None
    timer = threading.Timer(LOG_SCAN_S, reader.kill)
    timer.start()
    try:
        heads = zip(range(LOG_SCAN_LINES), reader.stdout, strict=False)
        lines = (raw.decode(errors="replace") for _, raw in heads)
        return nccl_network(lines)
    finally:
        timer.cancel()
        reader.kill()
        reader.wait()


def main(argv: list | None = None) -> int:
    parser = argparse.ArgumentParser(prog="serve_bench", description="Measure the served speed.")
    parser.add_argument("--url", required=True, help="server base URL as seen from here")
    parser.add_argument("--model", required=True, help="served model name")
    parser.add_argument("--output-tokens", type=int, required=True)
    parser.add_argument("--prompt-tokens", type=int, required=True)
    parser.add_argument("--concurrency", type=int, required=True)
    parser.add_argument("--deadline", type=float, required=True, help="seconds for the whole bench")
    parser.add_argument("--log-container", help="the server's container (NCCL's network from its log)")
    args = parser.parse_args(argv)
    started = time.monotonic()
    client = Client(
        args.url, os.environ.get(PROBE_API_KEY_ENV) or None, started + args.deadline, time.monotonic
    )

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    try:
        measured = run(client, args.model, args.output_tokens, args.prompt_tokens, args.concurrency, say)
    except BenchError as exc:
        print(str(exc), file=sys.stderr)
        return Exit.REJECTED if exc.rejected else Exit.FAILED
    report = {
        "figures": measured,
        "nccl_network": log_network(args.log_container) if args.log_container else None,
        "elapsed_s": round(time.monotonic() - started, 1),
        "measured_at": round(time.time()),
    }
    print(json.dumps(report))
    return Exit.OK


if __name__ == "__main__":
    sys.exit(main())
