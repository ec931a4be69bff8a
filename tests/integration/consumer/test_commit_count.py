"""One commit per job: the idempotency row and the work are never committed apart.

Counted with ``pg_stat_database.xact_commit``, which counts every transaction of the
database, read-only ones too, from any client. The shared test database has clients this
test does not control (connections of earlier tests' processes closing, pool threads), so
the jobs run against a database of their own, created and migrated for this module, that
nothing else connects to.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator

import psycopg2
import pytest

from platform_tasks.consumer.pipeline import pipeline_for
from platform_tasks.postgres.migrations import migrate
from platform_tasks.testing.servers import PostgresServer, wait_until
from tests.integration.consumer.conftest import Harness
from tests.integration.consumer.test_idempotency import envelope


@pytest.fixture(scope="module")
def own_database(postgres_server: PostgresServer) -> Iterator[str]:
    name = f"commit_count_{uuid.uuid4().hex[:8]}"
    admin = psycopg2.connect(postgres_server.url)
    admin.autocommit = True
    with admin.cursor() as cur:
        cur.execute(f"CREATE DATABASE {name}")
    url = postgres_server.url.rsplit("/", 1)[0] + f"/{name}"
    migrate(url)
    try:
        yield url
    finally:
        with admin.cursor() as cur:
            cur.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
                (name,),
            )
            cur.execute(f"DROP DATABASE IF EXISTS {name}")
        admin.close()


@pytest.fixture
def database_url(own_database: str) -> str:
    """This module's database instead of the shared one (``settings`` builds on it)."""
    return own_database


def test_work_and_idempotency_row_share_one_commit(harness: Harness) -> None:
    """50 jobs cost 50 commits: the claim and the work are never committed apart."""
    jobs = 50

    database = harness.rows("SELECT current_database()")[0][0]
    # read from another database, so reading the counter does not move it
    admin = psycopg2.connect(harness.database_url.rsplit("/", 1)[0] + "/postgres")
    admin.autocommit = True

    def commits() -> int:
        with admin.cursor() as cur:
            cur.execute("SELECT pg_stat_clear_snapshot()")
            cur.execute("SELECT xact_commit FROM pg_stat_database WHERE datname = %s", (database,))
            return int(cur.fetchone()[0])

    def settled() -> Callable[[], bool]:
        last: list[int] = []

        def check() -> bool:
            last.append(commits())
            return len(last) >= 3 and last[-1] == last[-2] == last[-3]

        return check

    def autovacuum(on: bool) -> None:
        # An autovacuum or autoanalyze worker's transactions count in the same counter
        # (50 inserts into a small table are enough to start one): none may start while
        # the jobs are counted. Workers already running finish before the counter settles.
        with admin.cursor() as cur:
            cur.execute(f"ALTER SYSTEM SET autovacuum = {'on' if on else 'off'}")
            cur.execute("SELECT pg_reload_conf()")

    autovacuum(False)
    try:
        harness.apply(envelope("warm-up"))  # opens the consumer's connection
        wait_until(settled(), timeout=60, interval=0.5, message="commit counter settled")
        before = commits()
        for n in range(jobs):
            assert harness.apply(envelope(f"counted-{n}")).state == "SUCCESS"
        pipeline_for(harness.app).database.discard()  # a closing backend reports its counters
        wait_until(settled(), timeout=30, interval=0.5, message="commit counter settled")
        delta = commits() - before
    finally:
        autovacuum(True)
        admin.close()
    assert harness.rows("SELECT count(*) FROM core.processed_jobs") == [(jobs + 1,)]
    # the test's own row count above is one more commit; two commits per job would be 100+
    assert delta == jobs + 1, delta
    # and directly: each job's work row and idempotency row were written by one transaction
    same_transaction = harness.rows(
        "SELECT count(*), count(DISTINCT w.xmin::text) FROM public.consumer_work w "
        "JOIN core.processed_jobs p ON p.job_id = w.job_id "
        "WHERE p.xmin::text = w.xmin::text"
    )
    assert same_transaction == [(jobs + 1, jobs + 1)]
