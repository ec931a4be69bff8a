"""``platform_db`` empties the delay store before each test, wherever the deployment keeps
it: the broker's Redis on a Redis broker, the platform's Redis with RabbitMQ and
``PLATFORM_RABBITMQ_DELAYS=delay_store``, nowhere with RabbitMQ's native delayed delivery
(which must not make the kit open a Redis client on an ``amqp://`` URL)."""

from __future__ import annotations

import redis

from platform_tasks.keys import delay_keys, rabbitmq_delay_keys
from platform_tasks.settings import PlatformSettings
from platform_tasks.testing.consumer import empty_delay_store

AMQP = "amqp://platform:s3cret@127.0.0.1:1/%2F"  # port 1: nothing may connect


def _store_one(client: redis.Redis, schedule_key: str, entries_key: str) -> None:
    client.zadd(schedule_key, {"e1": 1})
    client.hset(entries_key, "e1", "{}")


def test_a_redis_broker_s_delays_are_emptied(redis_url: str, redis_client: redis.Redis) -> None:
    settings = PlatformSettings.build(redis_url=redis_url, profile="kit_redis")
    keys = delay_keys(settings.profile)
    _store_one(redis_client, keys.schedule, keys.entries)
    assert empty_delay_store(settings) == "redis"
    assert redis_client.exists(keys.schedule, keys.entries) == 0


def test_the_rabbitmq_delay_store_on_the_platform_redis_is_emptied(
    redis_url: str, redis_client: redis.Redis
) -> None:
    settings = PlatformSettings.build(
        redis_url=redis_url, broker_url=AMQP, rabbitmq_delays="delay_store", profile="kit_amqp"
    )
    keys = rabbitmq_delay_keys(settings.profile)
    _store_one(redis_client, keys.schedule, keys.entries)
    assert empty_delay_store(settings) == "rabbitmq"
    assert redis_client.exists(keys.schedule, keys.entries) == 0


def test_native_delayed_delivery_has_no_store_to_empty(redis_url: str) -> None:
    settings = PlatformSettings.build(redis_url=redis_url, broker_url=AMQP)
    assert empty_delay_store(settings) is None
