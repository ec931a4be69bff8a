"""Where the delays wait is decided once, from the settings alone."""

from __future__ import annotations

from platform_tasks.brokers.delay_location import delay_store_location
from platform_tasks.keys import delay_keys, rabbitmq_delay_keys
from platform_tasks.settings import PlatformSettings

REDIS = "redis://127.0.0.1:1/0"  # port 1: nothing here connects
AMQP = "amqp://platform:s3cret@127.0.0.1:1/%2F"


def test_a_redis_broker_keeps_its_delays_beside_its_queues() -> None:
    settings = PlatformSettings.build(redis_url=REDIS, profile="loc_redis")
    location = delay_store_location(settings)
    assert location is not None
    assert (location.kind, location.keys) == ("redis", delay_keys("loc_redis"))


def test_rabbitmq_with_a_delay_store_keeps_amqp_entries_apart() -> None:
    settings = PlatformSettings.build(
        redis_url=REDIS, broker_url=AMQP, rabbitmq_delays="delay_store", profile="loc_amqp"
    )
    location = delay_store_location(settings)
    assert location is not None
    assert (location.kind, location.keys) == ("rabbitmq", rabbitmq_delay_keys("loc_amqp"))
    assert location.keys != delay_keys("loc_amqp")


def test_rabbitmq_native_delays_have_no_store() -> None:
    settings = PlatformSettings.build(redis_url=REDIS, broker_url=AMQP)
    assert delay_store_location(settings) is None
