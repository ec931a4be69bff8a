"""The names of the message headers the platform reads and writes: one list for all stages.

A message crosses publishing, the broker transport, limits, the consumer, dead letters and
replay; each of them reads or sets some of these headers. Their names live here so that a
stage reading a message imports this module, not the stages that happen to write them.
What a custom header may not be called (these names and Celery's own) is decided in
:mod:`platform_tasks.observability.reserved_headers`.

Two headers carry a time and are easy to confuse; both are kept because they answer
different questions:

- ``platform_published_at`` (:data:`PUBLISHED_AT_HEADER`) is when the job became *ready to
  run*: its publish, or for a scheduled job or a retry the time it became due. It is set
  again at each of those moments, and the age of a queue's oldest job (queue latency) is
  read from it.
- ``platform_publish_time`` (:data:`PUBLISH_TIME_HEADER`) is when a publisher *handed the
  job to the platform*. It is carried unchanged through the delay store, retries and
  throttles (a replay sets a new one), and cancel rules judge "published before the
  cancel" by it.
"""

from __future__ import annotations

__all__ = [
    "ATTEMPT_HEADER",
    "BATCH_HEADER",
    "CARRIED_HEADER",
    "DELAY_REASON_HEADER",
    "LEASE_HEADER",
    "NESTED_HEADER",
    "PLATFORM_HEADERS",
    "PUBLISHED_AT_HEADER",
    "PUBLISH_TIME_HEADER",
    "SENTRY_HEADERS",
    "TENANT_HEADER",
    "TRACE_HEADERS",
    "UNIQUE_HEADER",
    "UNREADABLE_HEADER",
    "UNROUTABLE_HEADER",
]

# -- set on every message the platform builds ---------------------------------------------

ATTEMPT_HEADER = "platform_attempt"
"""The attempt this message is (1 for a first publish), set by the platform."""

TENANT_HEADER = "platform_tenant"
"""The envelope's ``tenant_id`` (set by ``publish`` and ``schedule``): the fair transport
sorts a queue's messages into lanes by it."""

CARRIED_HEADER = "platform_headers"
"""Names the publisher's custom headers, so a retry or replay carries them on."""

PUBLISHED_AT_HEADER = "platform_published_at"
"""Unix seconds at which the job became ready to run: its publish, or for a scheduled
job or a retry the time it is due. The age of a queue's oldest job is read from it."""

PLATFORM_HEADERS = frozenset({ATTEMPT_HEADER, CARRIED_HEADER, PUBLISHED_AT_HEADER, TENANT_HEADER})
"""Headers the platform sets on every message it builds."""

# -- set on some messages -----------------------------------------------------------------

PUBLISH_TIME_HEADER = "platform_publish_time"
"""Unix seconds at which a publisher handed the job to the platform: ``publish``,
``schedule``, a fan-out's child, a dead letter's replay. Unlike
:data:`PUBLISHED_AT_HEADER` it is carried unchanged through the delay store, retries and
throttles, and a replay sets a new one. A cancel rule judges "published before the
cancel" by it (job ids carry no reliable time: blast chunk ids are hashes, fan-out
children's carry the point's time)."""

BATCH_HEADER = "platform_batch_id"
"""The batch a job belongs to (the batch id as text), set on a batch's children. It is
carried through delays, retries, dead letters and replay like the other platform headers,
so every ending of the job is counted against its batch. A job without it costs nothing."""

UNIQUE_HEADER = "platform_unique"
"""The unique key of a unique publish, so the consumer releases it when the job starts."""

DELAY_REASON_HEADER = "platform_delay_reason"
"""On a job a consumer put back to wait (a retry, a throttle, a concurrency cap): why,
as ``{"why": "retry"|"throttle"|"concurrency_cap", "detail": …, "max": attempts}``, so
``jobs show`` can say why a delayed job waits. Set afresh each time, never carried."""

LEASE_HEADER = "platform_lease"
"""The lease of an admitted beat point (a JSON object)."""

UNREADABLE_HEADER = "platform_unreadable"
"""On a message the fetch script wrapped around an unreadable item: why it was."""

UNROUTABLE_HEADER = "platform_unroutable"
"""On an unacked message the sweep could not route back to any queue: the exchange and
routing key it had. The sweep hands it to one of its own queues to be dead-lettered
instead of leaving it unacked for ever."""

# -- trace context, carried on whenever a message has it ----------------------------------

TRACE_HEADERS = ("traceparent", "tracestate", "sentry-trace", "baggage")
"""W3C trace context and Sentry's trace headers."""

SENTRY_HEADERS = ("sentry-trace", "baggage")
"""The part of :data:`TRACE_HEADERS` Sentry's Celery integration writes."""

NESTED_HEADER = "headers"
"""Where Sentry's Celery integration reads its trace on the worker: a ``headers`` mapping
inside the message headers (it writes both places, working around celery#4875)."""
