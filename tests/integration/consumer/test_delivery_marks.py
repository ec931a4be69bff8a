"""Delivery marks: a first delivery skips the Redis read only when no earlier delivery left
state there, against the real PostgreSQL and Redis."""

from __future__ import annotations

import threading
import uuid
from typing import Any

import psycopg2
import redis

from platform_tasks.consumer import idempotency
from platform_tasks.consumer.marks import DeliveryMarks
from platform_tasks.envelope import uuid7
from platform_tasks.keys import delivery_keys
from platform_tasks.postgres.database import Database
from platform_tasks.settings import PlatformSettings
from platform_tasks.testing.servers import wait_until
from tests.integration.consumer.conftest import Harness

CONSUMER = "tests.it.apply"


def autocommit(url: str) -> Any:
    conn = psycopg2.connect(url)
    conn.autocommit = True
    return conn


def test_a_claim_granted_after_a_failing_holder_sees_the_holders_mark(
    settings: PlatformSettings,
) -> None:
    """The copy that waited on the claim reads the mark the holder committed before its
    rollback: the look runs after the claim is granted, not with the claim's snapshot."""
    url = str(settings.database_url)
    job = uuid.UUID(str(uuid7()))
    holder, waiter = autocommit(url), autocommit(url)
    got: dict[str, tuple[bool, bool]] = {}
    try:
        with holder.cursor() as cur:
            assert idempotency.claim_and_look(cur, job, CONSUMER) == (True, False)

        def second_copy() -> None:
            with waiter.cursor() as cur:
                got["waiter"] = idempotency.claim_and_look(cur, job, CONSUMER)

        thread = threading.Thread(target=second_copy)
        thread.start()
        waiter_pid = waiter.info.backend_pid
        with autocommit(url) as watcher, watcher.cursor() as cur:

            def waiting_on_the_claim() -> bool:
                cur.execute(
                    "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (waiter_pid,)
                )
                row = cur.fetchone()
                return row is not None and row[0] == "Lock"

            wait_until(waiting_on_the_claim, timeout=30, message="second copy to wait on the claim")
        marks = DeliveryMarks(Database(url, autocommit=True))
        marks.mark(CONSUMER, str(job))  # the holder's failed attempt: mark, count, roll back
        with holder.cursor() as cur:
            cur.execute("ROLLBACK")
        thread.join(timeout=30)
        assert not thread.is_alive()
        assert got["waiter"] == (True, True)
        marks.database.discard()
    finally:
        holder.close()
        waiter.close()


def test_the_claim_answers_claimed_and_marked(settings: PlatformSettings) -> None:
    url = str(settings.database_url)
    fresh, applied, dead = (uuid.UUID(str(uuid7())) for _ in range(3))
    conn = autocommit(url)
    try:
        with conn.cursor() as cur:
            assert idempotency.claim_and_look(cur, applied, CONSUMER) == (True, False)
            cur.execute("COMMIT")
            assert idempotency.claim_and_look(cur, applied, CONSUMER)[0] is False
            cur.execute("ROLLBACK")
            cur.execute(
                "INSERT INTO core.dead_letters (job_id, payload) VALUES (%s, '{}')", (str(dead),)
            )
            assert idempotency.claim_and_look(cur, dead, CONSUMER) == (True, True)
            cur.execute("ROLLBACK")
            assert idempotency.claim_and_look(cur, fresh, CONSUMER) == (True, False)
            cur.execute("ROLLBACK")
            cur.execute("SET default_transaction_isolation = 'repeatable read'")
            # the snapshot would predate the claim: always read Redis
            assert idempotency.claim_and_look(cur, fresh, CONSUMER) == (True, True)
            cur.execute("ROLLBACK")
    finally:
        conn.close()


def test_a_healthy_job_leaves_no_mark_and_a_failed_attempt_leaves_one(
    harness: Harness, redis_client: redis.Redis
) -> None:
    def payload(**data: Any) -> dict[str, Any]:
        return {
            "job_id": str(uuid7()),
            "tenant_id": "t",
            "correlation_id": "c",
            "kind": CONSUMER,
            "data": {"key": "k", **data},
        }

    healthy, failing = payload(), payload(fail=True)
    assert harness.apply(healthy).state == "SUCCESS"
    assert harness.apply(failing).state == "RETRY"
    marks = harness.rows("SELECT job_id::text, consumer FROM core.delivery_marks")
    assert marks == [(failing["job_id"], CONSUMER)]
    assert redis_client.exists(delivery_keys("test").deliveries(CONSUMER, failing["job_id"]))
    # the duplicate copy of the failed job reads the count: it runs as attempt 2
    assert harness.apply(failing).state == "RETRY"
    assert (
        redis_client.hget(delivery_keys("test").deliveries(CONSUMER, failing["job_id"]), "f")
        == b"2"
    )
