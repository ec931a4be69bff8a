"""A loopback HTTP server that behaves like Resend's email API, for tests and benchmarks.

What it does like Resend: ``POST /emails`` (one email) and ``POST /emails/batch`` (1 to 100),
``Authorization: Bearer`` checked, recipients' addresses validated (a batch with
``x-batch-validation: permissive`` sends its valid emails and answers the invalid ones in
``errors``, ``[{index, message}]``; otherwise one invalid email refuses the request with a
422), ``Idempotency-Key`` kept (same key and body: the same
ids again, nothing sent twice; same key, other body: 409 ``invalid_idempotent_request``;
the key still in flight: 409 ``concurrent_idempotent_requests``), a team request-rate
limit (429 ``rate_limit_exceeded`` with ``retry-after`` and ``ratelimit-*`` headers on
every answer), daily-quota 429s and scripted faults (5xx, a 429 with a chosen
``retry-after``). Every request is recorded, including requests to paths Resend has and
the adapter must never call (``/contacts``, ``/audiences``...): they answer 404 here.

Runs in a thread of the test process; worker processes reach it on 127.0.0.1. A request
is stamped with the time its first bytes reached this machine's network stack (the
kernel's receive timestamp), not the time a thread of this process got round to reading
it: a provider on another machine counts what its network received, and this process
shares two cores with the workers it serves (a reading thread waits for the GIL and
the CPU; measured up to 51 ms late under the throughput benchmark's load). Its rate limit
counts those stamps, whatever order the threads handle the requests in.
"""

from __future__ import annotations

import bisect
import contextlib
import hashlib
import json
import os
import re
import socket
import struct
import threading
import time
import uuid
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

API_KEY = "re_test_0123456789abcdef"


@dataclass
class Request:
    """One request as the server saw it: ``at`` when it arrived, ``answered`` when its
    answer was decided (what a sender can know of it from then on)."""

    at: float
    method: str
    path: str
    idempotency_key: str | None
    status: int = 0
    name: str = ""
    body: Any = None
    replayed: bool = False
    answered: float = 0.0


@dataclass
class Email:
    """One email the server accepted (first time for its key)."""

    id: str
    idempotency_key: str | None
    index: int
    to: list[str]
    subject: str
    at: float
    raw: dict[str, Any] = field(default_factory=dict)


@dataclass
class Fault:
    status: int
    name: str
    headers: dict[str, str]
    message: str


class ResendLikeServer:
    """Start with ``with ResendLikeServer(rate_limit=5) as server: server.url``."""

    def __init__(
        self,
        *,
        rate_limit: float | None = None,
        api_key: str = API_KEY,
        advertised_limit: int | None = None,
        nice: int | None = None,
    ) -> None:
        self.api_key = api_key
        self.nice = nice
        """Scheduling priority of the server's threads (``-10``: ahead of the workers).

        A provider is another machine: it answers while the workers load this machine's
        cores. Arrival stamps do not depend on it (they come from the kernel, see the
        module); it keeps the answers, and so the senders' next requests, prompt.
        Ignored where the process may not raise its priority."""
        self.rate_limit = rate_limit
        self.advertised_limit = advertised_limit
        self.lock = threading.Lock()
        self.requests: list[Request] = []
        self.emails: list[Email] = []
        self._idempotent: dict[str, tuple[str, bytes, str]] = {}
        """Idempotency key → (path, body digest, reply), as Resend keeps them for 24 h."""
        self._in_flight: set[str] = set()
        self._faults: deque[Fault] = deque()
        self._keyed_faults: dict[str, deque[Fault]] = {}
        """Faults for the requests of one idempotency key, ahead of the others."""
        self._window: list[float] = []
        """Arrival stamps of the requests let through in the last seconds, sorted (threads
        handle requests in another order than they arrived)."""
        self._quota_until = 0.0
        self.gate = threading.Event()
        """Accepted requests wait for this to be set before answering (set by default)."""
        self.gate.set()
        self.answer_delay = 0.0
        """Seconds an accepted request's answer is held back after the email was sent
        (its key stored): longer than a client's timeout, the sender never learns it."""
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.request_lines = 0
        """Request lines read so far (a request is counted from there, body or not)."""

    # -- control -------------------------------------------------------------------------

    @property
    def url(self) -> str:
        assert self._httpd is not None
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def start(self) -> ResendLikeServer:
        server = self

        class Handler(_Handler):
            owner = server

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._serve, args=(self._httpd,), daemon=True)
        self._thread.start()
        return self

    def _serve(self, httpd: ThreadingHTTPServer) -> None:
        if self.nice is not None:
            # threads a thread starts inherit its priority: every connection's thread
            with contextlib.suppress(OSError):
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), self.nice)
        httpd.serve_forever()

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    def __enter__(self) -> ResendLikeServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def fail_next(
        self,
        status: int,
        name: str,
        *,
        count: int = 1,
        headers: dict[str, str] | None = None,
        message: str = "scripted",
        key: str | None = None,
    ) -> None:
        """Answer the next ``count`` email requests with this error (``key``: only the
        requests carrying that ``Idempotency-Key``)."""
        with self.lock:
            faults = self._faults if key is None else self._keyed_faults.setdefault(key, deque())
            for _ in range(count):
                faults.append(Fault(status, name, dict(headers or {}), message))

    def forget_keys(self) -> None:
        """Drop every idempotency key, as Resend does after 24 hours."""
        with self.lock:
            self._idempotent.clear()

    def in_flight(self) -> int:
        with self.lock:
            return len(self._in_flight)

    def exhaust_quota(self, seconds: float) -> None:
        """Answer 429 ``daily_quota_exceeded`` for ``seconds``."""
        with self.lock:
            self._quota_until = time.monotonic() + seconds

    # -- what happened -------------------------------------------------------------------

    def snapshot(self) -> tuple[list[Request], list[Email]]:
        with self.lock:
            return list(self.requests), list(self.emails)

    def sent_requests(self) -> list[Request]:
        """Requests that sent something new (2xx, not an idempotent replay)."""
        with self.lock:
            return [r for r in self.requests if 200 <= r.status < 300 and not r.replayed]

    # -- the API -------------------------------------------------------------------------

    def handle(
        self,
        method: str,
        path: str,
        headers: dict[str, str],
        raw: bytes,
        arrived: float | None = None,
    ) -> tuple[int, dict[str, str], Any]:
        """Answer one request; ``arrived`` is when its request line was read (the time
        the rate limit counts), not when its body was."""
        now = time.monotonic() if arrived is None else arrived
        key = headers.get("idempotency-key")
        record = Request(at=now, method=method, path=path, idempotency_key=key)
        with self.lock:
            self.requests.append(record)
        status, extra, body = self._answer(record, method, path, headers, raw, now)
        record.answered = time.monotonic()
        record.status = status
        if isinstance(body, dict) and "name" in body and status >= 400:
            record.name = str(body["name"])
        return status, extra, body

    def _limit_headers(self, now: float) -> dict[str, str]:
        limit = self.advertised_limit or self.rate_limit
        if limit is None:
            return {}
        remaining = max(0, int(limit) - self._in_window(now))
        return {
            "ratelimit-limit": str(int(limit)),
            "ratelimit-remaining": str(remaining),
            "ratelimit-reset": "1",
        }

    def _in_window(self, end: float) -> int:
        """Requests let through that arrived in the second ending at ``end``."""
        w = self._window
        return bisect.bisect_right(w, end) - bisect.bisect_right(w, end - 1.0)

    def _fullest_window(self, at: float) -> int:
        """The most requests let through in any second that holds the instant ``at``.

        A request that arrived at ``at`` but is handled after later ones must fit in every
        second around it, not only in the second that ends when it arrived.
        """
        w = self._window
        ends = [at, *w[bisect.bisect_left(w, at) : bisect.bisect_left(w, at + 1.0)]]
        return max(self._in_window(end) for end in ends)

    def _answer(
        self,
        record: Request,
        method: str,
        path: str,
        headers: dict[str, str],
        raw: bytes,
        now: float,
    ) -> tuple[int, dict[str, str], Any]:
        if path not in ("/emails", "/emails/batch") or method != "POST":
            return 404, {}, _error(404, "not_found", f"{method} {path} is not served here")
        if headers.get("authorization") != f"Bearer {self.api_key}":
            return 401, {}, _error(401, "missing_api_key", "Missing API key")
        try:
            body = json.loads(raw)
        except ValueError:
            return 422, {}, _error(422, "validation_error", "body is not JSON")
        record.body = body
        with self.lock:
            newest = max(now, self._window[-1]) if self._window else now
            del self._window[: bisect.bisect_right(self._window, newest - _KEPT_SECONDS)]
            keyed = self._keyed_faults.get(record.idempotency_key or "")
            if keyed or self._faults:
                fault = keyed.popleft() if keyed else self._faults.popleft()
                extra = {**self._limit_headers(now), **fault.headers}
                return fault.status, extra, _error(fault.status, fault.name, fault.message)
            if now < self._quota_until:
                left = str(max(1, int(self._quota_until - now + 0.999)))
                return (
                    429,
                    {"retry-after": left},
                    _error(429, "daily_quota_exceeded", "You have reached your daily email quota"),
                )
            if self.rate_limit is not None and self._fullest_window(now) >= self.rate_limit:
                oldest = self._window[bisect.bisect_right(self._window, now - 1.0)]
                wait = max(0.001, oldest + 1.0 - now)
                extra = {**self._limit_headers(now), "retry-after": str(max(1, round(wait)))}
                return 429, extra, _error(429, "rate_limit_exceeded", "Too many requests")
            bisect.insort(self._window, now)
            limit_headers = self._limit_headers(now)
            digest = hashlib.sha256(raw).digest()
            if key := record.idempotency_key:
                if not 1 <= len(key) <= 256:
                    return 422, {}, _error(422, "invalid_idempotency_key", "1-256 characters")
                seen = self._idempotent.get(key)
                if seen is not None:
                    if seen[0] != path or seen[1] != digest:
                        return (
                            409,
                            limit_headers,
                            _error(
                                409,
                                "invalid_idempotent_request",
                                "Same idempotency key used with a different request payload",
                            ),
                        )
                    record.replayed = True
                    return 200, limit_headers, json.loads(seen[2])
                if key in self._in_flight:
                    return (
                        409,
                        limit_headers,
                        _error(
                            409,
                            "concurrent_idempotent_requests",
                            "Same idempotency key used while original request is still in progress",
                        ),
                    )
                self._in_flight.add(key)
        try:
            self.gate.wait(timeout=60)
            answer = self._accept(record, path, headers, body, digest, limit_headers, now)
            if self.answer_delay > 0:
                threading.Event().wait(self.answer_delay)  # a slow answer, not a sync point
            return answer
        finally:
            if record.idempotency_key:
                with self.lock:
                    self._in_flight.discard(record.idempotency_key)

    def _accept(
        self,
        record: Request,
        path: str,
        headers: dict[str, str],
        body: Any,
        digest: bytes,
        limit_headers: dict[str, str],
        now: float,
    ) -> tuple[int, dict[str, str], Any]:
        items = body if path == "/emails/batch" else [body]
        if not isinstance(items, list) or not 1 <= len(items) <= 100:
            return (
                422,
                limit_headers,
                _error(422, "validation_error", "a batch holds 1 to 100 emails"),
            )
        for item in items:
            if (
                not isinstance(item, dict)
                or not item.get("from")
                or not item.get("to")
                or not item.get("subject")
            ):
                return (
                    422,
                    limit_headers,
                    _error(422, "missing_required_field", "from, to and subject are required"),
                )
        invalid = {
            index: problem
            for index, item in enumerate(items)
            if (problem := _invalid_recipient(item)) is not None
        }
        permissive = path == "/emails/batch" and headers.get("x-batch-validation") == "permissive"
        if invalid and not permissive:
            first = next(iter(invalid.values()))
            return 422, limit_headers, _error(422, "validation_error", first)
        accepted = []
        for index, item in enumerate(items):
            if index in invalid:
                continue
            to = item["to"] if isinstance(item["to"], list) else [item["to"]]
            accepted.append(
                Email(
                    id=str(uuid.uuid4()),
                    idempotency_key=record.idempotency_key,
                    index=index,
                    to=to,
                    subject=item["subject"],
                    at=now,
                    raw=item,
                )
            )
        reply: Any
        if path == "/emails/batch":
            reply = {"data": [{"id": e.id} for e in accepted]}
            if permissive:
                reply["errors"] = [{"index": i, "message": m} for i, m in sorted(invalid.items())]
        else:
            reply = {"id": accepted[0].id}
        with self.lock:
            self.emails.extend(accepted)
            if record.idempotency_key:
                self._idempotent[record.idempotency_key] = (path, digest, json.dumps(reply))
        return 200, limit_headers, reply


_LOCAL = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+(?:\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*"
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
_ADDRESS = re.compile(rf"{_LOCAL}@(?:{_LABEL}\.)+[A-Za-z]{{2,}}")
_NAMED = re.compile(r"[^<>]*<(?P<address>[^<>]+)>")


def _invalid_recipient(item: dict[str, Any]) -> str | None:
    """Resend's complaint about an email's ``to``, or ``None`` when every address is valid.

    Stricter than the adapter's own check, as the provider is: ``a..b@example.org``
    passes a client that only looks for ``x@y.z``."""
    for value in item["to"] if isinstance(item["to"], list) else [item["to"]]:
        named = _NAMED.fullmatch(str(value).strip())
        address = named["address"] if named else str(value).strip()
        if not _ADDRESS.fullmatch(address):
            return (
                "Invalid `to` field. The email address needs to follow the "
                f"`email@example.com` or `Name <email@example.com>` format ({value!r})"
            )
    return None


def _error(status: int, name: str, message: str) -> dict[str, Any]:
    return {"statusCode": status, "name": name, "message": message}


_SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)  # Linux; the cmsg type is the same
_KEPT_SECONDS = 3.0
"""Stamps older than this behind the newest are dropped (threads are never that late)."""


def stamp_arrivals(conn: socket.socket) -> None:
    """Have the kernel stamp the data arriving on ``conn``, for :func:`received_at`."""
    conn.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)


def received_at(conn: socket.socket) -> float | None:
    """When the data waiting on ``conn`` reached this machine (``time.monotonic`` scale).

    Waits for data, leaves it in the socket (``MSG_PEEK``) and reads the kernel's receive
    stamp of its first bytes (``SO_TIMESTAMPNS``, set on the socket beforehand).
    ``None`` when the peer closed the connection or the kernel gave no stamp.
    """
    try:
        data, ancillary, _, _ = conn.recvmsg(1, socket.CMSG_SPACE(16), socket.MSG_PEEK)
    except OSError:
        return None
    for level, kind, payload in ancillary:
        if data and level == socket.SOL_SOCKET and kind == _SO_TIMESTAMPNS:
            seconds, nanoseconds = struct.unpack("qq", payload[:16])  # a struct timespec
            age = time.time() - (int(seconds) + int(nanoseconds) / 1e9)
            return time.monotonic() - max(0.0, age)
    return None


class _Handler(BaseHTTPRequestHandler):
    owner: ResendLikeServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    arrived: float | None = None

    def setup(self) -> None:
        super().setup()
        with contextlib.suppress(OSError):
            stamp_arrivals(self.connection)

    def handle_one_request(self) -> None:
        # no client here pipelines (each sends its next request after the answer), so the
        # next request's first bytes are still in the socket, with their receive stamp
        self.arrived = received_at(self.connection)
        super().handle_one_request()

    def parse_request(self) -> bool:
        if self.arrived is None:  # no kernel stamp: the request line is in, so it arrived
            self.arrived = time.monotonic()
        with self.owner.lock:
            self.owner.request_lines += 1
        return super().parse_request()

    def _serve(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length) if length else b""
        headers = {k.lower(): v for k, v in self.headers.items()}
        path = self.path.split("?", 1)[0]
        status, extra, body = self.owner.handle(self.command, path, headers, raw, self.arrived)
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        for name, value in extra.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    do_POST = _serve
    do_GET = _serve
    do_PUT = _serve
    do_PATCH = _serve
    do_DELETE = _serve


@contextmanager
def resend_server(**kwargs: Any) -> Iterator[ResendLikeServer]:
    with ResendLikeServer(**kwargs) as server:
        yield server
