"""A loopback HTTP server that behaves like Better Stack's Uptime API for incidents.

What it does like Better Stack: ``Authorization: Bearer <token>`` checked on every request
(401 ``{"errors": "Invalid Team API token"}`` otherwise); ``POST /api/v2/incidents`` (and
``/api/v3/incidents``) needs a ``summary`` (422 otherwise), answers 201 with
``{"data": {"id", "type": "incident", "attributes"}}`` and a fresh string id;
``POST /api/v2/incidents/<id>/resolve`` answers 200 with the resolved incident, 404 for
an unknown id and 409 ``Incident was already resolved``; ``GET /api/v2/incidents`` lists
them. Anything else answers 404.

Faults a test drives: :meth:`fail_with` answers every request with a status until
:meth:`heal`; :meth:`hang` accepts requests and answers none until :meth:`heal` (the
handlers then answer what they would have); :meth:`trickle` starts every answer and
then sends one byte of it every 50 ms until :meth:`heal`. Every request is recorded.

Runs in a thread of the test process; worker processes reach it on 127.0.0.1.
"""

from __future__ import annotations

import json
import re
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

TOKEN = "bs_test_token_5f0c3a9e7d"

_RESOLVE = re.compile(r"^/api/v2/incidents/([^/]+)/resolve$")


@dataclass
class Request:
    at: float
    method: str
    path: str
    status: int = 0
    body: Any = None


@dataclass
class Incident:
    id: str
    summary: str
    name: str | None
    description: str | None
    requester_email: str | None
    started_at: str
    resolved_at: str | None = None
    resolved_by: str | None = None
    raw: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "incident",
            "attributes": {
                "name": self.name,
                "cause": self.summary,
                "started_at": self.started_at,
                "resolved_at": self.resolved_at,
                "resolved_by": self.resolved_by,
                "status": "Resolved" if self.resolved_at else "Started",
            },
        }


class BetterStackServer:
    """The incidents part of Better Stack's Uptime API, on loopback."""

    def __init__(self, token: str = TOKEN) -> None:
        self.token = token
        self.incidents: dict[str, Incident] = {}
        self.requests: list[Request] = []
        self._lock = threading.Lock()
        self._next_id = 1000
        self._failing: int | None = None
        self._hanging = False
        self._trickling = False
        self._healed = threading.Condition(self._lock)
        self.hung = 0
        """Requests that arrived while the server hung (counted as they arrive)."""
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                server._handle(self, "GET")

            def do_POST(self) -> None:
                server._handle(self, "POST")

            def log_message(self, *args: Any) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    # --- what a test drives --------------------------------------------------------
    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def fail_with(self, status: int) -> None:
        """Answer every request with ``status`` until :meth:`heal`."""
        with self._lock:
            self._failing = status

    def hang(self) -> None:
        """Accept requests and answer none until :meth:`heal`."""
        with self._lock:
            self._hanging = True

    def trickle(self) -> None:
        """Start every answer, then send it a byte at a time, slowly, until :meth:`heal`."""
        with self._lock:
            self._trickling = True

    def heal(self) -> None:
        with self._lock:
            self._failing = None
            self._hanging = False
            self._trickling = False
            self._healed.notify_all()

    def open_incidents(self) -> list[Incident]:
        with self._lock:
            return [i for i in self.incidents.values() if i.resolved_at is None]

    def all_incidents(self) -> list[Incident]:
        with self._lock:
            return list(self.incidents.values())

    def count(self, method: str, path_prefix: str, status: int | None = None) -> int:
        with self._lock:
            return sum(
                1
                for r in self.requests
                if r.method == method
                and r.path.startswith(path_prefix)
                and (status is None or r.status == status)
            )

    # --- the API -------------------------------------------------------------------
    def _handle(self, handler: BaseHTTPRequestHandler, method: str) -> None:
        length = int(handler.headers.get("Content-Length") or 0)
        raw = handler.rfile.read(length) if length else b""
        path = handler.path.split("?", 1)[0]
        request = Request(time.monotonic(), method, path)
        with self._lock:
            self.requests.append(request)
            if self._hanging:
                self.hung += 1
                while self._hanging:
                    self._healed.wait()
            failing = self._failing
            trickling = self._trickling
        if trickling:
            self._trickle(handler, request)
            return
        if failing is not None:
            self._answer(handler, request, failing, {"errors": "Internal Server Error"})
            return
        if handler.headers.get("Authorization") != f"Bearer {self.token}":
            self._answer(handler, request, 401, {"errors": "Invalid Team API token"})
            return
        try:
            body = json.loads(raw) if raw else {}
        except ValueError:
            self._answer(handler, request, 400, {"errors": "Invalid JSON"})
            return
        request.body = body
        if method == "GET" and path == "/api/v2/incidents":
            with self._lock:
                data = [i.to_json() for i in self.incidents.values()][:1]
            self._answer(handler, request, 200, {"data": data, "pagination": {}})
        elif method == "POST" and path in ("/api/v2/incidents", "/api/v3/incidents"):
            self._create(handler, request, body)
        elif method == "POST" and (match := _RESOLVE.match(path)):
            self._resolve(handler, request, match[1], body)
        else:
            self._answer(handler, request, 404, {"errors": "Resource not found"})

    def _create(self, handler: BaseHTTPRequestHandler, request: Request, body: Any) -> None:
        if not isinstance(body, dict) or not isinstance(body.get("summary"), str):
            self._answer(handler, request, 422, {"errors": "Summary can't be blank"})
            return
        with self._lock:
            self._next_id += 1
            incident = Incident(
                id=str(self._next_id),
                summary=body["summary"],
                name=body.get("name"),
                description=body.get("description"),
                requester_email=body.get("requester_email"),
                started_at=datetime.now(UTC).isoformat(),
                raw=body,
            )
            self.incidents[incident.id] = incident
        self._answer(handler, request, 201, {"data": incident.to_json()})

    def _resolve(
        self, handler: BaseHTTPRequestHandler, request: Request, incident_id: str, body: Any
    ) -> None:
        with self._lock:
            incident = self.incidents.get(incident_id)
            if incident is not None and incident.resolved_at is None:
                incident.resolved_at = datetime.now(UTC).isoformat()
                incident.resolved_by = (body or {}).get("resolved_by")
                answer: tuple[int, Any] = (200, {"data": incident.to_json()})
            elif incident is not None:
                answer = (409, {"errors": "Incident was already resolved"})
            else:
                answer = (404, {"errors": "Resource not found"})
        self._answer(handler, request, *answer)

    def _trickle(self, handler: BaseHTTPRequestHandler, request: Request) -> None:
        request.status = 201
        try:
            handler.send_response(201)
            handler.send_header("Content-Type", "application/json")
            handler.send_header("Content-Length", "1000000")
            handler.end_headers()
            handler.wfile.flush()
            while True:
                with self._lock:
                    if not self._trickling:
                        return
                handler.wfile.write(b" ")
                handler.wfile.flush()
                time.sleep(0.05)  # the fault itself: an answer that never completes
        except OSError:  # the client gave up: what this fault is for
            pass

    def _answer(
        self, handler: BaseHTTPRequestHandler, request: Request, status: int, body: Any
    ) -> None:
        request.status = status
        data = json.dumps(body).encode()
        try:
            handler.send_response(status)
            handler.send_header("Content-Type", "application/json")
            handler.send_header("Content-Length", str(len(data)))
            handler.end_headers()
            handler.wfile.write(data)
        except OSError:  # the client gave up (its timeout): nothing to answer
            pass

    def __enter__(self) -> BetterStackServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.heal()
        self.server.shutdown()
        self.server.server_close()
