"""Where the outbox relay hands a claimed batch: the broker, as few round trips as it takes.

The relay (:mod:`~platform_tasks.publishing.outbox_relay`) claims rows and commits their
delete; a sink publishes them and says which ones the broker accepted. A row is deleted
only once its sink returned its id, so a sink that fails, or accepts only part of a
batch, leaves the rest in the outbox for the next pass.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, NamedTuple

import redis

from platform_tasks.keys import DelayKeys, delay_keys, rabbitmq_delay_keys

if TYPE_CHECKING:
    from redis.typing import EncodableT, FieldT

    from platform_tasks.kernel import PlatformCelery
    from platform_tasks.publishing.confirmed_publisher import ConfirmedPublisher
    from platform_tasks.settings import PlatformSettings

__all__ = ["AmqpSink", "RedisSink", "Row", "lpush_command"]

logger = logging.getLogger(__name__)


class Row(NamedTuple):
    """A claimed outbox row. ``message`` stays the bytes PostgreSQL sent: the broker takes
    them as they are, so a row is never decoded to text and encoded back."""

    id: int
    broker: str
    queue: str
    target: str | None
    message: bytes
    entry_id: str | None
    due_ms: int | None


def lpush_command(key: str, values: list[bytes]) -> bytes:
    """One ``LPUSH key value...`` in Redis's wire protocol (RESP), ready to send.

    redis-py packs a command by encoding every argument and cutting the result into
    pieces of 6 kB, each sent with its own ``sendall``: for a batch of 500 messages of
    1.5 kB that is about 200 system calls and most of the relay's time in Python. The
    values here are already bytes, so one join makes the whole command (three to four
    times faster, BENCHMARKS.md); redis-py still sends it and reads the reply."""
    name = key.encode()
    parts = [b"*%d\r\n$5\r\nLPUSH\r\n$%d\r\n%s\r\n" % (len(values) + 2, len(name), name)]
    for value in values:
        parts.append(b"$%d\r\n" % len(value))
        parts.append(value)
        parts.append(b"\r\n")
    return b"".join(parts)


class RedisSink:
    """Publishes rows onto a Redis broker in one pipelined round trip per batch (a failure
    anywhere in it republishes the whole batch: the copies carry the same job ids).

    The rows of one list go in one variadic ``LPUSH`` (Redis pushes its values in order,
    exactly as one ``LPUSH`` per row would, so consumers still see publish order); the
    rows due later go into the delay store in one ``HSET`` and one ``ZADD``. A batch costs
    Redis a few commands instead of one per row, and the relay no per-row command."""

    def __init__(self, settings: PlatformSettings) -> None:
        self.client = redis.Redis.from_url(
            settings.effective_broker_url, socket_timeout=10, socket_connect_timeout=5
        )
        self.keys: DelayKeys = delay_keys(settings.profile)

    def publish(self, rows: list[Row]) -> list[int]:
        """Ids of the rows Redis accepted: all of them, or an exception. ``rows`` are in
        publish order."""
        lists: dict[str, list[bytes]] = {}
        entries: dict[FieldT, EncodableT] = {}
        due: dict[str, EncodableT] = {}
        for row in rows:
            if row.target is not None:
                lists.setdefault(row.target, []).append(row.message)
            else:
                assert row.entry_id is not None and row.due_ms is not None
                entries[row.entry_id] = row.message
                due[row.entry_id] = row.due_ms
        if lists:
            self._push(lists)
        if entries:
            with self.client.pipeline(transaction=False) as pipe:
                pipe.hset(self.keys.entries, mapping=entries)
                pipe.zadd(self.keys.schedule, due)
                pipe.execute()
        return [row.id for row in rows]

    def _push(self, lists: dict[str, list[bytes]]) -> None:
        """The ``LPUSH`` of every list in one write and one read of the replies. A failure
        (or an error reply) leaves replies unread, so the connection is closed before it
        goes back to the pool; the caller sees the error and the batch is not deleted."""
        pool = self.client.connection_pool
        connection: Any = pool.get_connection()  # redis-py leaves its methods untyped
        try:
            connection.send_packed_command(
                [lpush_command(key, values) for key, values in lists.items()]
            )
            for _ in lists:
                connection.read_response()
        except BaseException:
            connection.disconnect()
            raise
        finally:
            pool.release(connection)

    def close(self) -> None:
        self.client.close()


class AmqpSink:
    """Publishes rows into RabbitMQ with publisher confirms; rows due later go into the
    delay store on the platform's Redis, which the RabbitMQ promoter drains."""

    def __init__(self, app: PlatformCelery) -> None:
        from platform_tasks.publishing.confirmed_publisher import ConfirmedPublisher

        self.app = app
        self.settings: PlatformSettings = app.platform_settings
        from platform_tasks.publishing.native_delays import NativeDelays

        self.publisher: ConfirmedPublisher = ConfirmedPublisher(app)
        self._native = NativeDelays(app)
        self._store: redis.Redis | None = None

    def _delay_store(self) -> redis.Redis:
        if self._store is None:
            from platform_tasks.brokers.redis_client import build_redis

            self._store = build_redis(self.settings)
        return self._store

    def publish(self, rows: list[Row]) -> list[int]:
        from platform_tasks.publishing.amqp_wire import AmqpMessage

        accepted: list[int] = []
        later = [row for row in rows if row.entry_id is not None]  # for the delay store
        now = [row for row in rows if row.entry_id is None]  # countdown rows included
        if later:
            keys = rabbitmq_delay_keys(self.settings.profile)
            with self._delay_store().pipeline(transaction=True) as pipe:
                for row in later:
                    assert row.entry_id is not None and row.due_ms is not None
                    pipe.hset(keys.entries, row.entry_id, row.message)
                    pipe.zadd(keys.schedule, {row.entry_id: row.due_ms})
                pipe.execute()
            accepted.extend(row.id for row in later)
        if now:
            messages = [AmqpMessage.decode(row.message) for row in now]
            for row, message in zip(now, messages, strict=True):
                if row.due_ms is not None:  # through the delayed-delivery queues
                    self._native.ensure_routable(message.queue)
            confirmed = self.publisher.publish(messages)
            accepted.extend(row.id for row, ok in zip(now, confirmed, strict=True) if ok)
            if not all(confirmed):
                logger.warning(
                    "RabbitMQ did not confirm %d outbox messages; they stay for the next pass",
                    confirmed.count(False),
                    extra={"event": "outbox.unconfirmed", "count": confirmed.count(False)},
                )
        return accepted

    def close(self) -> None:
        self.publisher.close()
        if self._store is not None:
            self._store.close()
            self._store = None
