"""The job's delivery state in Redis, which writes its own delivery mark first.

A first delivery without a :mod:`delivery mark <platform_tasks.consumer.marks>` skips the
Redis read, so every write of a job's delivery hash must be preceded by a committed mark
(the job's transaction may roll back; the mark must not). That rule used to be kept by
each caller of the counter; :class:`JobState` keeps it in one place: its writes mark
first, and a write whose mark PostgreSQL refused is never sent to Redis.

Writes that decide the job's fate (counting a redelivery or a failed attempt, starting a
replay afresh) raise, so the delivery waits. Clean-ups after a verdict (clearing the hash
of an applied job, taking back a count, spending the budget of a dead-lettered job) are
best effort and log a warning: the verdict stands without them.
"""

from __future__ import annotations

import logging

from platform_tasks.brokers.redis_client import REDIS_ERRORS
from platform_tasks.consumer.attempts import DeliveryCounter, DeliveryState
from platform_tasks.consumer.marks import DeliveryMarks

logger = logging.getLogger(__name__)


class JobState:
    """Reads and writes ``(consumer, job)``'s delivery hash; every write is marked first."""

    def __init__(self, marks: DeliveryMarks, deliveries: DeliveryCounter) -> None:
        self.marks = marks
        self.deliveries = deliveries

    def read(self, consumer: str, job: str, *, redelivered: bool, ttl: int) -> DeliveryState:
        """The job's state; a redelivery is counted first (and so marked first)."""
        if redelivered:
            self.marks.mark(consumer, job)
        return self.deliveries.observe(consumer, job, redelivered=redelivered, ttl_seconds=ttl)

    def failed(self, consumer: str, job: str, *, ttl_seconds: int) -> None:
        """Count a failed attempt; raises when PostgreSQL or Redis refuses."""
        self.marks.mark(consumer, job)
        self.deliveries.failed(consumer, job, ttl_seconds=ttl_seconds)

    def restart(self, consumer: str, job: str, *, generation: int, ttl_seconds: int) -> None:
        """Start afresh for a replay of dead letter ``generation``; raises on refusal."""
        self.marks.mark(consumer, job)
        self.deliveries.restart(consumer, job, generation=generation, ttl_seconds=ttl_seconds)

    def settle_time_limit(self, consumer: str, job: str, *, ttl_seconds: int) -> None:
        """The counted redelivery of a stopped attempt becomes the failed attempt.

        Only ever after :meth:`read` counted a redelivery, whose mark is already written.
        """
        self.deliveries.settle_time_limit(consumer, job, ttl_seconds=ttl_seconds)

    def exhaust(self, consumer: str, job: str, *, ttl_seconds: int) -> None:
        """Spend the rest of the budget so a duplicate still in flight is not run again."""
        try:
            self.marks.mark(consumer, job)
        except Exception:  # best effort: the dead letter row about to be written is a mark too
            _warn("could not mark the job's delivery state", "consumer.mark_not_written")
        try:
            self.deliveries.exhaust(consumer, job, ttl_seconds=ttl_seconds)
        except REDIS_ERRORS:
            _warn("could not mark the delivery budget spent", "consumer.budget_not_marked")

    def forget(self, consumer: str, job: str) -> None:
        """Clear the hash of an applied job (best effort: its idempotency row guards it)."""
        try:
            self.deliveries.forget(consumer, job)
        except REDIS_ERRORS:
            _warn("could not clear the delivery count", "consumer.count_not_cleared")

    def undo(self, consumer: str, job: str) -> None:
        """Take back a counted redelivery that reached no verdict (best effort)."""
        try:
            self.deliveries.undo(consumer, job)
        except REDIS_ERRORS:
            _warn("could not take back a delivery count", "consumer.count_not_undone")


def _warn(message: str, event: str) -> None:
    logger.warning(message, exc_info=True, extra={"event": event})
