"""The service's HTTP API: list, submit and cancel jobs from another program or machine.

    GET  /v1/jobs              every job (JSON list)
    GET  /v1/jobs/<id>         one job with its attempts and resizes
    POST /v1/jobs              submit (JSON body: script, args, procs, priority, name,
                               adaptive_batch, max_batch, env, cwd) -> {"job_id": ...}
    POST /v1/jobs/<id>/cancel  cancel

It binds 127.0.0.1 unless told otherwise. Bound to any other address it requires a
token (`Authorization: Bearer <token>`): TANDEM_SCHED_TOKEN, else one made at start and
printed. The API writes the same store the CLI writes: it is a convenience, not a second
source of truth.
"""

from __future__ import annotations

import dataclasses
import hmac
import ipaddress
import json
import logging
import os
import secrets
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from tandem.sched.service.jobstore import SchedStore
from tandem.sched.service.submit import from_json, submit

log = logging.getLogger("tandem")
TOKEN_ENV = "TANDEM_SCHED_TOKEN"
MAX_BODY = 1 << 20


def is_loopback(host: str) -> bool:
    """Whether `host` is a loopback address (or the name 'localhost')."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class Api:
    """The HTTP server in a thread of its own."""

    def __init__(self, store: Path, host: str = "127.0.0.1", port: int = 0,
                 token: str | None = None) -> None:
        self.store = store
        token = token or os.environ.get(TOKEN_ENV) or None
        if token is None and not is_loopback(host):
            token = secrets.token_urlsafe(24)
        self.token = token
        self.server = ThreadingHTTPServer((host, port), self._handler())
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True,
                                       name="tandem-sched-api")

    @property
    def url(self) -> str:
        """Where the API listens."""
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> None:
        """Serve in the background."""
        self.thread.start()

    def close(self) -> None:
        """Stop serving."""
        self.server.shutdown()
        self.server.server_close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, fmt: str, *args: Any) -> None:
                log.debug("api: " + fmt, *args)

            def _send(self, code: int, body: Any) -> None:
                data = json.dumps(body, default=str).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _allowed(self) -> bool:
                if api.token is None:
                    return True
                given = self.headers.get("Authorization", "")
                if hmac.compare_digest(given.encode(), f"Bearer {api.token}".encode()):
                    return True
                self._send(401, {"error": "a valid token is needed (Authorization: Bearer)"})
                return False

            def do_GET(self) -> None:  # noqa: N802 - the http.server protocol
                if self._allowed():
                    self._answer(api.get, self.path)

            def do_POST(self) -> None:  # noqa: N802
                if not self._allowed():
                    return
                length = int(self.headers.get("Content-Length") or 0)
                if length > MAX_BODY:
                    self._send(413, {"error": f"body over {MAX_BODY} bytes"})
                    return
                raw = self.rfile.read(length) if length else b"{}"
                try:
                    body = json.loads(raw or b"{}")
                except ValueError as err:
                    self._send(400, {"error": f"body is not JSON: {err}"})
                    return
                self._answer(lambda path: api.post(path, body), self.path)

            def _answer(self, fn: Any, path: str) -> None:
                try:
                    code, body = fn(path)
                except ValueError as err:
                    code, body = 400, {"error": str(err)}
                self._send(code, body)

        return Handler

    def get(self, path: str) -> tuple[int, Any]:
        """GET routes."""
        parts = [p for p in path.split("?")[0].split("/") if p]
        with SchedStore(self.store) as store:
            if parts == ["v1", "jobs"]:
                return 200, [dataclasses.asdict(j) for j in store.jobs()]
            if len(parts) == 3 and parts[:2] == ["v1", "jobs"]:
                job = store.job(parts[2])
                return 200, {**dataclasses.asdict(job),
                             "attempts": [dataclasses.asdict(a)
                                          for a in store.attempts(job.job_id)],
                             "resizes": store.resizes(job.job_id)}
        return 404, {"error": f"no route GET {path}"}

    def post(self, path: str, body: Any) -> tuple[int, Any]:
        """POST routes."""
        parts = [p for p in path.split("?")[0].split("/") if p]
        if parts == ["v1", "jobs"]:
            if not isinstance(body, dict):
                raise ValueError("body: a JSON object is needed")
            job = submit(from_json(body), self.store)
            return 201, {"job_id": job.job_id, "run_name": job.run_name}
        if len(parts) == 4 and parts[:2] == ["v1", "jobs"] and parts[3] == "cancel":
            with SchedStore(self.store) as store:
                return 200, {"result": store.cancel(parts[2])}
        return 404, {"error": f"no route POST {path}"}
