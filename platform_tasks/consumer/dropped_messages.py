"""A worker Consumer that dead-letters the messages stock Celery would drop.

Stock Celery logs and rejects (or acks) a message it cannot turn into a task: an unknown
task name, a body that does not decode, a content type outside ``accept_content``, a
message without the headers of Celery's protocol. With the Redis transport a rejected
message is gone. Here each one is written to ``core.dead_letters`` with its raw body,
content type and headers (``job_id`` when it can be read, else null), the pipeline's
hooks log, alert and count it, and only then is the message acked. When PostgreSQL does
not answer, the message is put back on its queue instead (with an alert) and comes round
again. Two more cases come from the platform transport, by header: an item that was no
readable broker message at all (``platform_unreadable``, wrapped by the fetch script), and
an unacked message no queue is bound for any more (``platform_unroutable``, handed over by
the visibility sweep); neither is ever run.

The repository makes every record storable (NUL characters anywhere written out); if a
write still fails for another reason, the record is written once more in its barest
form (the whole message in base64). The callback never raises: an error escaping it
would stop the worker, and the message would stop the next one.

Installed through Celery's ``worker_consumer`` setting, the public way to replace the
consumer blueprint; the overridden methods are the consumer's documented callbacks.
"""

from __future__ import annotations

import base64
import json
import logging
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from celery.worker.consumer import Consumer

from platform_tasks.batches.endings import batch_id_of, count_ending
from platform_tasks.consumer.hooks import Hooks, hooks_of
from platform_tasks.consumer.servers import INFRASTRUCTURE_ERRORS
from platform_tasks.dead_letters.dead_letter import DeadLetter
from platform_tasks.dead_letters.records import (
    describe_error,
    error_type_name,
    raw_payload,
)
from platform_tasks.errors import ConfigurationError
from platform_tasks.headers import UNREADABLE_HEADER, UNROUTABLE_HEADER
from platform_tasks.observability.alerts import send_alert
from platform_tasks.postgres.database import Database, require_database_url

if TYPE_CHECKING:
    from platform_tasks.kernel import PlatformCelery
    from platform_tasks.publishing.queue_port import QueuePort

logger = logging.getLogger(__name__)

CONSUMER_PATH = "platform_tasks.consumer.dropped_messages:PlatformConsumer"

UNKNOWN_TASK = "unknown_task"
UNDECODABLE = "undecodable_body"
INVALID_MESSAGE = "invalid_message"
UNKNOWN_FORMAT = "missing_celery_headers"
UNREADABLE = "unreadable_message"
UNROUTABLE = "unroutable"

WRITE_BUDGET_SECONDS = 10.0
"""How long the consumer waits for PostgreSQL before putting the message back."""


class PlatformConsumer(Consumer):
    """Celery's consumer, with every "drop this message" path ending in a dead letter."""

    _platform_db: Database | None = None
    _platform_port: QueuePort | None = None

    def on_decode_error(self, message: Any, exc: Exception) -> None:
        self._dead_letter(message, UNDECODABLE, exc)

    def on_unknown_message(self, body: Any, message: Any) -> None:
        self._dead_letter(message, UNKNOWN_FORMAT, None, body=body)

    def on_unknown_task(self, body: Any, message: Any, exc: Exception) -> None:
        self._dead_letter(message, UNKNOWN_TASK, exc, body=body)

    def on_invalid_task(self, body: Any, message: Any, exc: Exception) -> None:
        self._dead_letter(message, INVALID_MESSAGE, exc, body=body)

    def create_task_handler(self, *args: Any, **kwargs: Any) -> Callable[[Any], Any]:
        """Celery's handler, plus a last net for messages that break it (e.g. no ``id``)."""
        handler: Callable[[Any], Any] = super().create_task_handler(*args, **kwargs)

        def on_task_received(message: Any) -> Any:
            headers = _headers(message)
            if UNREADABLE_HEADER in headers:
                return self._dead_letter(message, UNREADABLE, None)
            if UNROUTABLE_HEADER in headers:  # a task message: never run it from here
                return self._dead_letter(message, UNROUTABLE, None)
            try:
                return handler(message)
            except Exception as exc:
                if getattr(message, "acknowledged", False):
                    raise
                return self._dead_letter(message, INVALID_MESSAGE, exc)

        return on_task_received

    # -- writing ---------------------------------------------------------------------------

    def _port(self) -> QueuePort:
        """The queue port a batch's callbacks are published with (made when one fires)."""
        if self._platform_port is None:
            from platform_tasks.publishing.queue_port import QueuePort

            self._platform_port = QueuePort(self.app)
        return self._platform_port

    def _database(self) -> Database:
        if self._platform_db is None:
            self._platform_db = Database(require_database_url(self.app.platform_settings))
        return self._platform_db

    def _dead_letter(
        self, message: Any, reason: str, exc: BaseException | None, *, body: Any = None
    ) -> None:
        try:
            self._dead_letter_or_requeue(message, reason, exc)
        except Exception:  # never out of the consumer callback: that stops the worker
            logger.exception(
                "a dropped message could not be handled; putting it back",
                extra={"event": "consumer.dropped_message_requeued", "reason": reason},
            )
            try:
                message.reject(requeue=True)
            except Exception:
                logger.exception(
                    "could not put a dropped message back",
                    extra={"event": "consumer.dropped_message_not_requeued"},
                )

    def _dead_letter_or_requeue(self, message: Any, reason: str, exc: BaseException | None) -> None:
        if reason == UNREADABLE:
            record = unreadable_record(message)
        elif reason == UNROUTABLE:
            record = unroutable_record(message)
        else:
            record = dropped_message_record(message, reason, exc)
        deadline = time.monotonic() + WRITE_BUDGET_SECONDS
        delay = 0.25
        while True:
            try:
                dead_letter_id = self._write_any_form(message, record)
                break
            except Exception as err:
                if isinstance(err, ConfigurationError) or time.monotonic() >= deadline:
                    logger.error(
                        "cannot dead-letter a dropped message (%s); putting it back",
                        type(err).__name__,
                        extra={"event": "consumer.dropped_message_requeued", "reason": reason},
                    )
                    message.reject(requeue=True)
                    _alert_requeued(record, err)
                    return
                time.sleep(delay)
                delay = min(delay * 2, 2.0)
        message.ack()
        logger.error(
            "message Celery would drop was dead-lettered (%s) as row %s",
            reason,
            dead_letter_id,
            extra={
                "event": "consumer.dropped_message_dead_lettered",
                "reason": reason,
                "dead_letter_id": dead_letter_id,
                "queue": record.queue,
                "kind": record.kind,
                "job_id": str(record.job_id) if record.job_id else None,
            },
        )
        Hooks(hooks_of(self.app)).emit("on_dead_lettered", record, dead_letter_id, exc)

    def _write_any_form(self, message: Any, record: DeadLetter) -> int:
        """Write the record; if PostgreSQL refuses it (not an outage), its barest form."""
        batch = batch_id_of(_headers(message))
        try:
            return self._write(record, batch)
        except Exception as err:
            if isinstance(err, (ConfigurationError, *INFRASTRUCTURE_ERRORS)):
                raise
            logger.warning(
                "dead letter of a dropped message refused (%s); storing it in base64",
                type(err).__name__,
                extra={"event": "consumer.dropped_message_stored_raw"},
            )
            return self._write(bare_record(message, record), batch)

    def _write(self, record: DeadLetter, batch: uuid.UUID | None = None) -> int:
        """Write the row; a batch child's message also ends the child, in that transaction."""
        database = self._database()
        try:
            conn = database.connection()
            with conn.cursor() as cur:
                dead_letter_id = record.write(cur)
                if batch is not None and record.job_id is not None:
                    count_ending(cur, record.job_id, "dead_lettered", self._port, batch)
            conn.commit()
            return dead_letter_id
        except BaseException:
            database.discard()  # rolled back with it; the next write starts clean
            raise


def unreadable_record(message: Any) -> DeadLetter:
    """The dead letter of an item the transport wrapped: the item itself, as it was sent.

    The wrapper's body is the item's bytes. When the item was JSON (a message of another
    client, without kombu's delivery tag), its own ``content-type`` and ``headers`` are
    kept; otherwise they are unknown.
    """
    body = getattr(message, "body", b"")
    raw = body if isinstance(body, bytes) else str(body).encode("utf-8", "surrogateescape")
    why = str(_headers(message).get(UNREADABLE_HEADER))
    try:
        original = json.loads(raw)
    except (UnicodeDecodeError, ValueError):
        original = None
    content_type = headers = None
    if isinstance(original, dict):
        content_type = _str(original.get("content-type"))
        found = original.get("headers")
        headers = found if isinstance(found, dict) else None
    info = getattr(message, "delivery_info", None) or {}
    queue = info.get("routing_key") or None
    readable_headers = headers or {}
    return DeadLetter(
        job_id=_uuid(readable_headers.get("id")),
        queue=queue,
        kind=_str(readable_headers.get("task")),
        tenant_id=None,
        correlation_id=None,
        payload=raw_payload(raw, content_type, headers or {}),
        attempts=0,
        last_error=(
            f"{UNREADABLE}: a message on queue {queue} is not a readable broker "
            f"message ({why}); its bytes are kept in payload.raw"
        ),
        error_type=UNREADABLE,
        reason=UNREADABLE,
    )


def unroutable_record(message: Any) -> DeadLetter:
    """The dead letter of an unacked message whose queue no longer exists."""
    headers = _headers(message)
    route = headers.pop(UNROUTABLE_HEADER, None) or {}
    exchange = route.get("exchange") if isinstance(route, dict) else None
    routing_key = route.get("routing_key") if isinstance(route, dict) else None
    envelope = _readable_envelope(message)
    kind = headers.get("task") if isinstance(headers.get("task"), str) else None
    return DeadLetter(
        job_id=_uuid(headers.get("id")) or _uuid(envelope.get("job_id")),
        queue=_str(routing_key),
        kind=kind or _str(envelope.get("kind")),
        tenant_id=_str(envelope.get("tenant_id")),
        correlation_id=_str(envelope.get("correlation_id")),
        payload=raw_payload(
            getattr(message, "body", b""), getattr(message, "content_type", None), headers
        ),
        attempts=0,
        last_error=(
            f"{UNROUTABLE}: the message was taken and never acknowledged, and no "
            f"queue is bound for exchange {exchange!r} with routing key "
            f"{routing_key!r} any more (queue deleted?), so it cannot go back"
        ),
        error_type=UNROUTABLE,
        reason=UNROUTABLE,
    )


def _alert_requeued(record: DeadLetter, err: BaseException) -> None:
    """Tell operators a message waits on its queue because its dead letter cannot be written."""
    send_alert(
        f"a message Celery would drop ({record.reason}) on queue {record.queue or '<unknown>'} "
        f"cannot be dead-lettered ({type(err).__name__}); it stays on its queue and is "
        "tried again",
        tags={"queue": record.queue, "reason": record.reason},
        fingerprint=["platform-dropped-message-requeued", record.queue or "", record.reason],
        level="warning",
    )


def bare_record(message: Any, record: DeadLetter) -> DeadLetter:
    """The least a dead letter can hold: the raw body and headers, all in base64."""
    body = getattr(message, "body", b"")
    raw = body if isinstance(body, bytes) else str(body).encode("utf-8", "backslashreplace")
    headers = json.dumps(_headers(message), default=repr).encode("utf-8")
    return DeadLetter(
        job_id=record.job_id,
        queue=None,
        kind=None,
        tenant_id=None,
        correlation_id=None,
        payload={
            "raw": base64.b64encode(raw).decode("ascii"),
            "raw_encoding": "base64",
            "content_type": None,
            "headers": {"base64": base64.b64encode(headers).decode("ascii")},
        },
        attempts=0,
        last_error=f"{record.reason}: the full record could not be stored",
        error_type=None,
        reason=record.reason,
    )


def dropped_message_record(message: Any, reason: str, exc: BaseException | None) -> DeadLetter:
    """What can be read of a message Celery cannot run, as a dead-letter record."""
    headers = _headers(message)
    info = getattr(message, "delivery_info", None) or {}
    payload = raw_payload(
        getattr(message, "body", b""), getattr(message, "content_type", None), headers
    )
    envelope = _readable_envelope(message)
    job_id = _uuid(headers.get("id")) or _uuid(envelope.get("job_id"))
    kind = headers.get("task") if isinstance(headers.get("task"), str) else None
    if exc is None:
        last_error = "message has no Celery task headers (not Celery protocol 1 or 2)"
        error_type = reason
    else:
        last_error = describe_error(exc)
        error_type = error_type_name(exc)
    return DeadLetter(
        job_id=job_id,
        queue=info.get("routing_key") or None,
        kind=kind or _str(envelope.get("kind")),
        tenant_id=_str(envelope.get("tenant_id")),
        correlation_id=_str(envelope.get("correlation_id")),
        payload=payload,
        attempts=0,
        last_error=f"{reason}: {last_error}",
        error_type=error_type,
        reason=reason,
    )


def _headers(message: Any) -> dict[str, Any]:
    headers = getattr(message, "headers", None)
    return dict(headers) if isinstance(headers, dict) else {}


def _readable_envelope(message: Any) -> dict[str, Any]:
    """The envelope inside a Celery protocol-2 JSON body, or ``{}`` when unreadable."""
    body = getattr(message, "body", None)
    try:
        text = body.decode("utf-8") if isinstance(body, bytes) else body
        decoded = json.loads(text) if isinstance(text, str) else None
    except (UnicodeDecodeError, ValueError):
        return {}
    if isinstance(decoded, list) and decoded and isinstance(decoded[0], list) and decoded[0]:
        first = decoded[0][0]
        return first if isinstance(first, dict) else {}
    return {}


def _uuid(value: Any) -> uuid.UUID | None:
    try:
        return uuid.UUID(str(value)) if value is not None else None
    except ValueError:
        return None


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def install(app: PlatformCelery) -> None:
    """Make :class:`PlatformConsumer` the worker's consumer unless the caller chose one."""
    current = app.conf.get("worker_consumer")
    if current in (None, "celery.worker.consumer:Consumer"):
        app.conf.worker_consumer = CONSUMER_PATH
