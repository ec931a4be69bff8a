"""Housekeeping of schema core: TTL cleanup of idempotency rows and stale dead-letter alerts.

The cleanup takes the delivery marks and the completed batches of the same age along.

Both run from the CLI (``platform-tasks maintenance ...``) and as scheduled jobs. The purge
deletes in small batches, each its own short transaction addressing rows by ``ctid`` with
``SKIP LOCKED``, so it never holds locks long enough to stall the consumers that keep
inserting idempotency rows while it runs.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import psycopg2
from psycopg2.extensions import connection as Connection

from platform_tasks.errors import ConfigurationError
from platform_tasks.observability.alerts import send_alert
from platform_tasks.postgres.queries import load_queries
from platform_tasks.settings import PlatformSettings, variable_name

logger = logging.getLogger(__name__)

DEFAULT_PURGE_BATCH_SIZE = 5000
BATCHES_PER_PURGE_TRANSACTION = 20
"""Completed batches deleted per transaction: each takes its children's rows along."""
STALE_ALERT_FINGERPRINT = ("dead-letters", "pending-review-too-long")


def _connect(settings: PlatformSettings) -> Connection:
    if not settings.database_url:
        raise ConfigurationError(f"{variable_name('database_url')} is not set")
    return psycopg2.connect(
        settings.database_url, connect_timeout=10, application_name="platform-tasks maintenance"
    )


def _now(now: datetime | None) -> datetime:
    if now is None:
        return datetime.now(UTC)
    if now.tzinfo is None:
        raise ValueError("now must be timezone-aware")
    return now


@dataclass(frozen=True)
class PurgeResult:
    deleted: int
    batches: int
    seconds: float
    cutoff: datetime
    marks_deleted: int = 0
    batches_deleted: int = 0


def _purge_older_than(
    conn: Connection, cutoff: datetime, batch_size: int
) -> tuple[dict[str, int], int]:
    """Rows deleted by each purge query of ``maintenance.sql``, and the transactions it
    took: each query runs until a transaction of it deletes nothing."""
    queries = load_queries("maintenance")
    names = ("purge_processed_jobs_batch", "purge_delivery_marks_batch", "purge_batches_batch")
    counts = dict.fromkeys(names, 0)
    transactions = 0
    for name in names:
        size = BATCHES_PER_PURGE_TRANSACTION if name == "purge_batches_batch" else batch_size
        while True:
            with conn, conn.cursor() as cur:
                cur.execute(queries[name], {"cutoff": cutoff, "batch_size": size})
                count = cur.rowcount
            if count <= 0:
                break
            counts[name] += count
            transactions += 1
    return counts, transactions


def purge_processed_jobs(
    settings: PlatformSettings,
    *,
    batch_size: int = DEFAULT_PURGE_BATCH_SIZE,
    now: datetime | None = None,
) -> PurgeResult:
    """Delete idempotency rows older than ``processed_jobs_ttl_days``, batch by batch.

    Each batch commits on its own; the loop ends at the first batch that deletes nothing,
    so rows a consumer holds at that moment are simply left for the next run. Delivery
    marks (``core.delivery_marks``) older than the same cutoff are purged after them, then
    the batches (``core.batches`` with their children) that completed before it: past the
    idempotency window a replayed dead letter is a new job anyway, and re-opens nothing.
    """
    if batch_size < 1:
        raise ValueError("batch_size must be at least 1")
    cutoff = _now(now) - timedelta(days=settings.processed_jobs_ttl_days)
    started = time.monotonic()
    conn = _connect(settings)
    try:
        counts, transactions = _purge_older_than(conn, cutoff, batch_size)
    finally:
        conn.close()
    result = PurgeResult(
        counts["purge_processed_jobs_batch"],
        transactions,
        time.monotonic() - started,
        cutoff,
        counts["purge_delivery_marks_batch"],
        counts["purge_batches_batch"],
    )
    logger.info(
        "purged %d processed_jobs rows older than %s in %d transactions (%.2fs)",
        result.deleted,
        cutoff.isoformat(),
        transactions,
        result.seconds,
        extra={
            "event": "processed_jobs.purged",
            "deleted": result.deleted,
            "marks_deleted": result.marks_deleted,
            "batches_deleted": result.batches_deleted,
            "batches": transactions,
            "cutoff": cutoff.isoformat(),
            "seconds": round(result.seconds, 3),
        },
    )
    return result


def purge_expired_processed_jobs(
    settings: PlatformSettings,
    *,
    batch_size: int = DEFAULT_PURGE_BATCH_SIZE,
    now: datetime | None = None,
) -> int:
    """TTL cleanup of core.processed_jobs; returns how many rows were deleted.

    The entry point of the scheduled job and the CLI; see :func:`purge_processed_jobs`.
    """
    return purge_processed_jobs(settings, batch_size=batch_size, now=now).deleted


@dataclass(frozen=True)
class StaleGroup:
    queue: str | None
    kind: str | None
    rows: int
    oldest: datetime


def stale_dead_letters(
    settings: PlatformSettings, *, now: datetime | None = None
) -> list[StaleGroup]:
    """Pending rows older than ``dead_letter_alert_age_hours``, grouped by queue and kind."""
    cutoff = _now(now) - timedelta(hours=settings.dead_letter_alert_age_hours)
    conn = _connect(settings)
    try:
        with conn, conn.cursor() as cur:
            cur.execute(load_queries("dead_letters")["stale_dead_letters"], {"cutoff": cutoff})
            return [StaleGroup(*row) for row in cur.fetchall()]
    finally:
        conn.close()


def report_stale_dead_letters(settings: PlatformSettings, *, now: datetime | None = None) -> int:
    """Alert once when dead letters wait for review too long; return how many wait.

    One alert per run with one fixed fingerprint, so a backlog is one Sentry issue that
    keeps counting, not an issue per row. No rows, no alert.
    """
    groups = stale_dead_letters(settings, now=now)
    total = sum(group.rows for group in groups)
    if total == 0:
        logger.info(
            "no dead letters pending review for longer than %s hours",
            settings.dead_letter_alert_age_hours,
            extra={"event": "dead_letters.stale_checked", "stale": 0},
        )
        return 0
    oldest = min(group.oldest for group in groups)
    where = ", ".join(f"{g.queue or '?'}/{g.kind or '?'}: {g.rows}" for g in groups[:10])
    if len(groups) > 10:
        where += f", and {len(groups) - 10} more queue/kind pairs"
    send_alert(
        f"{total} dead letter(s) pending review for more than "
        f"{settings.dead_letter_alert_age_hours:g} hours (oldest from {oldest.isoformat()}): "
        f"{where}",
        tags={"check": "stale_dead_letters", "stale_count": str(total)},
        fingerprint=list(STALE_ALERT_FINGERPRINT),
        level="error",
    )
    return total
