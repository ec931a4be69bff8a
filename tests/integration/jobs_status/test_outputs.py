"""Recorded output on real PostgreSQL: written in the job's transaction, gone with its
rollback, read back for many jobs in one query (what a batch callback needs)."""

from __future__ import annotations

import psycopg2
import pytest
import redis

from platform_tasks.consumer import idempotency
from platform_tasks.envelope import uuid7
from platform_tasks.errors import OutputRefused
from platform_tasks.jobs_status.output import read_outputs, record_output


def _claim(cur: object, job: str, consumer: str) -> None:
    assert idempotency.claim_and_look(cur, job, consumer, "corr-1") == (True, False)


def test_output_commits_with_the_job_and_rolls_back_with_it(database_url: str) -> None:
    applied, failed, silent = (str(uuid7()) for _ in range(3))
    conn = psycopg2.connect(database_url)
    conn.autocommit = True
    cur = conn.cursor()
    try:
        _claim(cur, applied, "billing.charge")
        record_output(cur, applied, "billing.charge", {"invoice": 7}, max_bytes=1024)
        cur.execute("COMMIT")
        _claim(cur, failed, "billing.charge")
        record_output(cur, failed, "billing.charge", ["lost"], max_bytes=1024)
        cur.execute("ROLLBACK")
        _claim(cur, silent, "billing.charge")
        record_output(cur, silent, "billing.charge", None, max_bytes=1024)
        cur.execute("COMMIT")
        _claim(cur, str(uuid7()), "billing.charge")
        with pytest.raises(OutputRefused, match="PLATFORM_JOB_OUTPUT_MAX_BYTES=8"):
            record_output(cur, applied, "billing.charge", "far too long", max_bytes=8)
        cur.execute("ROLLBACK")

        assert read_outputs(cur, [applied, failed, silent]) == {
            applied: {"billing.charge": {"invoice": 7}}
        }
        cur.execute("SELECT correlation_id FROM core.processed_jobs WHERE job_id = %s", (applied,))
        assert cur.fetchone() == ("corr-1",)
        assert read_outputs(cur, []) == {}
    finally:
        conn.close()


def test_a_marker_is_written_for_a_job_that_runs_on_and_deleted_when_it_ends(
    redis_client: redis.Redis,
) -> None:
    from platform_tasks.jobs_status.running import RunningMarkers
    from platform_tasks.keys import running_key

    now = [0.0]
    markers = RunningMarkers(lambda: redis_client, "test", clock=lambda: now[0], watch=False)
    running = markers.begin("a", consumer="c", queue="q", attempt=2, ttl_seconds=30)
    assert not redis_client.exists(running_key("test", "a"))  # nothing on the job's path
    now[0] = 1.0
    for due in markers.due():
        markers.mark(due)
    assert redis_client.hget(running_key("test", "a"), "attempt") == b"2"
    assert redis_client.ttl(running_key("test", "a")) == 60  # at least a minute
    markers.mark(running, {"done": 5, "total": 10, "note": "", "at": 1})
    assert redis_client.hget(running_key("test", "a"), "done") == b"5"
    markers.finish(running)
    assert not redis_client.exists(running_key("test", "a"))
    markers.close()
