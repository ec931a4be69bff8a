"""The queue port: the one way application code hands work to the platform.

``publish`` and ``schedule`` complete and validate the envelope before anything reaches
the broker, make the Celery task id equal the job id (so Flower and logs find a job by
its id), and keep ``data`` out of what Flower and logs show.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import redis
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic_core import PydanticCustomError

from platform_tasks.brokers.selection import broker_holds_delays, broker_kind, delays_in_store
from platform_tasks.envelope import Envelope, parse_envelope, uuid7, validation_errors
from platform_tasks.errors import ConfigurationError, NaiveDatetimeError
from platform_tasks.keys import TENANT_HEADER, delay_keys, rabbitmq_delay_keys
from platform_tasks.limits.publish import publish_unique, unique_locks_of
from platform_tasks.limits.unique import UniqueLocks, UniquePublish, unique_publish
from platform_tasks.observability.context import current_correlation_id
from platform_tasks.observability.reserved_headers import ATTEMPT_HEADER as ATTEMPT_HEADER
from platform_tasks.observability.reserved_headers import reserved_header
from platform_tasks.observability.trace_context import outgoing_headers
from platform_tasks.publishing.amqp_wire import AmqpMessageBuilder
from platform_tasks.publishing.delay_store import DelayStore
from platform_tasks.publishing.native_delays import NativeDelays
from platform_tasks.publishing.outbox import JOIN, OutboxWriter, outbox_cursor
from platform_tasks.publishing.reference_clock import ReferenceClock
from platform_tasks.publishing.wire import WireBuilder

if TYPE_CHECKING:
    from platform_tasks.app import PlatformCelery


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
    """Publish now or schedule for later, with the envelope validated first."""

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
        self._wire = WireBuilder(app)
        self._owns_client = redis_client is None
        self._redis = redis_client
        self._store: DelayStore | None = None
        self._native: NativeDelays | None = None
        self._unique_locks: UniqueLocks | None = None
        self._amqp_messages: AmqpMessageBuilder | None = None
        self._outbox: OutboxWriter | None = None
        self._store_kind = delays_in_store(self.settings)
        if self._store_kind == "rabbitmq":
            self._amqp_messages = AmqpMessageBuilder(app)
        elif broker_kind(self.settings.effective_broker_url) == "amqp":
            self._native = NativeDelays(app)

    def _delay_store(self) -> DelayStore:
        """The store on the broker's Redis, or on the platform's Redis for RabbitMQ."""
        if self._store is None:
            if self._store_kind == "rabbitmq":
                from platform_tasks.brokers.redis_client import build_redis

                if self._redis is None:
                    self._redis = build_redis(self.settings)
                self._store = DelayStore(self._redis, rabbitmq_delay_keys(self.settings.profile))
            else:
                if self._redis is None:
                    self._redis = redis.Redis.from_url(self.settings.effective_broker_url)
                self._store = DelayStore(self._redis, delay_keys(self.settings.profile))
        return self._store

    def _store_amqp(
        self, kind: str, send: dict[str, Any], run_at: datetime
    ) -> tuple[str, int, str]:
        """An entry of the RabbitMQ delay store: a fresh id, the due time, the message."""
        assert self._amqp_messages is not None
        message = self._amqp_messages.build(kind, **send)
        return uuid.uuid4().hex, int(run_at.timestamp() * 1000), message.encode()

    def _to_outbox(
        self,
        tx: Any,
        queue: str,
        payload: Mapping[str, Any],
        options: PublishOptions,
        run_at: datetime | None,
        unique: UniquePublish | None = None,
    ) -> uuid.UUID | None:
        """Insert the finished message into ``core.outbox`` in ``tx`` (or the running
        handler's transaction) instead of sending it; ``None`` when the publish goes to
        the broker at once (see :mod:`~platform_tasks.publishing.outbox`). A unique
        publish is stored as its request: the relay makes it once the row committed."""
        target = outbox_cursor(tx)
        if target is None:
            return None
        cursor, handler = target
        if handler is not None and (not isinstance(payload, Mapping) or not payload.get("job_id")):
            payload = {**payload, "job_id": str(handler.child_job_id())}
        envelope = self.envelope(payload)
        if run_at is not None and run_at <= self._clock():
            run_at = None
        send = self._send_options(queue, envelope, options, run_at)
        due_ms = None if run_at is None else int(run_at.timestamp() * 1000)
        if self._outbox is None:
            self._outbox = OutboxWriter(self.app)
        if unique is not None:
            unique_locks_of(self)  # refused now where there is no delay store
            row = self._outbox.unique_row(queue, envelope, options, unique, due_ms)
            self._outbox.insert(cursor, row)
            return envelope.job_id
        now_ms = int(self._clock().timestamp() * 1000)
        self._outbox.insert(cursor, self._outbox.build(envelope.kind, send, due_ms, now_ms))
        return envelope.job_id

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

    def _send_options(
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
            return staged
        if unique is not None:
            return publish_unique(self, queue, payload, options, unique, None)
        envelope = self.envelope(payload)
        self.app.send_task(envelope.kind, **self._send_options(queue, envelope, options))
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
            return staged
        if unique is not None:
            return publish_unique(self, queue, payload, options, unique, run_at)
        envelope = self.envelope(payload)
        now = self._clock()
        if run_at <= now:
            self.app.send_task(envelope.kind, **self._send_options(queue, envelope, options))
            return envelope.job_id
        if self._native is not None:
            send = self._send_options(queue, envelope, options, run_at)
            self._native.send(envelope.kind, run_at - now, **send)
            return envelope.job_id
        if self._amqp_messages is not None:
            send = self._send_options(queue, envelope, options, run_at)
            self._delay_store().add_encoded(*self._store_amqp(envelope.kind, send, run_at))
            return envelope.job_id
        message = self._wire.build(
            envelope.kind, **self._send_options(queue, envelope, options, run_at)
        )
        due_ms = int(run_at.timestamp() * 1000)
        self._delay_store().add(message.delivery_tag, due_ms, message.list_key, message.wire)
        return envelope.job_id

    def schedule_many(
        self,
        queue: str,
        items: Iterable[tuple[Mapping[str, Any], datetime]],
        opts: Mapping[str, Any] | PublishOptions | None = None,
    ) -> list[uuid.UUID]:
        """Schedule many ``(payload, run_at)`` pairs with one pipelined round trip.

        Every envelope is validated before any entry is stored, so a bad item stores none.
        """
        options = _options(opts)
        prepared = []
        for payload, run_at in items:
            _require_aware(run_at)
            prepared.append((self.envelope(payload), run_at))
        if self._native is not None:
            for envelope, run_at in prepared:
                send = self._send_options(queue, envelope, options, run_at)
                delay = run_at - self._clock()
                if delay.total_seconds() <= 0:
                    self.app.send_task(envelope.kind, **send)
                else:
                    self._native.send(envelope.kind, delay, **send)
            return [envelope.job_id for envelope, _ in prepared]
        if self._amqp_messages is not None:
            encoded = [
                self._store_amqp(
                    envelope.kind, self._send_options(queue, envelope, options, at), at
                )
                for envelope, at in prepared
            ]
            self._delay_store().add_many_encoded(encoded)
            return [envelope.job_id for envelope, _ in prepared]
        entries = []
        for envelope, run_at in prepared:
            message = self._wire.build(
                envelope.kind, **self._send_options(queue, envelope, options, run_at)
            )
            due_ms = int(run_at.timestamp() * 1000)
            entries.append((message.delivery_tag, due_ms, message.list_key, message.wire))
        self._delay_store().add_many(entries)
        return [envelope.job_id for envelope, _ in prepared]

    def close(self) -> None:
        self._wire.close()
        self._reference.close()
        if self._amqp_messages is not None:
            self._amqp_messages.close()
        if self._outbox is not None:
            self._outbox.close()
            self._outbox = None
        if self._owns_client and self._redis is not None:
            self._redis.close()
            self._redis = None
            self._store = None
            self._unique_locks = None


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
