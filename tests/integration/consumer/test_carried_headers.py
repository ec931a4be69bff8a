"""The trace context and custom headers a job was delivered with are on the message the
platform builds for it next: the retry, the throttle's reschedule (both in the delay
store) and the dead letter (for its replay). Through Celery's own ``apply`` with the
message headers a publish gives, against the real Redis and PostgreSQL."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import redis

from platform_tasks import PlatformTask
from platform_tasks.errors import Throttled
from platform_tasks.keys import delay_keys
from platform_tasks.observability.trace_context import (
    CARRIED_HEADER,
    PUBLISH_TIME_HEADER,
    outgoing_headers,
)
from tests.integration.consumer.conftest import MAX_ATTEMPTS, QUEUE, Harness
from tests.integration.consumer.test_idempotency import envelope

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
SENT = {
    "traceparent": TRACEPARENT,
    "tracestate": "vendor=1",
    "sentry-trace": "abc-def-1",
    "baggage": "sentry-trace_id=abc",
    "x-order-source": "web",
}
PUBLISHED = 1_700_000_000.25
"""The publish time the message carries: a retry or throttle keeps it (same publish)."""


def _apply(task: Any, payload: dict[str, Any], attempt: int) -> Any:
    headers = outgoing_headers(
        SENT, published_at=datetime.now(UTC).timestamp(), publish_time=PUBLISHED
    )
    return task.apply(
        args=(payload,), routing_key=QUEUE, headers={**headers, "platform_attempt": attempt}
    )


def _stored_headers(redis_client: redis.Redis) -> dict[str, Any]:
    (entry,) = redis_client.hvals(delay_keys("test").entries)
    headers: dict[str, Any] = json.loads(json.loads(entry)["m"])["headers"]
    return headers


def _assert_carried(headers: dict[str, Any]) -> None:
    for name, value in SENT.items():
        assert headers[name] == value, name
    assert headers[CARRIED_HEADER] == ["x-order-source"]
    assert headers[PUBLISH_TIME_HEADER] == PUBLISHED


def test_a_retry_carries_trace_and_custom_headers(
    harness: Harness, redis_client: redis.Redis
) -> None:
    result = _apply(harness.task, envelope("retry-me", fail=True), attempt=1)
    assert result.state == "RETRY"
    stored = _stored_headers(redis_client)
    _assert_carried(stored)
    assert stored["platform_attempt"] == 2
    # the retry is ready when it is due, not when it was stored
    due_ms = redis_client.zrange(delay_keys("test").schedule, 0, 0, withscores=True)[0][1]
    assert abs(stored["platform_published_at"] * 1000 - due_ms) < 5


def test_a_throttle_carries_trace_and_custom_headers(
    harness: Harness, redis_client: redis.Redis
) -> None:
    @harness.app.task(name="tests.it.throttled", base=PlatformTask, shared=False)
    def throttled(envelope: Any, tx: Any) -> None:
        raise Throttled(datetime.now(UTC) + timedelta(minutes=1), "provider_rate_limit")

    payload = {**envelope("slow"), "kind": "tests.it.throttled"}
    result = _apply(throttled, payload, attempt=2)
    assert result.state == "RETRY"
    stored = _stored_headers(redis_client)
    _assert_carried(stored)
    assert stored["platform_attempt"] == 2  # no attempt spent


def test_a_dead_letter_keeps_trace_and_custom_headers(harness: Harness) -> None:
    payload = envelope("tired", fail=True)
    result = _apply(harness.task, payload, attempt=MAX_ATTEMPTS)
    assert result.state == "FAILURE"
    ((headers,),) = harness.rows(
        "SELECT headers FROM core.dead_letters WHERE job_id = %s", payload["job_id"]
    )
    assert headers.pop(PUBLISH_TIME_HEADER) == PUBLISHED  # dropped by a replay
    assert headers == SENT
