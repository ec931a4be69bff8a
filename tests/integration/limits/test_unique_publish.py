"""Unique publish through the queue port on a real Redis broker (no worker needed)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
import redis

from platform_tasks import QueuePort, create_app
from platform_tasks.errors import ConfigurationError
from platform_tasks.keys import delay_keys
from platform_tasks.settings import PlatformSettings


@pytest.fixture
def port(settings: PlatformSettings) -> Iterator[QueuePort]:
    app = create_app("limits_unique", settings=settings)
    qp = QueuePort(app)
    yield qp
    qp.close()
    app.close()


def payload(n: int) -> dict[str, object]:
    return {"tenant_id": "t", "kind": "tests.unique", "data": {"n": n}}


def test_a_scheduled_unique_job_is_stored_once(port: QueuePort, redis_client: redis.Redis) -> None:
    run_at = datetime.now(UTC) + timedelta(minutes=10)
    first = port.schedule("q", payload(1), run_at, unique_key="k", unique_for=timedelta(hours=1))
    second = port.schedule("q", payload(2), run_at, unique_key="k", unique_for=timedelta(hours=1))
    assert second == first
    assert redis_client.zcard(delay_keys("test").schedule) == 1
    other = port.schedule("q", payload(3), run_at, unique_key="k2", unique_for=timedelta(hours=1))
    assert other != first and redis_client.zcard(delay_keys("test").schedule) == 2


def test_the_message_carries_the_key_for_the_consumer(
    port: QueuePort, redis_client: redis.Redis
) -> None:
    port.publish("q", payload(1), unique_key="carried", unique_for=timedelta(minutes=1))
    (raw,) = redis_client.lrange("q", 0, -1)
    assert b'"platform_unique": "carried"' in raw


def test_bad_unique_arguments_are_refused_before_anything_is_sent(
    port: QueuePort, redis_client: redis.Redis
) -> None:
    with pytest.raises(ValueError, match="unique_for must be a positive timedelta"):
        port.publish("q", payload(1), unique_key="k")
    assert redis_client.llen("q") == 0


def test_rabbitmq_native_delays_refuse_a_unique_publish(settings: PlatformSettings) -> None:
    amqp = settings.model_copy(update={"broker_url": "amqp://guest:guest@127.0.0.1:1//"})
    app = create_app("limits_unique_amqp", settings=amqp)
    qp = QueuePort(app)
    try:
        with pytest.raises(ConfigurationError, match="PLATFORM_RABBITMQ_DELAYS=delay_store"):
            qp.publish("q", payload(1), unique_key="k", unique_for=timedelta(minutes=1))
    finally:
        qp.close()
        app.close()
