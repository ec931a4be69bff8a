"""The transactional outbox's write: a finished message inserted in the caller's transaction.

``publish(..., tx=conn)`` and ``schedule(..., tx=conn)`` build the message exactly as a
direct publish would (envelope validated, headers, trace context, publish time, route)
and hand it here instead of to the broker: one row of ``core.outbox``, inserted through
the caller's connection or cursor. The row commits or rolls back with the caller's work,
so a job exists if and only if that transaction committed; a relay in every worker and
beat (:mod:`~platform_tasks.publishing.outbox_relay`) hands committed rows to the broker.

Inside a :class:`~platform_tasks.consumer.task.PlatformTask` handler the pipeline sets
:data:`current_handler_tx` around the call (:func:`handler_publishes`), and a publish
with no ``tx`` joins the handler's transaction: a follow-up leaves only if the handler's
work commits. Its job id, unless the payload gives one, is derived from the parent job
id, the consumer and the publish's sequence number within the attempt
(:meth:`HandlerTransaction.child_job_id`), so a retried attempt that publishes the same
follow-ups again produces the same ids, and the children's idempotency rows absorb any
copy. ``tx=None`` publishes to the broker at once, outside any transaction.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from psycopg2.extras import execute_values

from platform_tasks.brokers.selection import (
    broker_kind,
    delay_countdown_seconds,
    delays_in_store,
)
from platform_tasks.envelope import derived_uuid7
from platform_tasks.errors import ConfigurationError, PlatformError
from platform_tasks.observability.trace_context import ambient_trace_headers
from platform_tasks.postgres.queries import load_queries

if TYPE_CHECKING:
    from platform_tasks.envelope import Envelope
    from platform_tasks.kernel import PlatformCelery
    from platform_tasks.limits.unique import UniquePublish
    from platform_tasks.publishing.amqp_wire import AmqpMessageBuilder
    from platform_tasks.publishing.queue_port import PublishOptions
    from platform_tasks.publishing.wire import WireBuilder

__all__ = [
    "JOIN",
    "HandlerTransaction",
    "OutboxRow",
    "OutboxTransactionError",
    "OutboxWriter",
    "current_handler_tx",
    "handler_publishes",
    "outbox_cursor",
]

_TX_IDLE, _TX_INERROR, _TX_UNKNOWN = 0, 3, 4
"""``connection.info.transaction_status`` values, the same in psycopg2 and psycopg 3."""


class _Join:
    """The default of ``tx``: join the running handler's transaction, if there is one."""

    def __repr__(self) -> str:
        return "JOIN"


JOIN: Final = _Join()
"""``tx``'s default: inside a PlatformTask handler, publish in its transaction; elsewhere
publish to the broker at once. Pass ``tx=None`` to publish at once even in a handler."""


class OutboxTransactionError(PlatformError, ValueError):
    """The ``tx`` given to ``publish``/``schedule`` cannot hold the outbox row: not a
    connection or cursor, closed, aborted by an earlier error, or outside a transaction."""


@dataclass
class HandlerTransaction:
    """The transaction of the handler call running in this context, and the count of the
    publishes it made so far (the sequence child job ids are derived from)."""

    cursor: Any
    parent_job_id: uuid.UUID
    consumer: str
    published: int = field(default=0)

    def child_job_id(self) -> uuid.UUID:
        """The next publish's job id: a UUIDv7 whose time part is the parent's (children
        sort beside their parent) and whose random bits hash (parent, consumer, sequence).

        The sequence counts this attempt's publishes from 1, so a retry that publishes the
        same follow-ups in the same order gets the same ids."""
        self.published += 1
        parent_ms = self.parent_job_id.int >> 80
        return derived_uuid7(
            parent_ms, "child", str(self.parent_job_id), self.consumer, str(self.published)
        )


current_handler_tx: ContextVar[HandlerTransaction | None] = ContextVar(
    "platform_current_handler_tx", default=None
)
"""Set by the consumer pipeline around a handler call; read by the queue port."""


@contextmanager
def handler_publishes(cursor: Any, job_id: uuid.UUID, consumer: str) -> Iterator[None]:
    """Make publishes without ``tx`` inside the block join ``cursor``'s transaction."""
    token = current_handler_tx.set(HandlerTransaction(cursor, job_id, consumer))
    try:
        yield
    finally:
        current_handler_tx.reset(token)


def outbox_cursor(tx: Any) -> tuple[Any, HandlerTransaction | None] | None:
    """Where a publish with ``tx`` goes: ``(cursor or connection, handler)`` for the
    outbox, ``None`` for the broker at once. ``handler`` is set when the publish joined a
    running handler's transaction (its job ids are derived)."""
    if tx is JOIN:
        handler = current_handler_tx.get()
        return None if handler is None else (handler.cursor, handler)
    if tx is None:
        return None
    return tx, None


def _check(tx: Any) -> tuple[Any, bool]:
    """``(connection, is_cursor)`` of ``tx``, refused with a clear error when it cannot
    take a row that commits with the caller's work."""
    if hasattr(tx, "execute") and hasattr(tx, "connection") and not hasattr(tx, "cursor"):
        conn, is_cursor = tx.connection, True
        if getattr(tx, "closed", False):
            raise OutboxTransactionError("tx: the cursor given is closed")
    elif callable(getattr(tx, "cursor", None)) and hasattr(tx, "info"):
        conn, is_cursor = tx, False
    else:
        raise OutboxTransactionError(
            "tx must be a PostgreSQL connection or cursor (psycopg2 or psycopg), "
            f"got {type(tx).__name__}"
        )
    if getattr(conn, "closed", False):
        raise OutboxTransactionError("tx: the connection given is closed")
    status = int(conn.info.transaction_status)
    if status == _TX_INERROR:
        raise OutboxTransactionError(
            "tx: the transaction is aborted (an earlier statement failed); nothing inserted "
            "in it can commit, so the job would never exist. Roll back first"
        )
    if status == _TX_UNKNOWN:
        raise OutboxTransactionError("tx: the connection is in an unknown state (broken)")
    if status == _TX_IDLE and getattr(conn, "autocommit", False):
        raise OutboxTransactionError(
            "tx: the connection is in autocommit mode outside a transaction: the job would "
            "commit on its own. Publish inside BEGIN ... COMMIT (or `with conn:`)"
        )
    return conn, is_cursor


@dataclass(frozen=True)
class OutboxRow:
    """One finished message, as it waits in ``core.outbox``."""

    broker: str
    job_id: uuid.UUID
    queue: str
    target: str | None
    """The Redis list a published row is pushed onto; ``None`` otherwise."""
    message: str
    entry_id: str | None = None
    due_ms: int | None = None


class OutboxWriter:
    """Builds rows from ``send_task`` arguments and inserts them in a caller's transaction.

    Messages are built by the same builders the delay store uses, so a relayed row is
    byte for byte what a direct publish would have sent.
    """

    def __init__(self, app: PlatformCelery) -> None:
        self.app = app
        self.settings = app.platform_settings
        self.broker = broker_kind(self.settings.effective_broker_url)
        if self.broker not in ("redis", "amqp"):
            raise ConfigurationError(
                "PLATFORM_BROKER_URL: publishing in a transaction (tx=) needs a Redis or "
                f"RabbitMQ broker, got {self.settings.effective_broker_url.split('://')[0]}"
            )
        self._lock = threading.Lock()
        self._wire: WireBuilder | None = None
        self._amqp: AmqpMessageBuilder | None = None
        self._sql = load_queries("outbox")

    def _redis_wire(self) -> WireBuilder:
        with self._lock:
            if self._wire is None:
                from platform_tasks.publishing.wire import WireBuilder

                self._wire = WireBuilder(self.app)
            return self._wire

    def _amqp_builder(self) -> AmqpMessageBuilder:
        with self._lock:
            if self._amqp is None:
                from platform_tasks.publishing.amqp_wire import AmqpMessageBuilder

                self._amqp = AmqpMessageBuilder(self.app)
            return self._amqp

    def build(self, kind: str, send: dict[str, Any], due_ms: int | None, now_ms: int) -> OutboxRow:
        """The row of ``send_task(kind, **send)``; ``due_ms`` for a job due later.

        Where the job waits until ``due_ms``: the delay store (Redis brokers, RabbitMQ with
        ``PLATFORM_RABBITMQ_DELAYS=delay_store``; the row carries an entry id), or
        RabbitMQ's delayed-delivery queues, the message built with its countdown from
        ``now_ms`` (whole seconds, rounded up; it runs that long after the relay
        published it, the relay's lag later than a direct ``schedule``)."""
        job_id = uuid.UUID(str(send["task_id"]))
        queue = str(send["queue"])
        if self.broker == "redis":
            wire = self._redis_wire().build(kind, **send)
            if due_ms is None:  # pushed as is, no decoding in the relay
                return OutboxRow("redis", job_id, queue, wire.list_key, wire.wire)
            entry = json.dumps({"q": wire.list_key, "m": wire.wire}, separators=(",", ":"))
            return OutboxRow("redis", job_id, queue, None, entry, wire.delivery_tag, due_ms)
        entry_id = None
        if due_ms is not None:
            if delays_in_store(self.settings) == "rabbitmq":
                entry_id = uuid.uuid4().hex
            else:
                countdown = delay_countdown_seconds((due_ms - now_ms) / 1000)
                send = {**send, "countdown": countdown}
        message = self._amqp_builder().build(kind, **send)
        return OutboxRow("amqp", job_id, queue, None, message.encode(), entry_id, due_ms)

    def unique_row(
        self,
        queue: str,
        envelope: Envelope[Any],
        options: PublishOptions,
        unique: UniquePublish,
        due_ms: int | None,
    ) -> OutboxRow:
        """The row of a unique publish: the request, not a message. Whether the job is
        published, and under which id, depends on the key's Redis lock, which only the
        relay can take (a lock taken now would outlive a rollback): the relay makes the
        unique publish once the row committed, with the same job id every time (a relay
        that publishes it again finds the key held by that very id). The trace context
        of the publishing code is kept for it."""
        request = {
            "payload": envelope.to_message(),
            "opts": options.model_dump(),
            "unique": {"key": unique.key, "ttl_ms": unique.ttl_ms, "mode": unique.mode},
            "trace": ambient_trace_headers(),
        }
        message = json.dumps(request, separators=(",", ":"), default=str)
        return OutboxRow("unique", envelope.job_id, queue, None, message, None, due_ms)

    def _params(self, row: OutboxRow) -> tuple[Any, ...]:
        return (
            self.settings.profile,
            row.broker,
            str(row.job_id),
            row.queue,
            row.target,
            row.message,
            row.entry_id,
            row.due_ms,
        )

    def insert(self, tx: Any, row: OutboxRow) -> None:
        """Insert ``row`` through ``tx`` (a connection or cursor) in its transaction."""
        self.insert_many(tx, [row])

    def insert_many(self, tx: Any, rows: list[OutboxRow]) -> None:
        """Insert ``rows`` through ``tx`` in its transaction, many per statement."""
        conn, is_cursor = _check(tx)
        if not rows:
            return
        cursor = tx if is_cursor else conn.cursor()
        try:
            if len(rows) == 1:
                cursor.execute(self._sql["insert_row"], self._params(rows[0]))
            else:
                execute_values(
                    cursor, self._sql["insert_rows"], [self._params(row) for row in rows]
                )
        finally:
            if not is_cursor:
                cursor.close()

    def close(self) -> None:
        if self._wire is not None:
            self._wire.close()
        if self._amqp is not None:
            self._amqp.close()
