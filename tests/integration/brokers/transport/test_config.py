"""Which transport create_app picks, and configurations the platform transport refuses."""

from __future__ import annotations

import pytest

from platform_tasks import create_app
from platform_tasks.brokers.transport import TRANSPORT_PATH, Transport
from platform_tasks.errors import ConfigurationError
from platform_tasks.settings import PlatformSettings
from tests.integration.brokers.transport.conftest import ConnectionFactory


def _settings(**values: object) -> PlatformSettings:
    return PlatformSettings.build(profile="test", **values)


@pytest.mark.parametrize("url", ["redis://127.0.0.1:6379/0", "rediss://127.0.0.1:6380/0"])
def test_redis_brokers_get_the_platform_transport(url: str) -> None:
    app = create_app("t", settings=_settings(redis_url=url))
    assert app.conf.broker_transport == TRANSPORT_PATH
    assert app.connection_for_write().transport_cls == TRANSPORT_PATH


def test_stock_setting_falls_back_to_kombu() -> None:
    app = create_app("t", settings=_settings(transport="stock"))
    assert app.conf.broker_transport is None
    conn = app.connection_for_write()
    assert conn.transport_cls == "redis"


def test_sweep_options_keep_the_stock_sweep_within_the_visibility_timeout() -> None:
    app = create_app("t", settings=_settings(transport="stock", visibility_timeout_seconds=20))
    options = app.conf.broker_transport_options
    assert options["visibility_timeout"] == 20
    assert options["unacked_restore_interval"] <= 20
    assert options["unacked_restore_throttle"] == 1


def test_caller_transport_options_win() -> None:
    app = create_app(
        "t",
        settings=_settings(),
        broker_transport_options={"unacked_restore_interval": 3, "global_keyprefix": "x:"},
    )
    options = app.conf.broker_transport_options
    assert options["unacked_restore_interval"] == 3
    assert options["global_keyprefix"] == "x:"


def test_sentinel_broker_is_refused_with_a_clear_error() -> None:
    with pytest.raises(ConfigurationError, match=r"Sentinel.*PLATFORM_TRANSPORT=stock"):
        create_app("t", settings=_settings(broker_url="sentinel://127.0.0.1:26379"))


def test_sentinel_broker_is_allowed_on_the_stock_transport() -> None:
    app = create_app(
        "t", settings=_settings(broker_url="sentinel://127.0.0.1:26379", transport="stock")
    )
    assert app.conf.broker_transport is None


def test_explicit_broker_transport_is_respected() -> None:
    app = create_app("t", settings=_settings(), broker_transport="memory")
    assert app.conf.broker_transport == "memory"


def test_ack_emulation_off_is_refused(connect: ConnectionFactory) -> None:
    conn = connect(ack_emulation=False)
    with pytest.raises(ConfigurationError, match="ack_emulation"):
        conn.channel()


def test_transport_is_a_kombu_redis_subclass() -> None:
    from kombu.transport.redis import Channel as StockChannel
    from kombu.transport.redis import Transport as StockTransport

    assert issubclass(Transport, StockTransport)
    assert issubclass(Transport.Channel, StockChannel)
