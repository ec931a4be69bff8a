"""Idempotency in the work's own transaction, against the real PostgreSQL."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import psycopg2

from platform_tasks.consumer.pipeline import pipeline_for
from platform_tasks.envelope import uuid7
from platform_tasks.harness import wait_until
from tests.integration.consumer.conftest import Harness


def envelope(key: str = "k", **data: Any) -> dict[str, Any]:
    return {
        "job_id": str(uuid7()),
        "tenant_id": "tenant-1",
        "correlation_id": "corr-1",
        "kind": "tests.it.apply",
        "data": {"key": key, **data},
    }


def test_job_applies_once_and_commits_row_with_work(harness: Harness) -> None:
    payload = envelope("a")
    result = harness.apply(payload)
    assert result.state == "SUCCESS", result.traceback
    assert harness.rows("SELECT job_id::text, key FROM public.consumer_work") == [
        (payload["job_id"], "a")
    ]
    assert harness.rows(
        "SELECT consumer FROM core.processed_jobs WHERE job_id = %s", payload["job_id"]
    ) == [("tests.it.apply",)]


def test_duplicate_delivery_is_skipped_without_calling_handler(harness: Harness) -> None:
    payload = envelope("dup")
    assert harness.apply(payload).state == "SUCCESS"
    second = harness.apply(payload)
    assert second.state == "SUCCESS"
    assert harness.calls == [payload["job_id"]]
    assert harness.rows("SELECT count(*) FROM public.consumer_work") == [(1,)]


def test_handler_error_rolls_back_work_and_idempotency_row(harness: Harness) -> None:
    payload = envelope("boom", fail=True)
    result = harness.apply(payload)
    assert result.state == "RETRY"
    assert harness.calls == [payload["job_id"]]
    assert harness.rows("SELECT count(*) FROM public.consumer_work") == [(0,)]
    assert harness.rows("SELECT count(*) FROM core.processed_jobs") == [(0,)]
    # nothing of the failed attempt blocks the next one: attempt 2 (now healthy) applies
    healthy = dict(payload, data={"key": "boom"})
    assert harness.apply(healthy, attempt=2).state == "SUCCESS"
    assert harness.rows("SELECT count(*) FROM public.consumer_work") == [(1,)]
    assert harness.rows("SELECT count(*) FROM core.processed_jobs") == [(1,)]


def test_two_concurrent_deliveries_apply_exactly_once(harness: Harness) -> None:
    payload = envelope("race", block=True)
    results: dict[str, Any] = {}

    def deliver(name: str) -> None:
        results[name] = harness.apply(payload)

    first = threading.Thread(target=deliver, args=("first",))
    first.start()
    assert harness.started.wait(10)
    second = threading.Thread(target=deliver, args=("second",))
    second.start()

    def second_waits_on_the_claim() -> bool:
        rows = harness.rows(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            "AND query LIKE 'BEGIN; INSERT INTO core.processed_jobs%%'"
        )
        return rows[0][0] == 1

    wait_until(second_waits_on_the_claim, timeout=10, message="second delivery blocked")
    harness.release.set()
    first.join(15)
    second.join(15)
    assert results["first"].state == "SUCCESS"
    assert results["second"].state == "SUCCESS"
    assert harness.calls == [payload["job_id"]]
    assert harness.rows("SELECT count(*) FROM public.consumer_work") == [(1,)]
    assert harness.rows("SELECT count(*) FROM core.processed_jobs") == [(1,)]


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
