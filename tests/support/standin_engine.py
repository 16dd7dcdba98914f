"""A stand-in Docker Engine API on a unix socket, for the node programs that ask it before the CLI
(`node_programs/docker_facts.py`, `image_tag.py`, through `engine_api.py`) or only ask it
(`gpu_memory.run_probe`: `routes`)."""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Callable
from pathlib import Path

# An answer: (status, raw body), or a callable of the request's body that gives one.
Route = tuple[int, bytes] | Callable[[bytes], tuple[int, bytes]]


class StandinEngine:
    """A stand-in Docker Engine API on a unix socket: one image under `tmp_ref`; records each request
    and what the tag and untag requests changed."""

    def __init__(self, folder: Path, tmp_ref: str = "", loaded: dict | None = None):
        import http.server
        import socketserver
        import threading

        self.path = str(folder / "engine.sock")
        self.requests: list[str] = []
        self.refs = {tmp_ref: loaded} if tmp_ref else {}
        # (method, path without its query) -> Route: answered before anything else (containers).
        self.routes: dict[tuple[str, str], Route] = {}
        self.drop_delete_answer = False
        self.info: dict | None = None  # GET /info's answer (404 when None)
        self.histories: dict[str, list] = {}  # GET /images/<ref>/history's answers
        self.broken: set[str] = set()  # paths answered 500
        self.listed: dict[str, dict] = {}  # GET /images/json?all=1's images (and their inspections), by ID
        engine = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def address_string(self):
                return "local"

            def log_message(self, *args):
                pass

            def answer(self, status: int, body: object = None):
                data = json.dumps(body).encode() if body is not None else b""
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def routed(self, method: str) -> bool:
                route = engine.routes.get((method, self.path.partition("?")[0]))
                if route is None:
                    return False
                size = int(self.headers.get("Content-Length") or 0)
                status, data = route(self.rfile.read(size)) if callable(route) else route
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                return True

            def do_GET(self):
                engine.requests.append(f"GET {self.path}")
                if self.routed("GET"):
                    return
                if self.path in engine.broken:
                    return self.answer(500, {"message": "broken"})
                if self.path == "/info":
                    return self.answer(200, engine.info) if engine.info else self.answer(404, {})
                if self.path == "/images/json?all=1":
                    return self.answer(200, [{"Id": image_id} for image_id in engine.listed])
                listed = engine.listed.get(urllib.parse.unquote(self.path)[len("/images/") : -len("/json")])
                if listed is not None:
                    return self.answer(200, listed)
                if self.path.endswith("/history"):
                    ref = urllib.parse.unquote(self.path.removeprefix("/images/").removesuffix("/history"))
                    found = engine.histories.get(ref)
                    return self.answer(200, found) if found is not None else self.answer(404, {})
                ref = urllib.parse.unquote(self.path.removeprefix("/images/").removesuffix("/json"))
                self.answer(200, engine.refs[ref]) if ref in engine.refs else self.answer(404, {})

            def do_POST(self):
                engine.requests.append(f"POST {self.path}")
                if self.routed("POST"):
                    return
                path, _, query = self.path.partition("?")
                ref = urllib.parse.unquote(path.removeprefix("/images/").removesuffix("/tag"))
                asked = dict(urllib.parse.parse_qsl(query))
                engine.refs[f"{asked['repo']}:{asked['tag']}"] = engine.refs[ref]
                self.answer(201)

            def do_DELETE(self):
                engine.requests.append(f"DELETE {self.path}")
                if self.routed("DELETE"):
                    return
                gone = engine.refs.pop(urllib.parse.unquote(self.path.removeprefix("/images/")), None)
                if engine.drop_delete_answer:  # removed, but the answer is lost
                    self.close_connection = True
                    self.wfile.flush()
                    self.connection.shutdown(2)
                    return
                self.answer(200, []) if gone else self.answer(404, {"message": "No such image"})

        class Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
            daemon_threads = True

        self.server = Server(self.path, Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()
