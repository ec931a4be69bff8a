"""One delay back end per deployment, chosen once: the port schedules, nobody asks how.

A job due later waits in one of three places, depending on the broker:

- :class:`RedisStoreDelays` (a Redis broker): the delay store on the broker's Redis holds
  the exact kombu wire message, moved onto its list atomically when due;
- :class:`RabbitMQStoreDelays` (RabbitMQ, ``PLATFORM_RABBITMQ_DELAYS=delay_store``): the
  delay store on the platform's Redis holds the AMQP message, published with confirms
  when due (milliseconds);
- :class:`NativeRabbitMQDelays` (RabbitMQ by default): the broker's delayed-delivery
  queues hold the message itself (whole seconds); there is no store to read or change.

:func:`delay_backend_for` picks one from the settings (where the store is, which keys and
which client: :func:`~platform_tasks.brokers.delay_location.delay_store_location`), so
the queue port, unique publish and everything else that writes a delay calls the same
:class:`DelayBackend` methods whatever the broker (the shape of dramatiq's
``Broker.enqueue(message, delay=)``, where each broker owns its delay mechanism).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from platform_tasks.brokers.delay_location import DelayStoreLocation, delay_store_location
from platform_tasks.brokers.selection import broker_kind
from platform_tasks.epoch import epoch_ms
from platform_tasks.errors import ConfigurationError
from platform_tasks.limits.unique import UniqueLocks
from platform_tasks.publishing.amqp_wire import AmqpMessageBuilder
from platform_tasks.publishing.delay_store import DelayStore
from platform_tasks.publishing.native_delays import NativeDelays
from platform_tasks.publishing.wire import WireBuilder

if TYPE_CHECKING:
    from platform_tasks.kernel import PlatformCelery

__all__ = [
    "DelayBackend",
    "DelayedSend",
    "NativeRabbitMQDelays",
    "RabbitMQStoreDelays",
    "RedisStoreDelays",
    "delay_backend_for",
]

DelayedSend = tuple[str, dict[str, Any], datetime]
"""One job to delay: its task name, its ``send_task`` arguments and when it is due."""

_Entry = tuple[str, int, str]
"""A delay-store entry: its id, when it is due (epoch ms) and the encoded message."""

NO_STORE = (
    "unique_key needs a delay store: a Redis broker, or RabbitMQ with "
    "PLATFORM_RABBITMQ_DELAYS=delay_store (RabbitMQ's native delayed delivery cannot "
    "find or replace a waiting job)"
)


class DelayBackend(Protocol):
    """What holds this deployment's delayed jobs until they are due."""

    def schedule(self, task_name: str, send: dict[str, Any], run_at: datetime) -> None:
        """Hold the job ``app.send_task(task_name, **send)`` would publish until ``run_at``
        (in the future: the port publishes a due job at once)."""
        ...

    def schedule_many(self, items: Sequence[DelayedSend]) -> None:
        """Hold many jobs, in one round trip where the back end allows it; an item already
        due is published (or made due) at once."""
        ...

    def encode(self, task_name: str, send: dict[str, Any]) -> str:
        """The job as a delay-store entry (unique publish stores it under its lock);
        refused with :class:`~platform_tasks.errors.ConfigurationError` without a store."""
        ...

    def unique_locks(self) -> UniqueLocks:
        """The unique publish locks, beside the store; refused without a store."""
        ...

    def close(self) -> None:
        """Release the back end's connections (a client it was given stays open)."""
        ...


class _StoreDelays:
    """What both delay stores share: the store, its client, its locks, adding entries.

    A store's own part is :meth:`_identified`: how a job is encoded as an entry, and the
    entry's id.
    """

    def __init__(self, location: DelayStoreLocation, client: Any | None) -> None:
        self.location = location
        self._owns_client = client is None
        self._client = client
        self._store: DelayStore | None = None
        self._locks: UniqueLocks | None = None

    def _identified(self, task_name: str, send: dict[str, Any]) -> tuple[str, str]:
        """The job's entry id and its encoded entry."""
        raise NotImplementedError

    def _entry(self, task_name: str, send: dict[str, Any], run_at: datetime) -> _Entry:
        entry_id, entry = self._identified(task_name, send)
        return entry_id, epoch_ms(run_at), entry

    def store(self) -> DelayStore:
        """The delay store, on a client made at first use unless one was given."""
        if self._store is None:
            if self._client is None:
                self._client = self.location.connect()
            self._store = DelayStore(self._client, self.location.keys)
        return self._store

    def schedule(self, task_name: str, send: dict[str, Any], run_at: datetime) -> None:
        self.store().add_encoded(*self._entry(task_name, send, run_at))

    def schedule_many(self, items: Sequence[DelayedSend]) -> None:
        self.store().add_many_encoded([self._entry(*item) for item in items])

    def encode(self, task_name: str, send: dict[str, Any]) -> str:
        return self._identified(task_name, send)[1]

    def unique_locks(self) -> UniqueLocks:
        if self._locks is None:
            store = self.store()
            self._locks = UniqueLocks(store.client, store.keys)
        return self._locks

    def close(self) -> None:
        if self._owns_client and self._client is not None:
            self._client.close()
            self._client = None
            self._store = None
            self._locks = None


class RedisStoreDelays(_StoreDelays):
    """Delays in the store on a Redis broker's own server, as kombu wire messages under
    their delivery tag."""

    def __init__(
        self, app: PlatformCelery, location: DelayStoreLocation, client: Any | None = None
    ) -> None:
        super().__init__(location, client)
        self._wire = WireBuilder(app)

    def _identified(self, task_name: str, send: dict[str, Any]) -> tuple[str, str]:
        message = self._wire.build(task_name, **send)
        entry = json.dumps({"q": message.list_key, "m": message.wire}, separators=(",", ":"))
        return message.delivery_tag, entry

    def close(self) -> None:
        self._wire.close()
        super().close()


class RabbitMQStoreDelays(_StoreDelays):
    """Delays in the store on the platform's Redis, as AMQP messages under a fresh id."""

    def __init__(
        self, app: PlatformCelery, location: DelayStoreLocation, client: Any | None = None
    ) -> None:
        super().__init__(location, client)
        self._messages = AmqpMessageBuilder(app)

    def _identified(self, task_name: str, send: dict[str, Any]) -> tuple[str, str]:
        return uuid.uuid4().hex, self._messages.build(task_name, **send).encode()

    def close(self) -> None:
        self._messages.close()
        super().close()


class _NoStore:
    """A back end without a delay store: nothing to encode an entry for or lock beside,
    so a unique publish is refused, naming the setting that gives a store."""

    def encode(self, task_name: str, send: dict[str, Any]) -> str:
        raise ConfigurationError(NO_STORE)

    def unique_locks(self) -> UniqueLocks:
        raise ConfigurationError(NO_STORE)

    def close(self) -> None:
        return None


class NativeRabbitMQDelays(_NoStore):
    """Delays in RabbitMQ's own delayed-delivery queues; no store, so no unique publish."""

    def __init__(self, app: PlatformCelery, clock: Callable[[], datetime]) -> None:
        self.app = app
        self._clock = clock
        self._native = NativeDelays(app)

    def schedule(self, task_name: str, send: dict[str, Any], run_at: datetime) -> None:
        self._native.send(task_name, run_at - self._clock(), **send)

    def schedule_many(self, items: Sequence[DelayedSend]) -> None:
        for task_name, send, run_at in items:
            delay = run_at - self._clock()
            if delay.total_seconds() <= 0:
                self.app.send_task(task_name, **send)
            else:
                self._native.send(task_name, delay, **send)


class NoDelays(_NoStore):
    """A broker that holds no delays (neither Redis nor RabbitMQ): scheduling is refused
    (a worker on it refuses to start, see ``require_redis_broker``)."""

    def __init__(self, app: PlatformCelery) -> None:
        scheme = app.platform_settings.effective_broker_url.split("://")[0]
        self._why = (
            f"PLATFORM_BROKER_URL: durable delays need a Redis or RabbitMQ broker, got {scheme}"
        )

    def schedule(self, task_name: str, send: dict[str, Any], run_at: datetime) -> None:
        raise ConfigurationError(self._why)

    def schedule_many(self, items: Sequence[DelayedSend]) -> None:
        raise ConfigurationError(self._why)


def delay_backend_for(
    app: PlatformCelery, *, clock: Callable[[], datetime], redis_client: Any | None = None
) -> DelayBackend:
    """The delay back end of ``app``'s deployment. ``redis_client`` (tests, benchmarks)
    is used for the store instead of a client of its own, and left open on close."""
    location = delay_store_location(app.platform_settings)
    if location is None:
        if broker_kind(app.platform_settings.effective_broker_url) == "amqp":
            return NativeRabbitMQDelays(app, clock)
        return NoDelays(app)
    if location.kind == "rabbitmq":
        return RabbitMQStoreDelays(app, location, redis_client)
    return RedisStoreDelays(app, location, redis_client)
