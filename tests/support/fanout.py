"""Shared by the fan-out end-to-end tests: tenants, the test app's workers, checks.

Workers run ``celery -A tests.apps.fanout_app worker`` without ``-Q`` (``worker_argv``),
so they consume the tenant queue and ``platform.fanout`` as a user's worker would.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import psycopg2
import pytest

from platform_tasks import QueuePort
from platform_tasks.jobs.runner import JobContext
from platform_tasks.settings import PlatformSettings
from platform_tasks.testing import create_test_app
from tests.apps.fanout_app import SCHEMA_SQL
from tests.conftest import REPO_ROOT
from tests.support.processes import CeleryProcess, worker_argv

JOB = "maintenance.e2e"
POINT = datetime(2025, 9, 1, 4, 0, tzinfo=UTC)


def sql(database_url: str, statement: str, params: tuple[object, ...] = ()) -> list[tuple]:
    conn = psycopg2.connect(database_url)
    try:
        with conn, conn.cursor() as cur:
            cur.execute(statement, params or None)
            return cur.fetchall() if cur.description else []
    finally:
        conn.close()


@pytest.fixture
def make_tenants(database_url: str) -> Callable[[int], int]:
    """``make_tenants(n)``: tenants ``t-0000`` … in ``core.tenants`` (tier ``1h``), the test
    tables empty; returns ``n``."""

    def make(count: int) -> int:
        sql(database_url, SCHEMA_SQL)
        sql(
            database_url,
            "TRUNCATE public.fanout_applied, public.fanout_hold, public.fanout_fail,"
            " public.fanout_completed",
        )
        sql(
            database_url,
            "INSERT INTO core.tenants (tenant_id, freshness_tier) "
            "SELECT 't-' || lpad(n::text, 4, '0'), '1h' "
            "FROM generate_series(0, %s - 1) AS n",
            (count,),
        )
        return count

    return make


@pytest.fixture
def port(redis_url: str, database_url: str) -> Iterator[QueuePort]:
    settings = PlatformSettings.build(
        redis_url=redis_url, database_url=database_url, profile="test"
    )
    queue_port = QueuePort(create_test_app("fanout_e2e_publisher", settings=settings))
    yield queue_port
    queue_port.close()


def ctx() -> JobContext:
    return JobContext(
        name=JOB,
        scheduled_for=POINT,
        cancel_requested=threading.Event(),
        logger=logging.getLogger("test"),
    )


def fanout_worker(env: dict[str, str], log: Path, name: str) -> CeleryProcess:
    argv = worker_argv("tests.apps.fanout_app", hostname=f"{name}@%h")
    return CeleryProcess(argv, env=env, cwd=REPO_ROOT, log_path=log)


def applied(database_url: str) -> int:
    return int(sql(database_url, "SELECT count(*) FROM public.fanout_applied")[0][0])


def progress(database_url: str) -> tuple[int, bool] | None:
    rows = sql(database_url, "SELECT published, finished_at IS NOT NULL FROM core.fanout_progress")
    return (int(rows[0][0]), bool(rows[0][1])) if rows else None


def assert_each_tenant_applied_once(database_url: str, expected: int) -> None:
    assert applied(database_url) == expected
    twice = sql(
        database_url,
        "SELECT tenant_id, count(*) FROM public.fanout_applied "
        "GROUP BY tenant_id HAVING count(*) > 1",
    )
    assert twice == []
    [(tenants, points)] = sql(
        database_url,
        "SELECT count(DISTINCT tenant_id), count(DISTINCT point) FROM public.fanout_applied",
    )
    assert (tenants, points) == (expected, 1)
