"""The consumer's one dead-letter writer: the row, in a transaction of its own, three ways.

A delivery that gives up writes its :class:`~platform_tasks.dead_letters.dead_letter.
DeadLetter` row in one of three :class:`Mode`\\ s, which differ only in the connection, the
claim and the check for a row already there:

- :attr:`Mode.BESIDE` — a failed handler, while its own transaction still holds the claim
  (so a copy waiting on that claim finds the job dead-lettered, never runs it again): on
  the marks' connection, unless the job's generation already has a pending row;
- :attr:`Mode.CLAIMED` — a crash loop, decided before the handler ran: the job is claimed
  again on the job's connection, the row written and the claim released in one commit;
  another delivery that applied or dead-lettered the job meanwhile leaves nothing to write;
- :attr:`Mode.ALONE` — a poison message (no job to claim): the row and nothing else.

Each write is retried until it succeeds (:func:`~platform_tasks.consumer.servers.
until_done`): the message stays unacked meanwhile. Whatever is raised, the transaction
ends in a commit or a rollback.
"""

from __future__ import annotations

import enum
import json
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from platform_tasks.batches.endings import PortFactory, batch_id_of, count_ending
from platform_tasks.consumer import idempotency
from platform_tasks.consumer.delivery import Delivery
from platform_tasks.consumer.retry import POISON
from platform_tasks.consumer.servers import until_done
from platform_tasks.consumer.transaction import JobTransaction
from platform_tasks.consumer.verdicts import Duplicate
from platform_tasks.dead_letters.dead_letter import DeadLetter
from platform_tasks.dead_letters.records import error_type_name, pending_dead_letter, raw_payload
from platform_tasks.envelope import Envelope
from platform_tasks.errors import EnvelopeError
from platform_tasks.postgres.database import Database


class Mode(enum.Enum):
    """How a dead letter is written (see the module)."""

    BESIDE = "beside"
    CLAIMED = "claimed"
    ALONE = "alone"


Written = int | Duplicate | None
"""The new row's id; a :class:`Duplicate` naming the row already there; ``None`` when
another delivery applied the job meanwhile (:attr:`Mode.CLAIMED` only)."""


class DeadLetterWriter:
    """Writes dead letters on the job's connection or the marks' (see :class:`Mode`)."""

    def __init__(
        self,
        database: Database,
        beside: Database,
        sleep: Callable[[float], None] | None = None,
        *,
        port: PortFactory | None = None,
    ) -> None:
        self.database = database
        self.beside = beside
        self._sleep = sleep
        self._port = port

    def write(self, record: DeadLetter, mode: Mode, consumer: str = "") -> Written:
        """Write ``record`` the ``mode`` way, retried until PostgreSQL takes it."""
        return until_done(
            lambda: self._write_once(record, mode, consumer),
            "write the dead letter",
            self._sleep or time.sleep,
        )

    def _write_once(self, record: DeadLetter, mode: Mode, consumer: str) -> Written:
        database = self.beside if mode is Mode.BESIDE else self.database
        with _own_transaction(database) as tx:
            if mode is Mode.CLAIMED:
                assert record.job_id is not None
                if not tx.claim(record.job_id, consumer):
                    return None
            else:
                tx.begin()
            if mode is not Mode.ALONE:
                assert record.job_id is not None
                pending = pending_dead_letter(tx.cursor, record.job_id, record.kind)
                if pending is not None:
                    return Duplicate("dead_lettered", pending)
            dead_letter_id = record.write(tx.cursor)
            self._count_batch_ending(tx.cursor, record)
            if mode is Mode.CLAIMED:
                assert record.job_id is not None
                idempotency.release(tx.cursor, record.job_id, consumer)
            problem = tx.commit()
            if problem is not None:
                raise problem
            return dead_letter_id

    def _count_batch_ending(self, cur: Any, record: DeadLetter) -> None:
        """A batch child's dead letter ends it, counted in the dead letter's transaction."""
        batch = batch_id_of(record.headers)
        if batch is None or record.job_id is None:
            return
        count_ending(cur, record.job_id, "dead_lettered", self._port or _no_port, batch)


def _no_port() -> Any:
    raise RuntimeError("a dead letter writer without a queue port cannot fire batch callbacks")


@contextmanager
def _own_transaction(database: Database) -> Iterator[JobTransaction]:
    """A transaction on ``database`` that is rolled back unless the body committed it."""
    tx = JobTransaction(database)
    try:
        yield tx
    finally:
        tx.end()


def job_record(
    envelope: Envelope[Any],
    delivery: Delivery,
    *,
    attempts: int,
    reason: str,
    last_error: str,
    error_type: str,
) -> DeadLetter:
    """The dead letter of a valid job: the payload as received, its headers for replay."""
    return DeadLetter(
        job_id=envelope.job_id,
        queue=delivery.queue,
        kind=envelope.kind,
        tenant_id=envelope.tenant_id,
        correlation_id=envelope.correlation_id,
        payload=(
            _json_safe(delivery.payload) if delivery.payload is not None else envelope.to_message()
        ),
        attempts=attempts,
        last_error=last_error,
        error_type=error_type,
        reason=reason,
        headers=dict(delivery.headers) if delivery.headers else None,
    )


def poison_record(
    delivery: Delivery, args: tuple[Any, ...], kwargs: Mapping[str, Any], exc: EnvelopeError
) -> DeadLetter:
    """The dead letter of a message that is no valid envelope: what it could read of it."""
    payload: Any = args[0] if len(args) == 1 and not kwargs else None
    if payload is None:
        payload = {"args": list(args), "kwargs": dict(kwargs)}
    readable = payload if isinstance(payload, Mapping) else {}
    if not isinstance(payload, Mapping):
        payload = raw_payload(json.dumps(payload, default=repr), "application/json", {})
    return DeadLetter(
        job_id=_uuid_or_none(readable.get("job_id")),
        queue=delivery.queue,
        kind=_str_or_none(readable.get("kind")) or delivery.consumer,
        tenant_id=_str_or_none(readable.get("tenant_id")),
        correlation_id=_str_or_none(readable.get("correlation_id")),
        payload=_json_safe(dict(payload)),
        attempts=1,
        last_error=str(exc),
        error_type=error_type_name(exc),
        reason=POISON,
        headers=dict(delivery.headers) if delivery.headers else None,
    )


def _uuid_or_none(value: Any) -> uuid.UUID | None:
    try:
        return uuid.UUID(str(value)) if value is not None else None
    except (TypeError, ValueError):
        return None


def _str_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _json_safe(value: Any) -> Any:
    return json.loads(json.dumps(value, default=repr))
