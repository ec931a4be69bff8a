"""A Sentry ingestion endpoint on loopback: collects what a real sentry-sdk sends.

The SDK POSTs envelopes to ``/api/<project>/envelope/``; each envelope is a header line
followed by (item header, item payload) line pairs. Events and Crons check-ins are kept
per receiver, so a test can give two clients two DSNs and see which one sent what.
"""

from __future__ import annotations

import gzip
import json
import threading
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class SentryReceiver:
    """Collects the events and check-ins of Sentry envelopes POSTed to it."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.check_ins: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                encoding = self.headers.get("Content-Encoding", "")
                if encoding == "gzip":
                    body = gzip.decompress(body)
                elif encoding == "deflate":
                    body = zlib.decompress(body)
                elif encoding == "br":
                    import brotli  # type: ignore[import-not-found]

                    body = brotli.decompress(body)
                receiver._collect(body)
                self.send_response(200)
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *args: Any) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def _collect(self, body: bytes) -> None:
        lines = body.split(b"\n")
        with self._lock:
            for header, payload in zip(lines[1::2], lines[2::2], strict=False):
                kind = json.loads(header).get("type")
                if kind == "event":
                    self.events.append(json.loads(payload))
                elif kind == "check_in":
                    self.check_ins.append(json.loads(payload))

    @property
    def dsn(self) -> str:
        return f"http://publickey@127.0.0.1:{self.server.server_address[1]}/1"

    def __enter__(self) -> SentryReceiver:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
