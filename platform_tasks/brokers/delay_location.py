"""Where this deployment's delays wait: decided here once, for every reader and writer.

A Redis broker keeps its delay store on the broker's own Redis (the promotion onto the
queue lists is atomic only there); RabbitMQ with ``PLATFORM_RABBITMQ_DELAYS=delay_store``
keeps it on the platform's Redis (``PLATFORM_REDIS_URL``, cluster-aware), under other
keys, because its entries are AMQP messages; RabbitMQ's native delayed delivery keeps no
store at all. The queue port, the promoters, unique publish, the limits' release of a
unique key, cancel and the test kit all ask :func:`delay_store_location` rather than
deciding it again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import redis

from platform_tasks.brokers.redis_client import build_redis
from platform_tasks.brokers.selection import delays_in_store
from platform_tasks.keys import DelayKeys, delay_keys, rabbitmq_delay_keys
from platform_tasks.settings import PlatformSettings

__all__ = ["DelayStoreLocation", "delay_store_location"]


@dataclass(frozen=True)
class DelayStoreLocation:
    """The delay store of one deployment: which kind of entries, which keys, which server."""

    kind: Literal["redis", "rabbitmq"]
    """``redis``: kombu wire messages for a Redis broker's lists; ``rabbitmq``: AMQP
    messages a promoter publishes with confirms."""
    keys: DelayKeys
    settings: PlatformSettings

    def connect(self, *, timeout: float | None = None, connect_timeout: float | None = None) -> Any:
        """A new client of the server holding the store (the caller closes it).

        ``timeout``/``connect_timeout`` are socket timeouts in seconds; ``None`` keeps the
        client's default (none on the broker's Redis, the platform client's otherwise).
        """
        if self.kind == "redis":
            return redis.Redis.from_url(
                self.settings.effective_broker_url,
                socket_timeout=timeout,
                socket_connect_timeout=connect_timeout,
            )
        if timeout is None:
            return build_redis(self.settings, connect_timeout=connect_timeout)
        return build_redis(self.settings, timeout=timeout, connect_timeout=connect_timeout)

    @classmethod
    def on_redis_broker(cls, settings: PlatformSettings) -> DelayStoreLocation:
        """The store of a Redis broker: on the broker's Redis, kombu wire entries."""
        return cls("redis", delay_keys(settings.profile), settings)

    @classmethod
    def for_rabbitmq(cls, settings: PlatformSettings) -> DelayStoreLocation:
        """The store of a RabbitMQ broker: on the platform's Redis, AMQP entries."""
        return cls("rabbitmq", rabbitmq_delay_keys(settings.profile), settings)


def delay_store_location(settings: PlatformSettings) -> DelayStoreLocation | None:
    """The delay store ``settings`` use, or ``None`` when RabbitMQ's native delayed
    delivery holds the delays (or the broker holds none)."""
    kind = delays_in_store(settings)
    if kind == "redis":
        return DelayStoreLocation.on_redis_broker(settings)
    if kind == "rabbitmq":
        return DelayStoreLocation.for_rabbitmq(settings)
    return None
