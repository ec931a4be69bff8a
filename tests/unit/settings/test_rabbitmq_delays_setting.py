"""``PLATFORM_RABBITMQ_DELAYS``: which store holds delays on RabbitMQ, and the AMQP message
the delay store keeps (built without any server)."""

from __future__ import annotations

import json

import pytest

from platform_tasks import create_app
from platform_tasks.brokers.selection import delays_in_store
from platform_tasks.errors import SettingsError
from platform_tasks.publishing.amqp_wire import AmqpMessage, AmqpMessageBuilder
from platform_tasks.settings import PlatformSettings

AMQP = "amqp://platform:s3cret@127.0.0.1:1/%2F"  # port 1: nothing may connect


def test_native_is_the_default_and_delay_store_selects_the_redis_store() -> None:
    assert delays_in_store(PlatformSettings.build(broker_url=AMQP)) is None
    chosen = PlatformSettings.from_env(
        {"PLATFORM_BROKER_URL": AMQP, "PLATFORM_RABBITMQ_DELAYS": "delay_store"}
    )
    assert delays_in_store(chosen) == "rabbitmq"
    assert delays_in_store(PlatformSettings.build()) == "redis"


def test_an_unknown_value_is_refused_naming_the_variable() -> None:
    with pytest.raises(SettingsError) as err:
        PlatformSettings.from_env(
            {"PLATFORM_BROKER_URL": AMQP, "PLATFORM_RABBITMQ_DELAYS": "redis"}
        )
    assert "PLATFORM_RABBITMQ_DELAYS" in str(err.value)
    assert "'native' or 'delay_store'" in str(err.value)
    assert "s3cret" not in str(err.value)


def test_the_setting_is_refused_with_a_redis_broker() -> None:
    with pytest.raises(SettingsError) as err:
        PlatformSettings.from_env(
            {
                "PLATFORM_REDIS_URL": "redis://:pw@127.0.0.1:6379/0",
                "PLATFORM_RABBITMQ_DELAYS": "native",
            }
        )
    assert "PLATFORM_RABBITMQ_DELAYS" in str(err.value) and "redis://" in str(err.value)
    assert "pw" not in str(err.value)


def test_the_stored_message_is_the_task_message_without_the_sent_event() -> None:
    settings = PlatformSettings.build(broker_url=AMQP, rabbitmq_delays="delay_store")
    app = create_app("amqp_wire_unit", settings=settings)
    builder = AmqpMessageBuilder(app)
    try:
        message = builder.build(
            "billing.charge",
            args=[{"a": 1}],
            task_id="j1",
            queue="billing",
            headers={"platform_attempt": 2},
            argsrepr="()",
        )
    finally:
        builder.close()
    assert (message.queue, message.exchange, message.routing_key) == ("billing",) * 3
    assert json.loads(message.body)[0] == [{"a": 1}]
    props = message.properties
    assert props["correlation_id"] == "j1" and props["delivery_mode"] == 2
    assert props["application_headers"]["task"] == "billing.charge"
    assert props["application_headers"]["platform_attempt"] == 2
    assert "argsrepr" not in props, "only AMQP basic properties are kept"
    assert AmqpMessage.decode(message.encode()) == message


def test_each_broker_and_mode_gets_its_promoter() -> None:
    from platform_tasks.publishing.delay_promoter import DelayPromoter, delay_promoter_for
    from platform_tasks.publishing.rabbitmq_delay_promoter import RabbitMQDelayPromoter

    def promoter_of(**values: str) -> object:
        return delay_promoter_for(
            create_app("promoter_unit", settings=PlatformSettings.build(**values))
        )

    assert isinstance(promoter_of(), DelayPromoter)
    assert promoter_of(broker_url=AMQP) is None, "RabbitMQ holds native delays itself"
    assert isinstance(
        promoter_of(broker_url=AMQP, rabbitmq_delays="delay_store"), RabbitMQDelayPromoter
    )
