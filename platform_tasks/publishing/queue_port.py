"""The queue port: the one way application code hands work to the platform.

``publish`` and ``schedule`` complete and validate the envelope before anything reaches
the broker, make the Celery task id equal the job id (so Flower and logs find a job by
its id), and keep ``data`` out of what Flower and logs show.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import redis
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic_core import PydanticCustomError

from platform_tasks.batches.api import DEFAULT_SHARDS, Batch, open_batch
from platform_tasks.brokers.selection import broker_holds_delays
from platform_tasks.envelope import Envelope, parse_envelope, uuid7, validation_errors
from platform_tasks.epoch import epoch_ms
from platform_tasks.errors import ConfigurationError, NaiveDatetimeError
from platform_tasks.headers import ATTEMPT_HEADER as ATTEMPT_HEADER
from platform_tasks.headers import BATCH_HEADER, TENANT_HEADER
from platform_tasks.limits.publish import UniquePublisher
from platform_tasks.limits.unique import UniquePublish, unique_publish
from platform_tasks.observability.context import current_correlation_id
from platform_tasks.observability.reserved_headers import reserved_header
from platform_tasks.observability.trace_context import outgoing_headers
from platform_tasks.publishing.delay_backend import DelayBackend, delay_backend_for
from platform_tasks.publishing.outbox import (
    JOIN,
    HandlerTransaction,
    OutboxRow,
    OutboxTransactionError,
    OutboxWriter,
    outbox_cursor,
)
from platform_tasks.publishing.outbox import _check as check_transaction
from platform_tasks.publishing.reference_clock import ReferenceClock

if TYPE_CHECKING:
    from platform_tasks.kernel import PlatformCelery


class PublishOptions(BaseModel):
    """Options of one publish; unknown keys are rejected rather than ignored."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    priority: int | None = Field(default=None, ge=0, le=255)
    headers: dict[str, Any] = Field(default_factory=dict)
    attempt: int = Field(default=1, ge=1)

    @field_validator("headers")
    @classmethod
    def _no_reserved_names(cls, headers: dict[str, Any]) -> dict[str, Any]:
        """Refuse a custom header named like one of Celery's or the platform's: Celery
        merges custom headers over its own (see
        :mod:`~platform_tasks.observability.reserved_headers`)."""
        for name in headers:
            why = reserved_header(name)
            if why is not None:
                raise PydanticCustomError(
                    "reserved_header",
                    "header {name} is reserved ({why}); give the custom header another name",
                    {"name": repr(name), "why": why},
                )
        return headers


_DEFAULT_OPTIONS = PublishOptions()


def _options(opts: Mapping[str, Any] | PublishOptions | None) -> PublishOptions:
    if isinstance(opts, PublishOptions):
        return opts
    if not opts:
        return _DEFAULT_OPTIONS
    try:
        return PublishOptions.model_validate(dict(opts or {}))
    except ValidationError as exc:
        detail = "; ".join(f"opts.{field}: {msg}" for field, msg in validation_errors(exc))
        raise ValueError(f"invalid publish options: {detail}") from None


class QueuePort:
    """Publish now or schedule for later, with the envelope validated first.

    Where a delayed job waits is the deployment's :class:`~platform_tasks.publishing.
    delay_backend.DelayBackend` (:attr:`delays`), chosen once from the settings; a publish
    with a ``unique_key`` goes through :class:`~platform_tasks.limits.publish.UniquePublisher`,
    which uses only the port's public methods.
    """

    def __init__(
        self,
        app: PlatformCelery,
        *,
        redis_client: redis.Redis | None = None,
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        self.app = app
        self.settings = app.platform_settings
        self._clock = clock or (lambda: datetime.now(UTC))
        self._reference = ReferenceClock(self.settings, local=lambda: self._clock().timestamp())
        self.delays: DelayBackend = delay_backend_for(
            app, clock=self._clock, redis_client=redis_client
        )
        self._unique = UniquePublisher(self)
        self._outbox: OutboxWriter | None = None

    def now(self) -> datetime:
        """The port's clock (aware): what "due now" is judged against."""
        return self._clock()

    def _to_outbox(
        self,
        tx: Any,
        queue: str,
        payload: Mapping[str, Any],
        options: PublishOptions,
        run_at: datetime | None,
        unique: UniquePublish | None = None,
        batch_id: uuid.UUID | None = None,
    ) -> Envelope[Any] | None:
        """Insert the finished message into ``core.outbox`` in ``tx`` (or the running
        handler's transaction) instead of sending it; ``None`` when the publish goes to
        the broker at once (see :mod:`~platform_tasks.publishing.outbox`). A unique
        publish is stored as its request: the relay makes it once the row committed."""
        target = outbox_cursor(tx)
        if target is None:
            return None
        cursor, handler = target
        envelope, row = self._outbox_row(handler, queue, payload, options, run_at, unique, batch_id)
        self._writer().insert(cursor, row)
        return envelope

    def _writer(self) -> OutboxWriter:
        if self._outbox is None:
            self._outbox = OutboxWriter(self.app)
        return self._outbox

    def _outbox_row(
        self,
        handler: HandlerTransaction | None,
        queue: str,
        payload: Mapping[str, Any],
        options: PublishOptions,
        run_at: datetime | None,
        unique: UniquePublish | None = None,
        batch_id: uuid.UUID | None = None,
    ) -> tuple[Envelope[Any], OutboxRow]:
        """The outbox row of one publish and its envelope, validated (a job id derived in a
        handler; a batch's child carries the batch's header)."""
        if handler is not None and (not isinstance(payload, Mapping) or not payload.get("job_id")):
            payload = {**payload, "job_id": str(handler.child_job_id())}
        envelope = self.envelope(payload)
        if run_at is not None and run_at <= self._clock():
            run_at = None
        send = self.send_options(queue, envelope, options, run_at)
        if batch_id is not None:
            send["headers"][BATCH_HEADER] = str(batch_id)
        due_ms = None if run_at is None else epoch_ms(run_at)
        if unique is not None:
            self.delays.unique_locks()  # refused now where there is no delay store
            return envelope, self._writer().unique_row(queue, envelope, options, unique, due_ms)
        now_ms = epoch_ms(self._clock())
        return envelope, self._writer().build(envelope.kind, send, due_ms, now_ms)

    def publish_child(
        self,
        queue: str,
        payload: Mapping[str, Any],
        opts: Mapping[str, Any] | PublishOptions | None,
        run_at: datetime | None,
        batch_id: uuid.UUID,
        *,
        tx: Any = JOIN,
    ) -> Envelope[Any]:
        """A batch's child, through the outbox in ``tx`` with the batch's header (see
        :meth:`batch`); its envelope."""
        if run_at is not None:
            _require_aware(run_at)
        staged = self._to_outbox(tx, queue, payload, _options(opts), run_at, None, batch_id)
        if staged is None:
            raise OutboxTransactionError(
                "a batch's children are published in a transaction: the handler of a batch "
                "child, or a batch() given tx="
            )
        return staged

    def batch(
        self,
        *,
        on_complete: Any = None,
        on_success: Any = None,
        on_death: Any = None,
        description: str = "",
        shards: int = DEFAULT_SHARDS,
        tx: Any = JOIN,
    ) -> AbstractContextManager[Batch]:
        """A batch: ``with port.batch(on_complete=Callback(queue, kind, tenant_id, data),
        tx=conn) as batch: batch.publish(queue, payload)``.

        The batch's row and every child (through the outbox, each message carrying the
        ``platform_batch_id`` header) are written in ``tx``'s transaction (inside a
        PlatformTask handler, the handler's by default): rolled back, none existed.
        ``on_complete`` is published once every child has ended (applied, dead-lettered,
        discarded or cancelled), ``on_success`` once every child was applied (also after
        replays), ``on_death`` at the first dead letter, each exactly once; their ``data``
        gets ``batch_id`` and ``counts``. Callbacks are checked here, with errors naming
        the field. ``shards`` spreads the counting over that many rows. See
        ``docs/batches.md``.
        """
        callbacks = {"on_complete": on_complete, "on_success": on_success, "on_death": on_death}
        target = outbox_cursor(tx)
        if target is None:
            raise OutboxTransactionError(
                "batch() needs tx= (a PostgreSQL connection or cursor in a transaction): the "
                "batch and its children are created in that transaction, or not at all"
            )
        given, handler = target
        return _batch_in(self, given, handler, callbacks, description, shards)

    def envelope(self, payload: Mapping[str, Any]) -> Envelope[Any]:
        """Complete ``payload`` (job_id, correlation_id) and validate it as an envelope."""
        if not isinstance(payload, Mapping):
            raise TypeError(f"payload must be a mapping, got {type(payload).__name__}")
        complete = dict(payload)
        if complete.get("job_id") is None:
            complete["job_id"] = str(uuid7())
        if complete.get("correlation_id") is None:
            complete["correlation_id"] = current_correlation_id.get() or uuid.uuid4().hex
        return parse_envelope(complete, dict, max_bytes=self.settings.max_payload_bytes)

    def send_options(
        self,
        queue: str,
        envelope: Envelope[Any],
        options: PublishOptions,
        ready_at: datetime | None = None,
    ) -> dict[str, Any]:
        """``send_task`` arguments; ``ready_at`` (default now) is when the job is due."""
        if not queue:
            raise ValueError("queue must be a non-empty queue name")
        when = ready_at if ready_at is not None else self._clock()
        headers = outgoing_headers(
            options.headers, published_at=when.timestamp(), publish_time=self._reference.now()
        )
        headers[ATTEMPT_HEADER] = options.attempt
        headers[TENANT_HEADER] = envelope.tenant_id
        send: dict[str, Any] = {
            "args": [envelope.to_message()],
            "task_id": str(envelope.job_id),
            "queue": queue,
            "argsrepr": f"({envelope.redacted()})",
            "kwargsrepr": "{}",
            "headers": headers,
        }
        if options.priority is not None:
            send["priority"] = options.priority
        return send

    def send_now(self, envelope: Envelope[Any], send: Mapping[str, Any]) -> None:
        """Publish the job ``send`` (:meth:`send_options`) describes to the broker now."""
        self.app.send_task(envelope.kind, **send)

    def publish(
        self,
        queue: str,
        payload: Mapping[str, Any],
        opts: Mapping[str, Any] | PublishOptions | None = None,
        *,
        unique_key: str | None = None,
        unique_for: timedelta | None = None,
        unique_mode: str | None = None,
        tx: Any = JOIN,
    ) -> uuid.UUID:
        """Validate and publish now; returns the job id (also the Celery task id).

        ``tx`` (a PostgreSQL connection or cursor in a transaction): the finished message
        is inserted into ``core.outbox`` in that transaction instead, and a relay publishes
        it once it committed; rolled back, the job never existed. Inside a PlatformTask
        handler the default joins the handler's transaction; ``tx=None`` publishes now.

        ``unique_key``/``unique_for``: while a job published with the key waits, another
        publish of it returns that job's id and publishes nothing; ``unique_mode=
        "debounce"`` holds the job ``unique_for`` and keeps only the latest data
        (best effort: :mod:`platform_tasks.limits.unique`).
        """
        options = _options(opts)
        unique = unique_publish(unique_key, unique_for, unique_mode)
        staged = self._to_outbox(tx, queue, payload, options, None, unique)
        if staged is not None:
            return staged.job_id
        if unique is not None:
            return self._unique.publish(queue, payload, options, unique, None)
        envelope = self.envelope(payload)
        self.send_now(envelope, self.send_options(queue, envelope, options))
        return envelope.job_id

    def schedule(
        self,
        queue: str,
        payload: Mapping[str, Any],
        run_at: datetime,
        opts: Mapping[str, Any] | PublishOptions | None = None,
        *,
        unique_key: str | None = None,
        unique_for: timedelta | None = None,
        unique_mode: str | None = None,
        tx: Any = JOIN,
    ) -> uuid.UUID:
        """Validate and store for delivery at ``run_at`` (aware); a past time publishes now.

        ``tx``: as for :meth:`publish`; the relay stores the row in the delay store with
        its due time (RabbitMQ's native delays: publishes it with its countdown).

        On Redis the job waits in the delay store; on RabbitMQ in the broker's delayed
        delivery queues, arriving at ``run_at`` rounded up to the next whole second, or with
        ``PLATFORM_RABBITMQ_DELAYS=delay_store`` in the delay store on the platform's Redis,
        published when due (milliseconds).
        """
        _require_aware(run_at)
        options = _options(opts)
        unique = unique_publish(unique_key, unique_for, unique_mode)
        staged = self._to_outbox(tx, queue, payload, options, run_at, unique)
        if staged is not None:
            return staged.job_id
        if unique is not None:
            return self._unique.publish(queue, payload, options, unique, run_at)
        envelope = self.envelope(payload)
        if run_at <= self._clock():
            self.send_now(envelope, self.send_options(queue, envelope, options))
        else:
            send = self.send_options(queue, envelope, options, run_at)
            self.delays.schedule(envelope.kind, send, run_at)
        return envelope.job_id

    def schedule_many(
        self,
        queue: str,
        items: Iterable[tuple[Mapping[str, Any], datetime]],
        opts: Mapping[str, Any] | PublishOptions | None = None,
        *,
        tx: Any = JOIN,
    ) -> list[uuid.UUID]:
        """Schedule many ``(payload, run_at)`` pairs with one pipelined round trip.

        Every envelope is validated before any entry is stored, so a bad item stores none.
        ``tx``: as for :meth:`publish`; every item becomes an outbox row in that
        transaction (inserted in pages, a few round trips for thousands of items), all of
        them or none, and an item already due is published when relayed.
        """
        options = _options(opts)
        target = outbox_cursor(tx)
        if target is not None:
            cursor, handler = target
            staged = []
            for payload, run_at in items:
                _require_aware(run_at)
                staged.append(self._outbox_row(handler, queue, payload, options, run_at)[1])
            self._writer().insert_many(cursor, staged)
            return [row.job_id for row in staged]
        prepared = []
        for payload, run_at in items:
            _require_aware(run_at)
            prepared.append((self.envelope(payload), run_at))
        self.delays.schedule_many(
            [
                (envelope.kind, self.send_options(queue, envelope, options, run_at), run_at)
                for envelope, run_at in prepared
            ]
        )
        return [envelope.job_id for envelope, _ in prepared]

    def close(self) -> None:
        self.delays.close()
        self._reference.close()
        if self._outbox is not None:
            self._outbox.close()
            self._outbox = None


@contextmanager
def _batch_in(
    port: QueuePort,
    tx: Any,
    handler: HandlerTransaction | None,
    callbacks: Mapping[str, Any],
    description: str,
    shards: int,
) -> Iterator[Batch]:
    """:func:`~platform_tasks.batches.api.open_batch` on a cursor of ``tx`` (checked as an
    outbox publish checks it; one opened here is closed after)."""
    _, is_cursor = check_transaction(tx)
    cur = tx if is_cursor else tx.cursor()
    try:
        with open_batch(
            port, cur, handler, callbacks=callbacks, description=description, shards=shards
        ) as batch:
            yield batch
    finally:
        if not is_cursor:
            cur.close()


def _require_aware(run_at: datetime) -> None:
    if not isinstance(run_at, datetime):
        raise TypeError(f"run_at must be a datetime, got {type(run_at).__name__}")
    if run_at.tzinfo is None or run_at.utcoffset() is None:
        raise NaiveDatetimeError(
            "run_at must be timezone-aware (e.g. datetime.now(UTC) + delay); "
            f"got naive {run_at.isoformat()}"
        )


def require_redis_broker(app: PlatformCelery) -> None:
    """Durable delays need a broker that holds them; refuse another with a clear error.

    Redis (the delay store) and RabbitMQ (native delayed delivery) both hold delays.
    """
    if not broker_holds_delays(app.platform_settings):
        url = app.platform_settings.effective_broker_url
        raise ConfigurationError(
            "PLATFORM_BROKER_URL: durable delays need a Redis or RabbitMQ broker, "
            f"got {url.split('://')[0]}"
        )
