"""A replayed job delivered before the replay commits still gets its fresh start.

The replay command publishes while it holds the dead-letter row and marks it replayed
at commit; the consumer's read of that row must wait for the commit instead of seeing
it still pending.
"""

from __future__ import annotations

import threading

import psycopg2

from platform_tasks.dead_letters.dead_letter import insert_dead_letter
from platform_tasks.dead_letters.records import latest_dead_letter
from platform_tasks.envelope import uuid7
from platform_tasks.testing.servers import wait_until


def test_consumer_read_waits_for_the_replay_commit(database_url: str) -> None:
    job_id = uuid7()
    setup = psycopg2.connect(database_url)
    with setup, setup.cursor() as cur:
        row_id = insert_dead_letter(
            cur,
            job_id=job_id,
            queue="q",
            kind="billing.charge",
            tenant_id="t",
            payload={"job_id": str(job_id)},
            attempts=5,
            last_error="boom",
            error_type="RuntimeError",
            reason="retries_exhausted",
            correlation_id="c",
        )
    setup.close()

    replay = psycopg2.connect(database_url)
    replay_cur = replay.cursor()
    replay_cur.execute("SELECT id FROM core.dead_letters WHERE id = %s FOR UPDATE", (row_id,))

    seen: list[tuple[int, str] | None] = []
    consumer = psycopg2.connect(database_url)

    def consume() -> None:
        with consumer, consumer.cursor() as cur:
            seen.append(latest_dead_letter(cur, job_id, "billing.charge"))

    reader = threading.Thread(target=consume)
    reader.start()
    probe = psycopg2.connect(database_url)
    probe.autocommit = True

    def consumer_waits() -> bool:
        with probe.cursor() as cur:
            cur.execute("SELECT count(*) FROM pg_locks WHERE NOT granted")
            return bool(cur.fetchone()[0] > 0)

    wait_until(consumer_waits, timeout=10, message="the consumer waiting on the row lock")
    assert seen == [], "the consumer read the row before the replay committed"
    replay_cur.execute("UPDATE core.dead_letters SET status = 'replayed' WHERE id = %s", (row_id,))
    replay.commit()
    reader.join(10)
    assert seen == [(row_id, "replayed")]
    for conn in (replay, consumer, probe):
        conn.close()
