"""The example app's per-tenant maintenance consumers, fanned out by ``beat_schedules/maintenance``.

Each scheduled job of the platform standard calls ``fan_out``; the fan-out publishes one
envelope per tenant to the ``maintenance`` queue, and one of these consumers does that
tenant's share of the work on the example tables (schema ``example``,
``example_maintenance.sql``, applied by every worker at start-up):

- ``example.create_partitions``: the tenant's partition of ``example.events`` and its
  daily partitions ``days_ahead`` days ahead;
- ``example.retention_purge``: events older than ``retention_days`` exported to a JSON
  Lines file under ``EXAMPLE_EXPORT_DIR`` (default ``.data/exports``), then deleted;
- ``example.reconcile``: ledger total against the stored balance, one row per night;
- ``example.recompute_freshness``: the tenant's freshness row (tiers due this hour only);
- ``example.scan_expiring_points``: loyalty points expiring within ``within_days``;
- ``example.snapshot_usage``: the tenant's event count, every 30 minutes.

The job files take their queue and interval from here (:func:`every`). Every consumer is a
``PlatformTask``: its writes commit with the idempotency row, so a
fan-out repeated or resumed for the same point changes nothing twice.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg2
from celery.signals import worker_init
from psycopg2 import sql

from platform_tasks import PlatformTask
from platform_tasks.brokers.worker_queues import add_queue_source
from platform_tasks.settings import PlatformSettings

logger = logging.getLogger(__name__)

QUEUE = "maintenance"
SCHEMA_FILE = Path(__file__).with_name("example_maintenance.sql")
_SCHEMA_LOCK = 0x6578616D  # "exam": one worker applies the schema at a time


def every(standard: timedelta) -> timedelta:
    """A maintenance job's interval: ``standard``, or ``PLATFORM_EXAMPLE_JOBS_INTERVAL_SECONDS``.

    The jobs use intervals, which fall on UTC multiples of the period (one day: 00:00
    UTC), so no zone's DST change moves, drops or repeats a run. The setting shortens every
    one of them at once (tests and demos). The job files import this module by name (it is
    the composition root's, already loaded when a worker or beat discovers the jobs).
    """
    seconds = PlatformSettings.from_env().example_jobs_interval_seconds
    return timedelta(seconds=seconds) if seconds else standard


def scheduled_for(envelope: Any) -> datetime:
    """The fan-out's point (``data["scheduled_for"]``) as an aware datetime."""
    return datetime.fromisoformat(envelope.data["scheduled_for"].replace("Z", "+00:00"))


def _short(tenant_id: str) -> str:
    """A name-safe stand-in for a tenant id in table and file names."""
    return hashlib.sha256(tenant_id.encode()).hexdigest()[:12]


def create_partitions(envelope: Any, tx: Any) -> None:
    tenant, point = envelope.tenant_id, scheduled_for(envelope)
    days_ahead = int(envelope.data.get("days_ahead", 3))
    parent = f"events_{_short(tenant)}"
    tx.execute(
        sql.SQL(
            "CREATE TABLE IF NOT EXISTS example.{} PARTITION OF example.events FOR VALUES IN ({}) "
            "PARTITION BY RANGE (occurred_at)"
        ).format(sql.Identifier(parent), sql.Literal(tenant))
    )
    tx.execute(
        sql.SQL("CREATE TABLE IF NOT EXISTS example.{} PARTITION OF example.{} DEFAULT").format(
            sql.Identifier(f"{parent}_default"), sql.Identifier(parent)
        )
    )
    first = point.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    for offset in range(days_ahead + 1):
        day = first + timedelta(days=offset)
        tx.execute(
            sql.SQL(
                "CREATE TABLE IF NOT EXISTS example.{} PARTITION OF example.{} "
                "FOR VALUES FROM ({}) TO ({})"
            ).format(
                sql.Identifier(f"{parent}_{day:%Y%m%d}"),
                sql.Identifier(parent),
                sql.Literal(day),
                sql.Literal(day + timedelta(days=1)),
            )
        )
    logger.info("partitions of %s ready %d day(s) ahead", tenant, days_ahead,
                extra={"event": "example.partitions_created", "tenant_id": tenant})  # fmt: skip


def retention_purge(envelope: Any, tx: Any) -> None:
    tenant, point = envelope.tenant_id, scheduled_for(envelope)
    cutoff = point - timedelta(days=int(envelope.data.get("retention_days", 30)))
    tx.execute(
        "DELETE FROM example.events WHERE tenant_id = %s AND occurred_at < %s "
        "RETURNING occurred_at, name, payload", (tenant, cutoff))  # fmt: skip
    rows = tx.fetchall()
    folder = Path(os.environ.get("EXAMPLE_EXPORT_DIR", ".data/exports"))
    folder.mkdir(parents=True, exist_ok=True)
    # Named by job id: a retried attempt rewrites the same file, never a second one.
    path = folder / f"events-{_short(tenant)}-{point:%Y%m%dT%H%M%SZ}-{envelope.job_id}.jsonl"
    with open(path, "w", encoding="utf-8") as out:
        for occurred_at, name, payload in rows:
            out.write(json.dumps({"tenant_id": tenant, "occurred_at": occurred_at.isoformat(),
                                  "name": name, "payload": payload}) + "\n")  # fmt: skip
        out.flush()
        os.fsync(out.fileno())
    tx.execute(
        "INSERT INTO example.retention_exports (tenant_id, scheduled_for, rows_exported, file) "
        "VALUES (%s, %s, %s, %s) ON CONFLICT (tenant_id, scheduled_for) DO NOTHING",
        (tenant, point, len(rows), str(path)))  # fmt: skip
    logger.info("exported and purged %d event(s) of %s", len(rows), tenant,
                extra={"event": "example.retention_purged", "tenant_id": tenant})  # fmt: skip


def reconcile(envelope: Any, tx: Any) -> None:
    tenant, point = envelope.tenant_id, scheduled_for(envelope)
    tx.execute(
        "INSERT INTO example.reconciliations "
        "(tenant_id, scheduled_for, ledger_cents, balance_cents, matches) "
        "SELECT %(t)s, %(p)s, l.total, b.balance_cents, "
        "       b.balance_cents IS NOT DISTINCT FROM l.total "
        "FROM (SELECT coalesce(sum(amount_cents), 0) AS total FROM example.ledger_entries "
        "      WHERE tenant_id = %(t)s) AS l "
        "LEFT JOIN example.balances b ON b.tenant_id = %(t)s "
        "ON CONFLICT (tenant_id, scheduled_for) DO NOTHING", {"t": tenant, "p": point})  # fmt: skip


def recompute_freshness(envelope: Any, tx: Any) -> None:
    tenant, point = envelope.tenant_id, scheduled_for(envelope)
    tx.execute(
        "INSERT INTO example.freshness (tenant_id, freshness_tier, scheduled_for) "
        "SELECT %(t)s, coalesce((SELECT freshness_tier FROM core.tenants WHERE tenant_id = %(t)s),"
        " 'unknown'), %(p)s "
        "ON CONFLICT (tenant_id) DO UPDATE SET freshness_tier = excluded.freshness_tier, "
        "scheduled_for = excluded.scheduled_for, recomputed_at = now(), "
        "recomputations = example.freshness.recomputations + 1",
        {"t": tenant, "p": point})  # fmt: skip


def scan_expiring_points(envelope: Any, tx: Any) -> None:
    tenant, point = envelope.tenant_id, scheduled_for(envelope)
    within = timedelta(days=int(envelope.data.get("within_days", 7)))
    tx.execute(
        "INSERT INTO example.expiring_points "
        "(tenant_id, member_id, points, expires_at, scheduled_for) "
        "SELECT tenant_id, member_id, points, expires_at, %(p)s FROM example.loyalty_points "
        "WHERE tenant_id = %(t)s AND expires_at > %(p)s AND expires_at <= %(until)s "
        "ON CONFLICT (tenant_id, member_id, expires_at) DO NOTHING",
        {"t": tenant, "p": point, "until": point + within})  # fmt: skip


def snapshot_usage(envelope: Any, tx: Any) -> None:
    tenant, point = envelope.tenant_id, scheduled_for(envelope)
    tx.execute(
        "INSERT INTO example.usage_snapshots (tenant_id, scheduled_for, events_total) "
        "SELECT %(t)s, %(p)s, count(*) FROM example.events WHERE tenant_id = %(t)s "
        "AND occurred_at <= %(p)s ON CONFLICT (tenant_id, scheduled_for) DO NOTHING",
        {"t": tenant, "p": point})  # fmt: skip


CONSUMERS = {
    "example.create_partitions": create_partitions,
    "example.retention_purge": retention_purge,
    "example.reconcile": reconcile,
    "example.recompute_freshness": recompute_freshness,
    "example.scan_expiring_points": scan_expiring_points,
    "example.snapshot_usage": snapshot_usage,
}
"""Envelope kind → consumer; the job files in ``beat_schedules/maintenance`` fan out to these."""


def apply_schema(database_url: str) -> None:
    """Create the example tables (idempotent; serialised between workers)."""
    conn = psycopg2.connect(database_url)
    try:
        with conn, conn.cursor() as cur:
            cur.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
            cur.execute(SCHEMA_FILE.read_text())
    finally:
        conn.close()


def install(app: Any) -> None:
    """Declare the consumers on ``app``, consume ``maintenance``, create the tables."""
    for kind, handler in CONSUMERS.items():
        app.task(base=PlatformTask, name=kind)(handler)
    add_queue_source(app, lambda _app: [QUEUE])

    def _schema(**_: Any) -> None:
        url = app.platform_settings.database_url
        if url:
            apply_schema(url)

    worker_init.connect(_schema, weak=False, dispatch_uid="example_maintenance.schema")
