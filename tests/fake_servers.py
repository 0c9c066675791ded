"""Servers on the loopback interface for the network tests: a Hub that serves the embedded model, and
one that accepts connections and never answers. Nothing here reaches outside 127.0.0.1.

Each server runs in a daemon thread of the test process and is closed by its context manager;
a silent server drops every connection it is holding when it closes.
"""

from __future__ import annotations

import hashlib
import json
import socket
import threading
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

COMMIT = "0123456789abcdef0123456789abcdef01234567"  # the fake repository's only commit


@contextmanager
def silent_server():
    """A TCP server on 127.0.0.1 that accepts every connection and never sends a byte; yields its URL."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    held: list[socket.socket] = []
    closing = threading.Event()

    def accept():
        while not closing.is_set():
            try:
                held.append(listener.accept()[0])
            except OSError:  # the listener was closed
                return

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        closing.set()
        listener.close()
        for connection in held:
            connection.close()


@contextmanager
def fake_hub(repo_id: str, folder: Path, *, hang: tuple[str, ...] = (), token: str | None = None):
    """A Hub on 127.0.0.1 serving the files of `folder` as the model `repo_id`; yields its URL.

    It answers what huggingface_hub asks for a download: the model's info (`/api/models/...`) and
    each file (`/<repo>/resolve/<revision>/<file>`, HEAD and GET, with the commit and ETag headers).
    A request whose path starts with one of `hang` gets no answer (until the server closes), as
    from a Hub that stalls midway. With `token`, the model is gated: a request for it without
    `Authorization: Bearer <token>` gets 401 and the GatedRepo error code, as the Hub answers one
    that has not accepted a gated model's licence (Llama, Gemma).
    """
    files = {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}
    requests: list[str] = []
    release = threading.Event()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):  # quiet: the test reads `requests` instead
            pass

        def do_HEAD(self):
            self._answer(body=False)

        def do_GET(self):
            self._answer(body=True)

        def _answer(self, body: bool):
            requests.append(f"{self.command} {self.path}")
            if any(self.path.startswith(prefix) for prefix in hang):
                release.wait()  # until the test ends
                return
            path = self.path.split("?")[0]
            gated = token is not None and repo_id in path and self.headers.get("Authorization") != f"Bearer {token}"
            if gated:
                headers = {"X-Error-Code": "GatedRepo", "X-Error-Message": "Access to this model is restricted."}
                return self._send(401, b'{"error": "gated"}', body, headers)
            if path == "/":
                return self._send(200, b"fake hub", body, {})
            if path == f"/api/models/{repo_id}" or path.startswith(f"/api/models/{repo_id}/revision/"):
                info = {"id": repo_id, "sha": COMMIT, "siblings": [{"rfilename": n} for n in files]}
                return self._send(200, json.dumps(info).encode(), body, {"Content-Type": "application/json"})
            if path.startswith("/api/models/"):
                return self._send(404, b'{"error": "Repository not found"}', body, {"X-Error-Code": "RepoNotFound"})
            prefix = f"/{repo_id}/resolve/"
            if "/resolve/" in path and not path.startswith(prefix):  # a file of a model it does not have
                return self._send(404, b"not found", body, {"X-Error-Code": "RepoNotFound"})
            name = path[len(prefix) :].split("/", 1)[-1] if path.startswith(prefix) else None
            if name not in files:
                return self._send(404, b"not found", body, {"X-Error-Code": "EntryNotFound"})
            data = files[name]
            headers = {"X-Repo-Commit": COMMIT, "ETag": f'"{hashlib.sha256(data).hexdigest()}"'}
            self._send(200, data, body, headers)

        def _send(self, status: int, data: bytes, body: bool, headers: dict):
            self.send_response(status)
            for key, value in {**headers, "Content-Length": str(len(data))}.items():
                self.send_header(key, value)
            self.end_headers()
            if body:
                self.wfile.write(data)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", requests
    finally:
        release.set()
        server.shutdown()
        server.server_close()
