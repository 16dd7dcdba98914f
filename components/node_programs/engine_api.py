"""The Docker Engine API over the daemon's unix socket, for the node programs (a library, standard
library only: `program_argv` ships it with every program that imports it).

A `docker` CLI command costs a process start: tens of milliseconds of a Go runtime's CPU, on a node
that is meanwhile running sshd, the copy and the daemon. The same request to the Engine API takes a
few milliseconds. Programs ask it only where the CLI would talk to the same daemon
(`engine_socket`), and fall back to the CLI on any failure (`FAILED`), so the outcomes and error
messages an operator sees are the CLI's.

HTTP/1.0, one request per connection: the daemon answers and closes the connection, so there is no
keep-alive to manage and no chunked body to expect (one is decoded all the same). No `http.client`
or `urllib`: their imports alone cost ~40 ms on a node, more than the requests.
"""

from __future__ import annotations

import json
import os
import socket
import time

_UNRESERVED = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-~")
_ANSWER_LIMIT = 64 << 20  # an answer this long is not one of the few-kilobyte answers asked for


class EngineError(Exception):
    """An answer that is not a complete HTTP response."""


# What a caller catches to fall back to the CLI: no socket, a refused or dropped connection, an
# answer cut short or not HTTP, a body that is not the JSON expected.
FAILED = (OSError, EngineError, ValueError, KeyError, TypeError, AttributeError)


def quote(text: str, safe: str = "/:@") -> str:
    """`text` percent-encoded for a URL path or query: urllib.parse.quote's result, without its import."""
    keep = _UNRESERVED | set(safe)
    return "".join(ch if ch in keep else "".join(f"%{byte:02X}" for byte in ch.encode()) for ch in text)


def engine_socket() -> str | None:
    """The daemon's unix socket as the docker CLI would pick it, when that is plain: DOCKER_HOST
    unix://…, or no DOCKER_HOST, no context chosen and the default socket. None: ask the CLI."""
    host = os.environ.get("DOCKER_HOST", "")
    if host:
        return host[len("unix://") :] if host.startswith("unix://") else None
    if os.environ.get("DOCKER_CONTEXT"):
        return None
    config = os.path.join(os.environ.get("DOCKER_CONFIG") or os.path.expanduser("~/.docker"), "config.json")
    try:
        with open(config) as handle:
            if json.load(handle).get("currentContext") not in (None, "", "default"):
                return None
    except FileNotFoundError:
        pass
    except (OSError, ValueError, AttributeError):
        return None
    return "/var/run/docker.sock"


def call(
    path: str,
    method: str,
    url: str,
    timeout: float | None = None,
    body: object = None,
    *,
    limit: int = _ANSWER_LIMIT,
    total_s: float | None = None,
) -> tuple[int, bytes]:
    """One request to the engine on unix socket `path`: its status and body. `body`, when given, is
    sent as JSON. No time limit by default, as the CLI has none (removing an image can be slow):
    `timeout` bounds each socket operation, `total_s` the whole exchange, `limit` the answer's bytes."""
    data = b"" if body is None else json.dumps(body).encode()
    kind = "" if body is None else "Content-Type: application/json\r\n"
    deadline = None if total_s is None else time.monotonic() + total_s
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        sock.connect(path)
        head = f"{method} {url} HTTP/1.0\r\nHost: docker\r\n{kind}Content-Length: {len(data)}\r\n\r\n"
        sock.sendall(head.encode() + data)
        chunks, size = [], 0
        while True:
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise EngineError(f"{method} {url}: no complete answer within {total_s:g} s")
                sock.settimeout(left if timeout is None else min(timeout, left))
            try:
                data = sock.recv(65536)
            except TimeoutError:
                if deadline is not None and time.monotonic() >= deadline:
                    raise EngineError(f"{method} {url}: no complete answer within {total_s:g} s") from None
                raise
            if not data:
                break
            chunks.append(data)
            size += len(data)
            if size > limit:
                raise EngineError(f"{method} {url}: an answer over {limit} bytes")
    finally:
        sock.close()
    return parse_answer(b"".join(chunks))


def parse_answer(raw: bytes) -> tuple[int, bytes]:
    """The status and body of one complete HTTP/1.x answer (pure)."""
    head, found, body = raw.partition(b"\r\n\r\n")
    if not found:
        raise EngineError(f"no complete answer ({len(raw)} bytes)")
    lines = head.split(b"\r\n")
    version, status = (lines[0].split(None, 2) + [b""])[:2]
    if not version.startswith(b"HTTP/1.") or not status.isdigit():
        raise EngineError(f"not an HTTP answer: {lines[0][:80]!r}")
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        headers[name.strip().lower()] = value.strip()
    if headers.get(b"transfer-encoding", b"").lower() == b"chunked":
        body = _dechunk(body)
    elif b"content-length" in headers:
        length = int(headers[b"content-length"])
        if len(body) < length:
            raise EngineError(f"answer cut short: {len(body)} of {length} bytes")
        body = body[:length]
    return int(status), body


def _dechunk(body: bytes) -> bytes:
    out, at = [], 0
    while True:
        line_end = body.find(b"\r\n", at)
        if line_end < 0:
            raise EngineError("chunked answer cut short")
        size = int(body[at:line_end].split(b";")[0], 16)
        if size == 0:
            return b"".join(out)
        start = line_end + 2
        if len(body) < start + size:
            raise EngineError("chunked answer cut short")
        out.append(body[start : start + size])
        at = start + size + 2


def get_json(path: str, url: str, timeout: float | None = None) -> tuple[int, object]:
    """GET `url`: its status and JSON body (None for an empty body)."""
    status, body = call(path, "GET", url, timeout)
    return status, json.loads(body) if body.strip() else None


def image_line(found: dict) -> str:
    """`docker image inspect --format INSPECT_FORMAT`'s line (`wire`) for an image's inspect answer."""
    layers = json.dumps((found.get("RootFS") or {}).get("Layers"), separators=(",", ":"))
    return f"{json.dumps(found['Id'])}\t{layers}\t{found.get('Size') or 0}"


def info_line(info: dict) -> str:
    """`docker info --format INFO_FORMAT`'s line (`wire`) for the daemon's info answer."""
    status = json.dumps(info.get("DriverStatus"), separators=(",", ":"))
    return f"{status}\t{info['DockerRootDir']}\t{info['ServerVersion']}\t{info.get('Driver') or ''}"
