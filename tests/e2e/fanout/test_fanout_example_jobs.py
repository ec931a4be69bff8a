"""The six maintenance jobs of the example app, end to end: real beat, real worker, real rows.

``celery -A celery_app beat`` and ``celery -A celery_app worker`` run from the repository
root as the README says, with ``PLATFORM_EXAMPLE_JOBS_INTERVAL_SECONDS=3`` shortening
every example job to a 3-second interval. The worker names its queues with ``-Q`` because
on Celery 5.7 the worker-queues step takes every worker for one started with ``-Q`` and
would add none of the platform's queues; the queues named are those
``platform_queues(app)`` lists for ``celery_app``.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg2
import pytest

from example_maintenance import apply_schema
from platform_tasks.testing.servers import wait_until
from tests.conftest import REPO_ROOT
from tests.support.processes import (
    CELERY,
    CeleryProcess,
    celery_processes,
    platform_env,
    worker_argv,
)

TENANTS = [("e2e-a", "1h"), ("e2e-b", "1h")]


def _sql(database_url: str, statement: str, params: object = ()) -> list[tuple]:
    conn = psycopg2.connect(database_url)
    try:
        with conn, conn.cursor() as cur:
            cur.execute(statement, params)
            return cur.fetchall() if cur.description else []
    finally:
        conn.close()


def _count(database_url: str, statement: str, params: object = ()) -> int:
    return int(_sql(database_url, statement, params)[0][0])


@pytest.fixture
def example_database(database_url: str) -> str:
    for tenant, tier in TENANTS:
        _sql(
            database_url,
            "INSERT INTO core.tenants (tenant_id, freshness_tier) VALUES (%s, %s)",
            (tenant, tier),
        )
    apply_schema(database_url)
    now = datetime.now(UTC)
    _sql(
        database_url,
        "INSERT INTO example.ledger_entries VALUES ('e2e-a', 70), ('e2e-a', 30), ('e2e-b', 5)",
    )
    _sql(database_url, "INSERT INTO example.balances VALUES ('e2e-a', 100)")
    _sql(
        database_url,
        "INSERT INTO example.loyalty_points VALUES "
        "('e2e-a', 'm-soon', 40, %s), ('e2e-a', 'm-later', 60, %s)",
        (now + timedelta(days=3), now + timedelta(days=30)),
    )
    return database_url


def test_the_six_example_jobs_do_their_work_per_tenant(
    redis_url: str, example_database: str, tmp_path: Path
) -> None:
    db = example_database
    exports = tmp_path / "exports"
    env = platform_env(
        redis_url=redis_url,
        database_url=db,
        extra={
            "PLATFORM_EXAMPLE_JOBS_INTERVAL_SECONDS": "3",
            "EXAMPLE_EXPORT_DIR": str(exports),
        },
    )
    with celery_processes() as started:
        worker = CeleryProcess(
            worker_argv("celery_app"), env=env, cwd=REPO_ROOT, log_path=tmp_path / "worker.log"
        ).start()
        started.append(worker)
        beat = CeleryProcess(
            [
                CELERY,
                "-A",
                "celery_app",
                "beat",
                "--loglevel",
                "INFO",
                "-s",
                str(tmp_path / "beat-schedule"),
            ],
            env=env,
            cwd=REPO_ROOT,
            log_path=tmp_path / "beat.log",
        ).start()
        started.append(beat)
        worker.wait_for_log("ready.", timeout=90)

        # partition pre-creation: the tenant's partition, today and three days ahead
        def partitions() -> int:
            return _count(
                db,
                "SELECT count(*) FROM pg_inherits i JOIN pg_class c "
                "ON c.oid = i.inhrelid JOIN pg_class p ON p.oid = i.inhparent "
                "JOIN pg_namespace n ON n.oid = p.relnamespace "
                "WHERE n.nspname = 'example' AND p.relname LIKE 'events\\_%%'",
            )

        wait_until(
            lambda: partitions() >= 2 * 5,
            timeout=90,
            message="day partitions (+ default) of both tenants",
        )
        # retention: old rows (in the default partition) exported and purged at a later point
        old = datetime.now(UTC) - timedelta(days=40)
        _sql(
            db,
            "INSERT INTO example.events (tenant_id, occurred_at, name) VALUES "
            "('e2e-a', %s, 'old-1'), ('e2e-a', %s, 'old-2'), ('e2e-a', now(), 'fresh')",
            (old, old + timedelta(hours=1)),
        )
        wait_until(
            lambda: (
                _count(
                    db,
                    "SELECT count(*) FROM example.retention_exports "
                    "WHERE tenant_id = 'e2e-a' AND rows_exported = 2",
                )
                == 1
            ),
            timeout=60,
            message="the two old events exported",
        )
        for table in ("reconciliations", "freshness", "expiring_points", "usage_snapshots"):
            wait_until(
                lambda t=table: (
                    _count(db, f"SELECT count(DISTINCT tenant_id) FROM example.{t}") >= 1
                ),
                timeout=60,
                message=f"rows in example.{table}",
            )
        wait_until(
            lambda: (
                _count(
                    db,
                    "SELECT count(DISTINCT tenant_id) FROM "
                    "example.usage_snapshots WHERE events_total = 1",
                )
                == 1
            ),
            timeout=60,
            message="a usage snapshot after the purge",
        )

    [(file, exported)] = _sql(
        db, "SELECT file, rows_exported FROM example.retention_exports WHERE rows_exported > 0"
    )
    lines = [json.loads(line) for line in Path(file).read_text().splitlines()]
    assert exported == 2 and sorted(line["name"] for line in lines) == ["old-1", "old-2"]
    assert Path(file).parent == exports
    assert _sql(db, "SELECT name FROM example.events") == [("fresh",)]
    assert _sql(
        db,
        "SELECT DISTINCT tenant_id, ledger_cents, balance_cents, matches "
        "FROM example.reconciliations ORDER BY tenant_id",
    ) == [("e2e-a", 100, 100, True), ("e2e-b", 5, None, False)]
    assert _sql(db, "SELECT tenant_id, freshness_tier FROM example.freshness ORDER BY 1") == [
        ("e2e-a", "1h"),
        ("e2e-b", "1h"),
    ]
    assert _sql(db, "SELECT DISTINCT member_id, points FROM example.expiring_points") == [
        ("m-soon", 40)
    ]
    # each tenant's job of one point applied once: one row per (tenant, point) everywhere
    for table in ("reconciliations", "usage_snapshots", "retention_exports"):
        assert (
            _sql(
                db,
                f"SELECT tenant_id, scheduled_for FROM example.{table} "
                "GROUP BY 1, 2 HAVING count(*) > 1",
            )
            == []
        )
    points = _count(db, "SELECT count(DISTINCT scheduled_for) FROM example.usage_snapshots")
    assert _count(db, "SELECT count(*) FROM example.usage_snapshots") <= 2 * points
    assert _count(db, "SELECT count(*) FROM core.dead_letters") == 0
