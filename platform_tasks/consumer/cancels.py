"""The consumer's side of a cancel: do not run a job a cancel rule matches.

:class:`CancelCheck` keeps the rules of ``core.cancel_rules`` in memory and reads them
again, through the job's own transaction, when they are older than
:data:`RULES_MAX_AGE_SECONDS` — a query on a table of a few rows at most four times a
second per process, instead of one per job. :func:`~platform_tasks.operations.cancel.cancel_jobs`
waits longer than that age before it returns, so once it has returned no consumer starts
a job the cancel matches.

A matched job gets its accounting row (``core.dead_letters``, status ``discarded``,
reason ``cancelled``) in the job's transaction, with its idempotency claim: a redelivery
of it is a duplicate, and a job already accounted for by the delay-store sweep gets no
second row (a unique index; ``ON CONFLICT DO NOTHING``).
"""

from __future__ import annotations

import contextvars
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

import psycopg2.errors
from psycopg2.extensions import cursor as Cursor
from psycopg2.extras import Json

from platform_tasks.batches.endings import PortFactory, count_ending
from platform_tasks.observability.trace_context import publish_time_of

if TYPE_CHECKING:
    from platform_tasks.consumer.verdicts import Duplicate
    from platform_tasks.publishing.queue_port import QueuePort

__all__ = [
    "RULES_MAX_AGE_SECONDS",
    "CancelCheck",
    "Rule",
    "record_cancelled",
    "running_job",
]

logger = logging.getLogger(__name__)

RULES_MAX_AGE_SECONDS = 0.25
"""Rules older than this are read again before a job is let run."""

RULES_QUERY = (
    "SELECT operation_id, tenant_id, kind, queue, cutoff, expires_at "
    "FROM core.cancel_rules WHERE expires_at > now()"
)

INSERT_CANCELLED = """
INSERT INTO core.dead_letters
    (job_id, queue, kind, tenant_id, payload, attempts, last_error, error_type, reason,
     correlation_id, status, discard_reason, discarded_at)
VALUES (%(job_id)s, %(queue)s, %(kind)s, %(tenant_id)s, %(payload)s, %(attempts)s,
        %(last_error)s, 'Cancelled', 'cancelled', %(correlation_id)s, 'discarded',
        %(discard_reason)s, now())
ON CONFLICT (job_id) WHERE reason = 'cancelled' DO NOTHING
RETURNING id
"""

COUNT_DONE = (
    "UPDATE core.operations SET done = done + %(n)s, matched = matched + %(n)s WHERE id = %(id)s"
)


@dataclass(frozen=True)
class Rule:
    operation_id: int
    filter: JobFilter
    cutoff: datetime
    expires_at: datetime

    def matches(
        self,
        *,
        published: float | None,
        tenant_id: str | None,
        kind: str | None,
        queue: str | None,
    ) -> bool:
        """The job is one this rule means: the filter matches and it was published at or
        before the cutoff. ``published`` is the Unix time the message carries
        (:data:`~platform_tasks.observability.trace_context.PUBLISH_TIME_HEADER`); a
        message without one (published before the header existed) counts as published
        before. Never raises: a rule check must not turn into a wait."""
        if not self.filter.matches(tenant_id=tenant_id, kind=kind, queue=queue):
            return False
        return published is None or published <= self.cutoff.timestamp()


def read_rules(cur: Cursor) -> list[Rule]:
    cur.execute(RULES_QUERY)
    return [
        Rule(int(op), JobFilter(tenant_id=tenant, kind=kind, queue=queue), cutoff, expires)
        for op, tenant, kind, queue, cutoff, expires in cur.fetchall()
    ]


class CancelCheck:
    """The cancel rules one consumer process acts on, kept fresh by the jobs' transactions."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._rules: list[Rule] = []
        self._read_at: float | None = None
        self._lock = threading.Lock()
        self._warned = False

    def rules(self, cur: Cursor) -> list[Rule]:
        """The rules, read again through ``cur`` when older than the max age."""
        started = self.clock()  # before the read: the rules are at least this fresh
        with self._lock:
            fresh = self._read_at is not None and started - self._read_at < RULES_MAX_AGE_SECONDS
            if fresh:
                return self._rules
        rules = self._read_guarded(cur)
        with self._lock:
            self._rules, self._read_at = rules, started
        return rules

    def _read_guarded(self, cur: Cursor) -> list[Rule]:
        """The rules, read in a savepoint of the job's transaction: a database not yet
        migrated to ``0006_operations`` (no ``core.cancel_rules``) has no rules, and its
        error must not abort the transaction that holds the job's claim."""
        cur.execute("SAVEPOINT platform_cancel_rules")
        try:
            rules = read_rules(cur)
        except psycopg2.errors.UndefinedTable:
            cur.execute("ROLLBACK TO SAVEPOINT platform_cancel_rules")
            if not self._warned:
                self._warned = True
                logger.warning(
                    "core.cancel_rules does not exist: run platform-tasks migrate; "
                    "no cancel is checked until then",
                    extra={"event": "operations.cancel_rules_missing"},
                )
            rules = []
        except (psycopg2.OperationalError, psycopg2.InterfaceError):
            raise  # an outage: the delivery waits for the database
        except Exception as exc:
            # not an outage (a bad rule row, a bug): waiting would hold this process for
            # the rule's lifetime, so act on the rules last read and say so loudly
            if isinstance(exc, psycopg2.Error):
                cur.execute("ROLLBACK TO SAVEPOINT platform_cancel_rules")
            logger.error(
                "could not read the cancel rules (%s); acting on the rules last read",
                type(exc).__name__,
                exc_info=True,
                extra={"event": "operations.cancel_rules_unreadable"},
            )
            rules = self.cached()
        cur.execute("RELEASE SAVEPOINT platform_cancel_rules")
        return rules

    def cached(self) -> list[Rule]:
        with self._lock:
            return list(self._rules)

    def matching(
        self,
        cur: Cursor,
        *,
        published: float | None,
        tenant_id: str | None,
        kind: str | None,
        queue: str | None,
    ) -> Rule | None:
        for rule in self.rules(cur):
            if rule.matches(published=published, tenant_id=tenant_id, kind=kind, queue=queue):
                return rule
        return None


def record_cancelled(
    cur: Cursor,
    rule_id: int,
    *,
    job_id: Any,
    queue: str | None,
    kind: str | None,
    tenant_id: str | None,
    correlation_id: str | None,
    payload: Any,
    attempts: int,
    where: str,
    port: PortFactory | None = None,
) -> int | None:
    """Write the accounting row of a cancelled job (the caller commits); its id, or
    ``None`` when the job already had one. Counted in the operation's ``done`` and, for
    a batch's child, as its ending (``port`` publishes the callbacks that makes due)."""
    cur.execute(
        INSERT_CANCELLED,
        {
            "job_id": str(job_id) if job_id is not None else None,
            "queue": queue,
            "kind": kind,
            "tenant_id": tenant_id,
            "payload": Json(payload),
            "attempts": attempts,
            "last_error": f"cancelled by operation {rule_id} while {where}",
            "correlation_id": correlation_id,
            "discard_reason": f"cancelled by operation {rule_id}",
        },
    )
    row = cur.fetchone()
    if row is None:
        return None
    cur.execute(COUNT_DONE, {"n": 1, "id": rule_id})
    if job_id is not None:
        count_ending(cur, str(job_id), "cancelled", port or _no_port)
    return int(row[0])


def _no_port() -> QueuePort:
    raise RuntimeError("a cancel recorded without a queue port cannot fire batch callbacks")


@dataclass(frozen=True)
class RunningJob:
    """What :func:`~platform_tasks.operations.cancel.is_cancelled` asks about the job."""

    job_id: Any
    tenant_id: str | None
    kind: str | None
    queue: str | None
    published: float | None
    check: CancelCheck
    cursor: Cursor


current_job: contextvars.ContextVar[RunningJob | None] = contextvars.ContextVar(
    "platform_operations_current_job", default=None
)


@contextmanager
def running_job(check: CancelCheck, cursor: Cursor, envelope: Any, delivery: Any) -> Iterator[None]:
    """Around a handler's run: lets it ask :func:`is_cancelled` about itself."""
    job = RunningJob(
        envelope.job_id,
        envelope.tenant_id,
        envelope.kind,
        delivery.queue,
        publish_time_of(delivery.headers),
        check,
        cursor,
    )
    token = current_job.set(job)
    try:
        yield
    finally:
        current_job.reset(token)


def cancel_delivery(
    check: CancelCheck, tx: Any, envelope: Any, delivery: Any, port: PortFactory | None = None
) -> Duplicate | None:
    """Before the handler runs (the job claimed in ``tx``): a ``Duplicate("cancelled")``
    verdict, with the accounting row and the claim committed, when a cancel rule matches
    the job; ``None`` to run it. An error propagates (the delivery waits)."""
    from platform_tasks.consumer.verdicts import Duplicate
    from platform_tasks.errors import PlatformError

    queue = delivery.queue
    rule = check.matching(
        tx.cursor,
        published=publish_time_of(delivery.headers),
        tenant_id=envelope.tenant_id,
        kind=envelope.kind,
        queue=queue,
    )
    if rule is None:
        return None
    payload = delivery.payload if isinstance(delivery.payload, dict) else envelope.to_message()
    row = record_cancelled(
        tx.cursor,
        rule.operation_id,
        job_id=envelope.job_id,
        queue=queue,
        kind=envelope.kind,
        tenant_id=envelope.tenant_id,
        correlation_id=envelope.correlation_id,
        payload=payload,
        attempts=_attempts_spent(delivery.header_attempt),
        where="queued",
        port=port,
    )
    problem = tx.commit()
    if problem is not None:
        raise PlatformError(f"could not record the cancel of job {envelope.job_id}: {problem}")
    logger.info(
        "job %s not run: cancelled by operation %s",
        envelope.job_id,
        rule.operation_id,
        extra={
            "event": "operations.job_cancelled",
            "job_id": str(envelope.job_id),
            "operation_id": rule.operation_id,
            "queue": queue,
            "kind": envelope.kind,
            "tenant_id": envelope.tenant_id,
            "dead_letter_id": row,
        },
    )
    return Duplicate("cancelled", row)


def _attempts_spent(header_attempt: Any) -> int:
    try:
        return max(0, int(header_attempt) - 1)
    except (TypeError, ValueError):
        return 0


def filter_text(value: Any, name: str) -> str | None:
    """A filter field's text: ``None``, or a non-empty string (else a ValueError naming it)."""
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"filter field {name!r} must be a non-empty string, got {value!r}")
    return value


@dataclass(frozen=True)
class JobFilter:
    """Which waiting jobs a cancel means: at least one of tenant, kind, queue."""

    tenant_id: str | None = None
    kind: str | None = None
    queue: str | None = None

    def __post_init__(self) -> None:
        for name in ("tenant_id", "kind", "queue"):
            filter_text(getattr(self, name), name)
        if self.tenant_id is None and self.kind is None and self.queue is None:
            raise ValueError("a cancel needs at least one of tenant_id, kind, queue")

    def matches(self, *, tenant_id: str | None, kind: str | None, queue: str | None) -> bool:
        """Whether a job with these attributes is one this filter means."""
        return (
            (self.tenant_id is None or self.tenant_id == tenant_id)
            and (self.kind is None or self.kind == kind)
            and (self.queue is None or self.queue == queue)
        )

    def to_json(self) -> dict[str, str | None]:
        return {"tenant_id": self.tenant_id, "kind": self.kind, "queue": self.queue}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> JobFilter:
        return cls(
            tenant_id=filter_text(data.get("tenant_id"), "tenant_id"),
            kind=filter_text(data.get("kind"), "kind"),
            queue=filter_text(data.get("queue"), "queue"),
        )

    def describe(self) -> str:
        return " ".join(f"{key}={value}" for key, value in self.to_json().items() if value)
