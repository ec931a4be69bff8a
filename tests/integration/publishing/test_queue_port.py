"""QueuePort against the real broker: what lands on the queue list, and what never does."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta

import pytest
import redis

from platform_tasks import QueuePort, create_app
from platform_tasks.errors import EnvelopeError, NaiveDatetimeError
from platform_tasks.keys import delay_keys
from platform_tasks.observability.context import current_correlation_id
from platform_tasks.observability.trace_context import CARRIED_HEADER
from platform_tasks.publishing.delay_store import DelayStore
from platform_tasks.settings import PlatformSettings


def _messages(client: redis.Redis, queue: str) -> list[dict]:
    return [json.loads(raw) for raw in client.lrange(queue, 0, -1)]


@pytest.fixture
def port(settings: PlatformSettings):  # type: ignore[no-untyped-def]
    app = create_app("port_test", settings=settings)
    queue_port = QueuePort(app)
    yield queue_port
    queue_port.close()


def payload(**extra: object) -> dict[str, object]:
    body: dict[str, object] = {
        "tenant_id": "t-1",
        "kind": "billing.charge",
        "data": {"card": "s3cr3t-card-number"},
    }
    body.update(extra)
    return body


def test_publish_sets_task_id_to_job_id_and_hides_data(port: QueuePort, redis_client) -> None:  # type: ignore[no-untyped-def]
    job_id = port.publish("billing", payload())
    assert job_id.version == 7
    [message] = _messages(redis_client, "billing")
    headers = message["headers"]
    assert headers["id"] == str(job_id)
    assert headers["task"] == "billing.charge"
    assert str(job_id) in headers["argsrepr"] and "t-1" in headers["argsrepr"]
    assert "s3cr3t" not in headers["argsrepr"] and "card" not in headers["argsrepr"]
    assert headers["platform_attempt"] == 1
    assert message["content-type"] == "application/json"


def test_correlation_id_is_inherited_inside_a_job(port: QueuePort, redis_client) -> None:  # type: ignore[no-untyped-def]
    token = current_correlation_id.set("parent-corr")
    try:
        port.publish("q", payload())
    finally:
        current_correlation_id.reset(token)
    port.publish("q", payload())
    bodies = [
        json.loads(__import__("base64").b64decode(m["body"]))[0][0]
        for m in reversed(_messages(redis_client, "q"))
    ]
    assert bodies[0]["correlation_id"] == "parent-corr"
    assert bodies[1]["correlation_id"] not in ("parent-corr", "")


def test_given_ids_are_kept(port: QueuePort) -> None:
    from platform_tasks.envelope import uuid7

    job_id = uuid7()
    assert port.publish("q", payload(job_id=str(job_id), correlation_id="c1")) == job_id


@pytest.mark.parametrize(
    "bad",
    [
        payload(tenant_id=""),
        payload(kind="nodots"),
        payload(job_id=str(uuid.uuid4())),
        payload(unexpected=True),
        payload(data={"x": "y" * 300_000}),
    ],
)
def test_invalid_envelope_raises_before_the_broker(port: QueuePort, redis_client, bad) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(EnvelopeError):
        port.publish("billing", bad)
    with pytest.raises(EnvelopeError):
        port.schedule("billing", bad, datetime.now(UTC) + timedelta(minutes=5))
    assert redis_client.llen("billing") == 0
    assert DelayStore(redis_client, delay_keys("test")).pending() == 0


def test_unknown_option_is_refused(port: QueuePort) -> None:
    with pytest.raises(ValueError, match=r"opts\.colour"):
        port.publish("q", payload(), {"colour": "blue"})


def test_schedule_refuses_naive_datetime(port: QueuePort) -> None:
    with pytest.raises(NaiveDatetimeError):
        port.schedule("q", payload(), datetime.now() + timedelta(minutes=1))
    assert issubclass(NaiveDatetimeError, ValueError)


def test_schedule_in_future_waits_in_store_then_promotes_identically(
    port: QueuePort, redis_client
) -> None:  # type: ignore[no-untyped-def]
    job_id = port.schedule("later", payload(), datetime.now(UTC) + timedelta(hours=1))
    store = DelayStore(redis_client, delay_keys("test"))
    assert redis_client.llen("later") == 0
    assert store.pending() == 1
    assert store.promote_due().moved == 0, "not due yet, judged by Redis time"
    # Make it due by rewriting its score, the way time passing would.
    (entry_id,) = redis_client.zrange(delay_keys("test").schedule, 0, -1)
    redis_client.zadd(delay_keys("test").schedule, {entry_id: 0})
    assert store.promote_due().moved == 1
    [message] = _messages(redis_client, "later")
    assert message["headers"]["id"] == str(job_id)
    assert message["properties"]["delivery_info"]["routing_key"] == "later"
    assert store.pending() == 0


def test_schedule_keeps_trace_and_custom_headers_through_the_delay_store(
    port: QueuePort, redis_client
) -> None:  # type: ignore[no-untyped-def]
    given = {
        "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "tracestate": "vendor=1",
        "sentry-trace": "abc-def-1",
        "baggage": "sentry-trace_id=abc",
        "x-order-source": "web",
    }
    run_at = datetime.now(UTC) + timedelta(hours=1)
    port.schedule("later", payload(), run_at, {"headers": given})
    store = DelayStore(redis_client, delay_keys("test"))
    (entry_id,) = redis_client.zrange(delay_keys("test").schedule, 0, -1)
    redis_client.zadd(delay_keys("test").schedule, {entry_id: 0})
    assert store.promote_due().moved == 1
    [message] = _messages(redis_client, "later")
    headers = message["headers"]
    for name, value in given.items():
        assert headers[name] == value, name
    assert headers[CARRIED_HEADER] == ["x-order-source"]
    # ready when due, not when stored: what queue latency and the run span measure from
    assert abs(headers["platform_published_at"] - run_at.timestamp()) < 0.001


def test_schedule_in_the_past_publishes_at_once(port: QueuePort, redis_client) -> None:  # type: ignore[no-untyped-def]
    job_id = port.schedule("now", payload(), datetime.now(UTC) - timedelta(days=2))
    [message] = _messages(redis_client, "now")
    assert message["headers"]["id"] == str(job_id)


def test_priority_lands_on_the_priority_list(settings: PlatformSettings, redis_client) -> None:  # type: ignore[no-untyped-def]
    app = create_app(
        "prio", settings=settings, broker_transport_options={"priority_steps": [0, 3, 6, 9]}
    )
    queue_port = QueuePort(app)
    try:
        queue_port.schedule("p", payload(), datetime.now(UTC) + timedelta(hours=1), {"priority": 6})
    finally:
        queue_port.close()
    store = DelayStore(redis_client, delay_keys("test"))
    (entry_id,) = redis_client.zrange(delay_keys("test").schedule, 0, -1)
    redis_client.zadd(delay_keys("test").schedule, {entry_id: 0})
    assert store.promote_due().moved == 1
    keys = {key.decode() for key in redis_client.keys("p*")}
    assert keys == {"p\x06\x166"}


@pytest.mark.parametrize(
    ("bad", "field"),
    [
        (payload(correlation_id="req\x00"), "correlation_id"),
        (payload(data={"lines": [{"text": "a\x00b"}]}), "data.lines.0.text"),
        (payload(data={"na\x00me": "x"}), "data.na\\u0000me (key)"),
        (payload(tenant_id="t\x00"), "tenant_id"),
    ],
)
def test_nul_is_refused_at_publish_naming_the_field(  # type: ignore[no-untyped-def]
    port: QueuePort, redis_client, bad, field
) -> None:
    """PostgreSQL stores NUL in neither text nor jsonb: such a job could not be recorded."""
    with pytest.raises(EnvelopeError) as info:
        port.publish("billing", bad)
    assert field in dict(info.value.errors), info.value.errors
    with pytest.raises(EnvelopeError):
        port.schedule("billing", bad, datetime.now(UTC) + timedelta(minutes=5))
    assert redis_client.llen("billing") == 0
    assert DelayStore(redis_client, delay_keys("test")).pending() == 0


def test_publish_holds_envelopes_to_the_app_setting(
    settings: PlatformSettings, redis_client: redis.Redis
) -> None:
    app = create_app("small", settings=settings.model_copy(update={"max_payload_bytes": 2048}))
    queue_port = QueuePort(app)
    try:
        with pytest.raises(EnvelopeError, match="exceeds 2048"):
            queue_port.publish("q", payload(data={"x": "y" * 3000}))
        queue_port.publish("q", payload(data={"x": "y" * 1000}))
    finally:
        queue_port.close()
    assert redis_client.llen("q") == 1


@pytest.mark.parametrize(
    "name",
    ["id", "task", "eta", "expires", "retries", "timelimit", "hostname", "platform_attempt"],
)
def test_a_custom_header_may_not_take_a_name_celery_or_the_platform_uses(
    port: QueuePort, redis_client: redis.Redis, name: str
) -> None:
    """Celery merges custom headers over its own protocol headers and makes every header an
    attribute of the worker's request: ``{"id": ...}`` would replace the job's id."""
    opts = {"headers": {"x-order-source": "web", name: "mine"}}
    with pytest.raises(ValueError, match=rf"opts\.headers: header {name!r} is reserved"):
        port.publish("billing", payload(), opts)
    with pytest.raises(ValueError, match=rf"opts\.headers: header {name!r} is reserved"):
        port.schedule("billing", payload(), datetime.now(UTC) + timedelta(hours=1), opts)
    assert redis_client.llen("billing") == 0
    assert redis_client.zcard(delay_keys("test").schedule) == 0
