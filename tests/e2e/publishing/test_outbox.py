"""Publishing in a transaction, through a real worker whose relay hands the rows over.

A job published with ``tx=`` exists if and only if the transaction committed: rolled back
publishes never run, committed ones run exactly once. Inside a PlatformTask handler a
publish joins the handler's transaction: a follow-up of a failed attempt never leaves,
and a retried attempt publishes it again under the same derived id.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg2
import redis

from platform_tasks import QueuePort
from platform_tasks.fanout.ids import derived_uuid7
from tests.apps.outbox_app import QUEUE, TASK
from tests.e2e.publishing.outbox import (
    applied,
    broker_lists,
    effect,
    outbox_rows,
    prepare,
    producer,
    start_worker,
    wait_for,
)
from tests.support.database import query
from tests.support.processes import celery_processes

PUBLISHES = 1000


def publish_in_transactions(port: QueuePort, database_url: str) -> tuple[list[str], list[str]]:
    """``PUBLISHES`` publishes, one client transaction each; 3 in 10 roll back (the client
    raises after the publish). Returns the committed and the rolled back job ids."""
    committed, rolled_back = [], []
    conn = psycopg2.connect(database_url)
    try:
        for n in range(PUBLISHES):
            payload = effect(f"client-{n}")
            try:
                with conn:  # commits, or rolls back on the raise
                    with conn.cursor() as cur:
                        cur.execute("SELECT 1")  # the client's own work
                    job = port.publish(QUEUE, payload, tx=conn)
                    assert str(job) == payload["job_id"]
                    if n % 10 < 3:
                        raise LookupError("the request failed after publishing")
                committed.append(payload["job_id"])
            except LookupError:
                rolled_back.append(payload["job_id"])
    finally:
        conn.close()
    return committed, rolled_back


def test_only_committed_publishes_run_each_once_and_handler_publishes_join_its_transaction(
    redis_url: str, database_url: str, tmp_path: Path
) -> None:
    prepare(database_url)
    client = redis.Redis.from_url(redis_url)
    with celery_processes() as started, producer(redis_url, redis_url, database_url) as port:
        worker = start_worker(started, redis_url, database_url, tmp_path / "worker.log")

        # -- client transactions: 1,000 publishes, about 30 % rolled back
        committed, rolled_back = publish_in_transactions(port, database_url)

        # -- schedule(tx=) keeps its due time; a rolled back schedule never runs
        due = datetime.now(UTC) + timedelta(seconds=2)
        later = effect("scheduled")
        with psycopg2.connect(database_url) as conn:
            port.schedule(QUEUE, later, due, tx=conn.cursor())
        conn.close()
        dropped = effect("scheduled-rolled-back")
        conn = psycopg2.connect(database_url)
        port.schedule(QUEUE, dropped, due, tx=conn)
        conn.rollback()
        conn.close()

        # -- handlers: a follow-up leaves only with the work that published it
        retried = effect("retried", follow_up=True, fail_times=1)
        doomed = effect("doomed", follow_up=True, fail_times=99)
        port.publish(QUEUE, retried, tx=None)
        port.publish(QUEUE, doomed, tx=None)

        expected = {*committed, later["job_id"], retried["job_id"]}
        follow_up = str(
            derived_uuid7(
                uuid.UUID(retried["job_id"]).int >> 80, "child", retried["job_id"], TASK, "1"
            )
        )
        expected.add(follow_up)

        def settled() -> bool:
            done = applied(database_url)
            dead = int(query(database_url, "SELECT count(*) FROM core.dead_letters")[0][0])
            return expected <= done.keys() and dead == 1 and outbox_rows(database_url) == 0

        wait_for(settled, timeout=90, message="every committed job applied", worker=worker)
        # the dead-lettered handler's follow-up, had it leaked, would be on the broker by now
        wait_for(
            lambda: not broker_lists(client), timeout=30, message="queues drained", worker=worker
        )
        done = applied(database_url)
        worker.stop()

    client.close()
    assert set(done) == expected, "exactly the committed jobs ran"
    assert [job for job, n in done.items() if n != 1] == []
    assert not set(rolled_back) & set(done)
    assert dropped["job_id"] not in done
    started_at = query(
        database_url,
        "SELECT applied_at FROM public.outbox_effects WHERE job_id = %s",
        later["job_id"],
    )[0][0]
    assert started_at >= due
    runs = dict(
        query(database_url, "SELECT job_id::text, count(*) FROM public.outbox_runs GROUP BY 1")
    )
    assert runs[retried["job_id"]] == 2, "the first attempt failed, the retry committed"
    keys = dict(query(database_url, "SELECT key, count(*) FROM public.outbox_effects GROUP BY 1"))
    assert keys["retried/next"] == 1, "the follow-up ran once, under the derived id"
    assert "doomed/next" not in keys, "a failed handler's follow-up never left"
