"""A small stand-in for vLLM's OpenAI-compatible server (standard library only), for readiness tests.

Modes: `healthy` answers like a served model; `unhealthy` answers /health with 500 (a crashed
engine); `loading` answers /health with 503 forever (a model that never finishes loading);
`no-tokens` completes with zero tokens. `ready_after_s` keeps any mode `loading` for a while first.

    python3 -m tests.support.standin_openai --host 127.0.0.2 --port 18001 --model m --mode healthy
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MODES = ("healthy", "unhealthy", "loading", "no-tokens")


class StandinServer(ThreadingHTTPServer):
    """The server, with its behaviour as attributes tests can change while it runs."""

    daemon_threads = True

    def __init__(self, host: str, port: int, model: str, mode: str = "healthy", api_key: str | None = None):
        if mode not in MODES:
            raise ValueError(f"mode {mode!r}: one of {MODES}")
        super().__init__((host, port), _Handler)
        self.model = model
        self.mode = mode
        self.api_key = api_key
        self.ready_at = time.monotonic()
        self.requests: list[str] = []

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"

    def current_mode(self) -> str:
        return "loading" if time.monotonic() < self.ready_at else self.mode

    def start(self) -> StandinServer:
        threading.Thread(
            target=self.serve_forever, kwargs={"poll_interval": 0.05}, name="standin-openai", daemon=True
        ).start()
        return self


def probe_props(
    node: dict, server: StandinServer, *, api_key: str | None, log_container: str | None = None
) -> dict:
    """The readiness gate's inputs for a probe on `node` (a node dict) of this stand-in (no Ray)."""
    return {
        "node": node,
        "server_id": "standin",
        "url": server.url,
        "model": server.model,
        "expect_nodes": 1,
        "expect_gpus": 1,
        "deadline_s": 20,
        "ray_container": None,  # explicit: no Ray behind a stand-in
        "log_container": log_container,
        "api_key": api_key,
    }


class _Handler(BaseHTTPRequestHandler):
    server: StandinServer

    def log_message(self, *_args) -> None:  # keep test output quiet
        return None

    def _send(self, status: int, body: dict | str) -> None:
        data = (json.dumps(body) if isinstance(body, dict) else body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json" if isinstance(body, dict) else "text/plain")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _authorized(self) -> bool:
        if not self.server.api_key:
            return True
        if self.headers.get("Authorization") == f"Bearer {self.server.api_key}":
            return True
        self._send(401, {"error": "Unauthorized"})
        return False

    def do_GET(self) -> None:
        self.server.requests.append(f"GET {self.path}")
        mode = self.server.current_mode()
        if self.path == "/health":
            status = {"unhealthy": 500, "loading": 503}.get(mode, 200)
            self._send(status, "" if status == 200 else "engine not ready")
        elif self.path == "/v1/models":
            if mode == "loading":
                self._send(503, {"error": "loading"})
            elif self._authorized():
                self._send(200, {"object": "list", "data": [{"id": self.server.model, "object": "model"}]})
        else:
            self._send(404, {"error": "not found"})

    def do_POST(self) -> None:
        self.server.requests.append(f"POST {self.path}")
        if self.path != "/v1/chat/completions":
            self._send(404, {"error": "not found"})
            return
        if not self._authorized():
            return
        length = int(self.headers.get("Content-Length") or 0)
        request = json.loads(self.rfile.read(length) or b"{}")
        if request.get("model") != self.server.model:
            self._send(404, {"error": f"model {request.get('model')!r} does not exist"})
            return
        tokens = 0 if self.server.current_mode() == "no-tokens" else 2
        self._send(
            200,
            {
                "object": "chat.completion",
                "model": self.server.model,
                "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": "ready" * (tokens > 0)}}
                ],
                "usage": {"prompt_tokens": 9, "completion_tokens": tokens, "total_tokens": 9 + tokens},
            },
        )


def main() -> None:
    parser = argparse.ArgumentParser(description="stand-in OpenAI-compatible server")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--model", required=True)
    parser.add_argument("--mode", choices=MODES, default="healthy")
    parser.add_argument("--api-key")
    args = parser.parse_args()
    server = StandinServer(args.host, args.port, args.model, args.mode, args.api_key)
    print(server.url, flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
