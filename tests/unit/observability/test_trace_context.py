"""Which headers a new message starts with and which a delivery carries on, read from a
real Celery request context (where a message's headers are attributes)."""

from __future__ import annotations

from celery.app.task import Context
from opentelemetry.sdk.trace import TracerProvider

from platform_tasks.brokers.queue_latency import message_ready_at
from platform_tasks.observability.trace_context import (
    CARRIED_HEADER,
    PUBLISH_TIME_HEADER,
    PUBLISHED_AT_HEADER,
    carried_headers,
    outgoing_headers,
    running_with,
)

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_custom_and_trace_headers_survive_a_round_trip() -> None:
    sent = outgoing_headers(
        {"x-source": "web", "traceparent": TRACEPARENT, "baggage": "k=v"},
        published_at=12.5,
        publish_time=10.0,
    )
    assert sent[CARRIED_HEADER] == ["x-source"]
    assert sent[PUBLISHED_AT_HEADER] == 12.5
    # what the worker sees: the headers merged with Celery's own protocol fields
    request = Context({**sent, "task": "a.b", "id": "1", "retries": 0, "lang": "py"})
    assert carried_headers(request) == {
        "x-source": "web",
        "traceparent": TRACEPARENT,
        "baggage": "k=v",
        PUBLISH_TIME_HEADER: 10.0,  # a retry is the same publish: it keeps its time
    }


def test_celery_protocol_fields_are_not_carried() -> None:
    request = Context({"task": "a.b", "id": "1", "eta": None, "origin": "gen1@host"})
    assert carried_headers(request) == {}


def test_a_carried_name_celery_or_the_platform_uses_is_not_carried() -> None:
    """A message published before such names were refused (or by another publisher) may
    list one among its custom headers: on the worker the name reads Celery's own value
    (the request attribute), and carried onto a retry it would replace Celery's header."""
    sent = {CARRIED_HEADER: ["id", "retries", "hostname", "platform_attempt", "x-source"]}
    request = Context(
        {**sent, "x-source": "web", "id": "1", "retries": 2, "platform_attempt": 3},
        hostname="w1@host",
    )
    assert carried_headers(request) == {"x-source": "web"}


def test_the_running_jobs_trace_is_the_ambient_one_without_a_span() -> None:
    with running_with({"traceparent": TRACEPARENT, "x-source": "web"}):
        sent = outgoing_headers({}, published_at=1.0)
    assert sent["traceparent"] == TRACEPARENT
    assert "x-source" not in sent  # only trace context is inherited, not custom headers
    assert "traceparent" not in outgoing_headers({}, published_at=1.0)


def test_the_current_span_wins_over_the_running_job() -> None:
    tracer = TracerProvider().get_tracer("test")
    with running_with({"traceparent": TRACEPARENT}), tracer.start_as_current_span("req") as span:
        sent = outgoing_headers({}, published_at=1.0)
    assert sent["traceparent"].split("-")[1] == f"{span.get_span_context().trace_id:032x}"


def test_given_trace_headers_are_kept() -> None:
    tracer = TracerProvider().get_tracer("test")
    with tracer.start_as_current_span("req"):
        sent = outgoing_headers({"traceparent": TRACEPARENT}, published_at=1.0)
    assert sent["traceparent"] == TRACEPARENT


def test_ready_time_is_read_from_a_wire_message() -> None:
    assert message_ready_at(b'{"headers": {"platform_published_at": 99.5}}') == 99.5
    assert message_ready_at(b'{"headers": {}}') is None
    assert message_ready_at(b"not json") is None
    assert message_ready_at(None) is None


def test_sentry_headers_are_also_where_sentrys_worker_side_reads_them() -> None:
    sent = outgoing_headers(
        {"sentry-trace": "abc-def-1", "baggage": "sentry-x=1"}, published_at=1.0
    )
    assert sent["headers"] == {"sentry-trace": "abc-def-1", "baggage": "sentry-x=1"}
    assert CARRIED_HEADER not in sent
    # a delivery whose Sentry headers are only in the nested mapping carries them on
    request = Context({"task": "a.b", "headers": {"sentry-trace": "abc-def-1"}})
    assert carried_headers(request) == {"sentry-trace": "abc-def-1"}
