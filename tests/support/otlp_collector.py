"""A small OTLP/HTTP trace collector on loopback: what a worker's OTLP exporter talks to.

It is a real HTTP server that accepts ``POST /v1/traces`` with a protobuf
``ExportTraceServiceRequest`` (gzip or not), decodes it with ``opentelemetry-proto`` and
keeps every span, so a test can read the spans a worker process exported exactly as an
OpenTelemetry Collector would have received them.
"""

from __future__ import annotations

import gzip
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)


@dataclass(frozen=True)
class ReceivedSpan:
    """One span as received: ids in hex, attributes as plain values, status code (0/1/2)."""

    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    attributes: dict[str, Any]
    status_code: int
    service_name: str | None
    events: tuple[str, ...] = field(default=())


def _value(any_value: Any) -> Any:
    kind = any_value.WhichOneof("value")
    return getattr(any_value, kind) if kind else None


def decode(body: bytes) -> list[ReceivedSpan]:
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    spans = []
    for resource_spans in request.resource_spans:
        resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                spans.append(
                    ReceivedSpan(
                        name=span.name,
                        trace_id=span.trace_id.hex(),
                        span_id=span.span_id.hex(),
                        parent_span_id=span.parent_span_id.hex(),
                        attributes={a.key: _value(a.value) for a in span.attributes},
                        status_code=int(span.status.code),
                        service_name=resource.get("service.name"),
                        events=tuple(event.name for event in span.events),
                    )
                )
    return spans


class OtlpCollector:
    """Spans received so far, and the endpoint to give ``OTEL_EXPORTER_OTLP_ENDPOINT``."""

    def __init__(self, server: ThreadingHTTPServer) -> None:
        self._server = server
        self._lock = threading.Lock()
        self._spans: list[ReceivedSpan] = []
        self.requests = 0

    @property
    def endpoint(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def add(self, spans: list[ReceivedSpan]) -> None:
        with self._lock:
            self._spans.extend(spans)
            self.requests += 1

    def spans(self) -> list[ReceivedSpan]:
        with self._lock:
            return list(self._spans)


@contextmanager
def otlp_collector() -> Iterator[OtlpCollector]:
    """Serve on 127.0.0.1 (a free port) until the block ends."""
    holder: list[OtlpCollector] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length)
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            if self.path != "/v1/traces":
                self.send_error(404)
                return
            holder[0].add(decode(body))
            reply = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, format: str, *args: Any) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    holder.append(OtlpCollector(server))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield holder[0]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
