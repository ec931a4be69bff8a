"""The platform jobs shipped in ``beat_schedules/``, run through ``JobTestScheduler``
against the real PostgreSQL: the nightly processed-jobs purge and the hourly dead-letter
age report."""

from __future__ import annotations

import logging
import uuid
from datetime import UTC, datetime
from pathlib import Path

import psycopg2
import pytest

from platform_tasks.testing import JobTestScheduler

SHIPPED_JOBS = Path(__file__).resolve().parents[3] / "beat_schedules"
START = datetime(2025, 1, 1, 2, 0, tzinfo=UTC)


@pytest.fixture
def platform_jobs(monkeypatch, redis_url, redis_client, database_url) -> JobTestScheduler:
    # The handlers read their settings from the environment, as in beat and workers.
    for name in ("PLATFORM_JOBS_DIR", "PLATFORM_JOBS_INCLUDE", "PLATFORM_JOBS_EXCLUDE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PLATFORM_REDIS_URL", redis_url)
    monkeypatch.setenv("PLATFORM_DATABASE_URL", database_url)
    monkeypatch.setenv("PLATFORM_PROCESSED_JOBS_TTL_DAYS", "30")
    monkeypatch.setenv("PLATFORM_DEAD_LETTER_ALERT_AGE_HOURS", "24")
    monkeypatch.delenv("SENTRY_DSN", raising=False)
    return JobTestScheduler(jobs_dir=SHIPPED_JOBS, redis=redis_client, started_at=START)


def execute(database_url: str, sql: str, rows: list[tuple[object, ...]] = ()) -> None:  # type: ignore[assignment]
    conn = psycopg2.connect(database_url)
    try:
        with conn, conn.cursor() as cur:
            if rows:
                cur.executemany(sql, rows)
            else:
                cur.execute(sql)
    finally:
        conn.close()


def fetch(database_url: str, sql: str) -> list[tuple[object, ...]]:
    conn = psycopg2.connect(database_url)
    try:
        with conn, conn.cursor() as cur:
            cur.execute(sql)
            return list(cur.fetchall())
    finally:
        conn.close()


def test_both_platform_jobs_are_discovered(platform_jobs: JobTestScheduler) -> None:
    assert {job.name for job in platform_jobs.jobs} == {
        "platform.processed_jobs_cleanup",
        "platform.dead_letter_age_report",
        # the example app's fan-out jobs (tests/e2e/fanout/test_fanout_example_jobs.py)
        "maintenance.partitions",
        "maintenance.retention",
        "maintenance.reconciliation",
        "maintenance.freshness",
        "maintenance.expiring_points",
        "maintenance.usage_snapshots",
    }


def test_nightly_cleanup_deletes_only_expired_processed_jobs(
    platform_jobs: JobTestScheduler, database_url: str
) -> None:
    old = [(str(uuid.uuid4()), "billing.charge", "40 days") for _ in range(7)]
    fresh = [(str(uuid.uuid4()), "billing.charge", "29 days") for _ in range(3)]
    execute(
        database_url,
        "INSERT INTO core.processed_jobs (job_id, consumer, processed_at) "
        "VALUES (%s, %s, now() - %s::interval)",
        old + fresh,
    )
    # 03:05 is the hourly report's point only; 03:17 is the cleanup's.
    results = platform_jobs.tick(at=datetime(2025, 1, 1, 3, 17, tzinfo=UTC))
    by_job = {r.job: r for r in results}
    cleanup = by_job["platform.processed_jobs_cleanup"]
    assert (cleanup.point, cleanup.outcome, cleanup.run) == (
        datetime(2025, 1, 1, 3, 17, tzinfo=UTC),
        "admitted",
        "succeeded",
    )
    remaining = {
        str(row[0]) for row in fetch(database_url, "SELECT job_id FROM core.processed_jobs")
    }
    assert remaining == {job_id for job_id, _, _ in fresh}


def test_hourly_report_counts_stale_pending_dead_letters_and_alerts(
    platform_jobs: JobTestScheduler, database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    execute(
        database_url,
        "INSERT INTO core.dead_letters (queue, kind, payload, reason, status, created_at) "
        "VALUES (%s, %s, '{}'::jsonb, 'poison', %s, now() - %s::interval)",
        [
            ("billing", "billing.charge", "pending_review", "30 hours"),  # stale
            ("billing", "billing.charge", "pending_review", "3 days"),  # stale
            ("email", "email.send", "pending_review", "25 hours"),  # stale
            ("email", "email.send", "pending_review", "2 hours"),  # too young
            ("email", "email.send", "discarded", "5 days"),  # reviewed already
        ],
    )
    caplog.set_level(logging.INFO)
    results = platform_jobs.tick(at=datetime(2025, 1, 1, 2, 5, tzinfo=UTC))
    assert [(r.job, r.outcome, r.run) for r in results] == [
        ("platform.dead_letter_age_report", "admitted", "succeeded")
    ]
    counted = [
        r for r in caplog.records if getattr(r, "event", None) == "maintenance.stale_dead_letters"
    ]
    assert [r.count for r in counted] == [3]  # type: ignore[attr-defined]
    alerts = [
        r
        for r in caplog.records
        if r.levelno >= logging.ERROR and "3 dead letter(s) pending review" in r.getMessage()
    ]
    assert len(alerts) == 1 and "billing/billing.charge: 2" in alerts[0].getMessage()


def test_hourly_report_without_stale_rows_sends_no_alert(
    platform_jobs: JobTestScheduler, database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    execute(
        database_url,
        "INSERT INTO core.dead_letters (queue, kind, payload, reason, status, created_at) "
        "VALUES ('email', 'email.send', '{}'::jsonb, 'poison', 'pending_review', now())",
    )
    caplog.set_level(logging.INFO)
    [result] = platform_jobs.tick(at=datetime(2025, 1, 1, 2, 5, tzinfo=UTC))
    assert (result.outcome, result.run) == ("admitted", "succeeded")
    counted = [
        r for r in caplog.records if getattr(r, "event", None) == "maintenance.stale_dead_letters"
    ]
    assert [r.count for r in counted] == [0]  # type: ignore[attr-defined]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
