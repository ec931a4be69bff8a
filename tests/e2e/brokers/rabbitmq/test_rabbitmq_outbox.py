"""Publishing in a transaction with RabbitMQ as the broker: the relay publishes with
publisher confirms, and the outbox's guarantees hold as on Redis.

One scenario, two worker starts: rows committed (and rolled back) while no worker runs,
the first worker SIGKILLed while its relay drains them, then a second worker that drains
the rest, runs a ``schedule(tx=)`` through RabbitMQ's delayed delivery, and a handler
whose follow-up leaves only with a committed attempt.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg2
import pytest

from platform_tasks.fanout.ids import derived_uuid7
from tests.apps.outbox_app import QUEUE, TASK
from tests.e2e.publishing.outbox import (
    applied,
    effect,
    outbox_rows,
    prepare,
    producer,
    start_worker,
    wait_for,
)
from tests.support.database import query
from tests.support.processes import celery_processes

PUBLISHES = 600


@pytest.mark.slow
def test_outbox_on_rabbitmq_commits_run_once_rollbacks_never_kills_lose_nothing(
    rabbitmq_url: str, redis_url: str, database_url: str, tmp_path: Path
) -> None:
    prepare(database_url)
    broker = {"PLATFORM_BROKER_URL": rabbitmq_url}
    committed, rolled_back = [], []
    with celery_processes() as started, producer(rabbitmq_url, redis_url, database_url) as port:
        conn = psycopg2.connect(database_url)
        for n in range(PUBLISHES):
            payload = effect(f"client-{n}")
            port.publish(QUEUE, payload, tx=conn)
            if n % 10 < 3:
                conn.rollback()
                rolled_back.append(payload["job_id"])
            else:
                conn.commit()
                committed.append(payload["job_id"])
        conn.close()
        waiting = outbox_rows(database_url)
        assert waiting == len(committed)

        first = start_worker(
            started,
            redis_url,
            database_url,
            tmp_path / "first.log",
            PLATFORM_OUTBOX_BATCH_SIZE="1",
            **broker,
        )
        wait_for(
            lambda: outbox_rows(database_url) < waiting,
            timeout=60,
            message="the relay is draining",
            worker=first,
            interval=0.01,
        )
        first.kill_group()
        left_after_kill = outbox_rows(database_url)

        worker = start_worker(started, redis_url, database_url, tmp_path / "second.log", **broker)
        due = datetime.now(UTC) + timedelta(seconds=2)
        later = effect("scheduled")
        with psycopg2.connect(database_url) as c:
            port.schedule(QUEUE, later, due, tx=c)
        c.close()
        retried = effect("retried", follow_up=True, fail_times=1)
        doomed = effect("doomed", follow_up=True, fail_times=99)
        port.publish(QUEUE, retried, tx=None)
        port.publish(QUEUE, doomed, tx=None)
        follow_up = str(
            derived_uuid7(
                uuid.UUID(retried["job_id"]).int >> 80, "child", retried["job_id"], TASK, "1"
            )
        )
        expected = {*committed, later["job_id"], retried["job_id"], follow_up}

        def settled() -> bool:
            dead = int(query(database_url, "SELECT count(*) FROM core.dead_letters")[0][0])
            return (
                expected <= applied(database_url).keys()
                and dead == 1
                and outbox_rows(database_url) == 0
            )

        wait_for(settled, timeout=180, message="every committed job applied", worker=worker)
        done = applied(database_url)
        worker.stop()

    assert left_after_kill > 0, "the kill must catch the relay with rows still waiting"
    assert set(done) == expected, "exactly the committed jobs ran"
    assert [job for job, n in done.items() if n != 1] == []
    assert not set(rolled_back) & set(done)
    started_at = query(
        database_url,
        "SELECT applied_at FROM public.outbox_effects WHERE job_id = %s",
        later["job_id"],
    )[0][0]
    assert started_at >= due
    keys = dict(query(database_url, "SELECT key, count(*) FROM public.outbox_effects GROUP BY 1"))
    assert keys["retried/next"] == 1
    assert "doomed/next" not in keys
