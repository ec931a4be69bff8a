"""Trace context that travels with a job through every hop it makes.

A job leaves the request that published it, may wait in the delay store, fail and come
back through a retry, be throttled, fan out into children, become a dead letter and be
replayed from a shell. Tracing tools (OpenTelemetry's ``traceparent``/``tracestate``,
Sentry's ``sentry-trace``/``baggage``) follow it only if each of those hops hands the
same headers on; Celery keeps them on the message it was given, but the platform builds
new messages for retries, throttles and replays. This module says which headers a
message carries on (:func:`carried_headers`) and which a new message starts with
(:func:`outgoing_headers`).

The custom ``headers`` of ``publish(..., {"headers": {...}})`` are carried too: their
names travel in the :data:`CARRIED_HEADER` header, because Celery merges a message's
headers with its own protocol fields on the worker, and only the names the publisher
gave say which are the application's. Names Celery or the platform use are refused at
publish (:mod:`platform_tasks.observability.reserved_headers`) and never carried.

OpenTelemetry is optional (the ``otel`` extra): without it, the headers still travel and
nothing else happens.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from platform_tasks.headers import (
    BATCH_HEADER,
    CARRIED_HEADER,
    DELAY_REASON_HEADER,
    NESTED_HEADER,
    PUBLISH_TIME_HEADER,
    PUBLISHED_AT_HEADER,
    SENTRY_HEADERS,
    TRACE_HEADERS,
)
from platform_tasks.observability.reserved_headers import reserved_header

__all__ = [
    "CARRIED_HEADER",
    "PUBLISHED_AT_HEADER",
    "PUBLISH_TIME_HEADER",
    "TRACE_HEADERS",
    "ambient_trace_headers",
    "carried_headers",
    "current_trace_headers",
    "outgoing_headers",
    "publish_time_of",
    "running_with",
    "trace_of",
    "without_publish_time",
]


_RESERVED = frozenset(
    {
        BATCH_HEADER,
        CARRIED_HEADER,
        DELAY_REASON_HEADER,
        PUBLISHED_AT_HEADER,
        PUBLISH_TIME_HEADER,
        NESTED_HEADER,
        *TRACE_HEADERS,
    }
)

current_trace_headers: ContextVar[Mapping[str, str] | None] = ContextVar(
    "platform_current_trace_headers", default=None
)
"""The trace headers of the job running in this context: a job published from inside it
(a fan-out child, a follow-up job) continues its trace when no tracer says otherwise."""

_otel: Any = None
"""``(trace, propagate)`` of opentelemetry once imported, ``False`` when not installed."""


def _opentelemetry() -> Any:
    global _otel
    if _otel is None:
        try:
            from opentelemetry import propagate, trace
        except ImportError:
            _otel = False
        else:
            try:
                from opentelemetry.instrumentation.celery import CeleryInstrumentor
            except ImportError:
                instrumentor = None
            else:
                # a singleton: the instance instrument() was called on, wherever
                instrumentor = CeleryInstrumentor()  # type: ignore[no-untyped-call]
            _otel = (trace, propagate, instrumentor)
    return _otel


def _celery_instrumented(instrumentor: Any) -> bool:
    """Whether ``opentelemetry-instrumentation-celery`` injects the context at publish."""
    return bool(
        instrumentor is not None
        and getattr(instrumentor, "_is_instrumented_by_opentelemetry", False)
    )


def ambient_trace_headers() -> dict[str, str]:
    """The trace headers a message published here and now should carry.

    The current OpenTelemetry span when there is a valid one (the publishing request's),
    unless ``opentelemetry-instrumentation-celery`` is instrumenting this process: it
    injects a publish span of the same trace itself, so injecting here too would only
    cost time. Else the headers of the job running in this context, else none.
    """
    otel = _opentelemetry()
    if otel and not _celery_instrumented(otel[2]):  # else it injects its own, a child
        trace, propagate, _ = otel
        if trace.get_current_span().get_span_context().is_valid:
            carrier: dict[str, str] = {}
            propagate.inject(carrier)
            if carrier:
                return carrier
    running = current_trace_headers.get()
    return dict(running) if running else {}


def outgoing_headers(
    custom: Mapping[str, Any], *, published_at: float, publish_time: float | None = None
) -> dict[str, Any]:
    """The headers of a new message: ``custom``, their names, trace context, ready time,
    publish time.

    Trace headers given in ``custom`` win (a retry, a replay carrying its original
    trace); otherwise the ambient context's are added. An instrumentation that injects
    its own at publish (``opentelemetry-instrumentation-celery``) replaces them with a
    child of the same trace. A :data:`PUBLISH_TIME_HEADER` in ``custom`` (a retry's)
    is kept; otherwise ``publish_time`` (default: now) is the job's publish time.
    """
    headers = dict(custom)
    names = sorted(name for name in custom if name not in _RESERVED)
    if names:
        headers[CARRIED_HEADER] = names
    if "traceparent" not in headers and "sentry-trace" not in headers:
        for name, value in ambient_trace_headers().items():
            headers.setdefault(name, value)
    sentry = {name: headers[name] for name in SENTRY_HEADERS if name in headers}
    if sentry:  # also where Sentry's worker side reads them
        nested = headers.get(NESTED_HEADER)
        headers[NESTED_HEADER] = {**(nested if isinstance(nested, Mapping) else {}), **sentry}
    headers[PUBLISHED_AT_HEADER] = published_at
    if publish_time_of(headers) is None:
        headers[PUBLISH_TIME_HEADER] = time.time() if publish_time is None else publish_time
    return headers


def publish_time_of(headers: Mapping[str, Any] | None) -> float | None:
    """The publish time a message's headers carry, or ``None`` when absent or unreadable
    (a message from before the header existed, or one a foreign publisher made)."""
    if not headers:
        return None
    value = headers.get(PUBLISH_TIME_HEADER)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    seconds = float(value)
    return seconds if math.isfinite(seconds) and 0 < seconds < MAX_PUBLISH_TIME else None


MAX_PUBLISH_TIME = 253402300799.0
"""The last second of the year 9999: a larger value is no time (datetime cannot hold it)."""


def without_publish_time(headers: Mapping[str, Any]) -> dict[str, Any]:
    """``headers`` for a new publish of the same job (a replay): it gets its own time."""
    return {name: value for name, value in headers.items() if name != PUBLISH_TIME_HEADER}


def carried_headers(request: Any) -> dict[str, Any]:
    """What a message built for this delivery (retry, throttle, dead letter) carries on.

    ``request`` is Celery's task request, on which a message's headers are attributes.
    """
    carried: dict[str, Any] = {}
    for name in TRACE_HEADERS:
        value = _header(request, name)
        if isinstance(value, str) and value:
            carried[name] = value
    publish_time = publish_time_of({PUBLISH_TIME_HEADER: _header(request, PUBLISH_TIME_HEADER)})
    if publish_time is not None:  # a retry or throttle is the same publish, not a new one
        carried[PUBLISH_TIME_HEADER] = publish_time
    batch = _header(request, BATCH_HEADER)
    if isinstance(batch, str) and batch:  # the job stays its batch's child
        carried[BATCH_HEADER] = batch
    names = _header(request, CARRIED_HEADER)
    if isinstance(names, list | tuple):
        for name in names:
            # a name Celery or the platform uses reads back their value, not the
            # publisher's, and would replace theirs on the new message: never carried
            if isinstance(name, str) and name not in _RESERVED and reserved_header(name) is None:
                value = _header(request, name)
                if value is not None:
                    carried[name] = value
    return carried


def _header(request: Any, name: str) -> Any:
    value = getattr(request, name, None)
    if value is None:
        headers = getattr(request, "headers", None)
        if isinstance(headers, Mapping):
            value = headers.get(name)
    return value


def trace_of(headers: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The trace headers among ``headers`` (what :data:`current_trace_headers` holds)."""
    if not headers:
        return None
    trace = {name: headers[name] for name in TRACE_HEADERS if name in headers}
    return trace or None


@contextmanager
def running_with(headers: Mapping[str, Any] | None) -> Iterator[None]:
    """Make ``headers``' trace context the ambient one while a job runs."""
    token = current_trace_headers.set(trace_of(headers))
    try:
        yield
    finally:
        current_trace_headers.reset(token)
