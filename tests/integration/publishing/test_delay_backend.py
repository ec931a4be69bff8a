"""The delay back end is chosen once from the settings; the port only calls it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
import redis

from platform_tasks import QueuePort, create_app
from platform_tasks.errors import ConfigurationError
from platform_tasks.keys import rabbitmq_delay_keys
from platform_tasks.publishing.amqp_wire import AmqpMessage
from platform_tasks.publishing.delay_backend import (
    NativeRabbitMQDelays,
    RabbitMQStoreDelays,
    RedisStoreDelays,
)
from platform_tasks.publishing.delay_store import DelayStore
from platform_tasks.settings import PlatformSettings

AMQP = "amqp://platform:s3cret@127.0.0.1:1/%2F"  # port 1: nothing may connect

PAYLOAD = {"tenant_id": "t-1", "kind": "billing.charge", "data": {}}


def test_each_broker_gets_its_own_back_end(redis_url: str) -> None:
    cases = [
        (PlatformSettings.build(redis_url=redis_url), RedisStoreDelays),
        (
            PlatformSettings.build(
                redis_url=redis_url, broker_url=AMQP, rabbitmq_delays="delay_store"
            ),
            RabbitMQStoreDelays,
        ),
        (PlatformSettings.build(redis_url=redis_url, broker_url=AMQP), NativeRabbitMQDelays),
    ]
    for settings, expected in cases:
        port = QueuePort(create_app("backend_choice", settings=settings))
        try:
            assert type(port.delays) is expected
        finally:
            port.close()


def test_a_rabbitmq_delay_store_holds_the_amqp_message_due_at_its_millisecond(
    redis_url: str, redis_client: redis.Redis
) -> None:
    settings = PlatformSettings.build(
        redis_url=redis_url, broker_url=AMQP, rabbitmq_delays="delay_store", profile="backend_mq"
    )
    keys = rabbitmq_delay_keys(settings.profile)
    redis_client.delete(keys.schedule, keys.entries)
    port = QueuePort(create_app("backend_mq", settings=settings))
    run_at = datetime.now(UTC).replace(microsecond=250_000) + timedelta(hours=1)
    try:
        job_id = port.schedule("billing", PAYLOAD, run_at)
        [(entry_id, due)] = redis_client.zrange(keys.schedule, 0, -1, withscores=True)
        assert int(due) == int(run_at.timestamp()) * 1000 + 250
        raw = redis_client.hget(keys.entries, entry_id)
        message = AmqpMessage.decode(raw)
        assert message.queue == "billing"
        assert message.properties["application_headers"]["id"] == str(job_id)
        assert DelayStore(redis_client, keys).pending() == 1
    finally:
        port.close()
        redis_client.delete(keys.schedule, keys.entries)


def test_a_broker_that_holds_no_delays_refuses_to_schedule(redis_url: str) -> None:
    settings = PlatformSettings.build(redis_url=redis_url, broker_url="memory://")
    port = QueuePort(create_app("backend_none", settings=settings))
    later = datetime.now(UTC) + timedelta(minutes=5)
    try:
        with pytest.raises(ConfigurationError, match=r"PLATFORM_BROKER_URL.*got memory"):
            port.schedule("billing", PAYLOAD, later)
        with pytest.raises(ConfigurationError, match="PLATFORM_RABBITMQ_DELAYS=delay_store"):
            port.schedule("billing", PAYLOAD, later, unique_key="k", unique_for=timedelta(1))
    finally:
        port.close()
