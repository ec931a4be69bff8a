"""The outbox relay under faults: its worker SIGKILLed mid-drain, PostgreSQL and Redis
restarted while committed rows wait. Every committed job runs exactly once (counted in
PostgreSQL: ``public.outbox_effects`` has no unique key, so a job applied twice shows
as two rows)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import psycopg2
import pytest
import redis

from platform_tasks import QueuePort
from platform_tasks.postgres.migrations import migrate
from tests.apps.outbox_app import QUEUE
from tests.conftest import ServerFactory
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
from tests.support.processes import celery_processes, worker_argv

ROWS = 5000
KILLS = 5
RELAY_ONLY = worker_argv(
    "tests.apps.outbox_app", queues="outbox.relay_only", concurrency=1, hostname="relay@%h"
)
"""The worker that is killed relays and consumes nothing (``-Q`` a queue no job goes to):
the kills land in the relay, and the jobs it published are applied meanwhile by a
consuming worker that is never killed (``PLATFORM_OUTBOX_RELAY=false``)."""
SMALL_BATCHES = {"PLATFORM_OUTBOX_BATCH_SIZE": "1"}
"""One row per batch: a drain takes a round trip per row, so a kill lands in the middle."""
RELAY_BATCHES = {"PLATFORM_OUTBOX_BATCH_SIZE": "10"}
"""Small batches: a drain takes hundreds of round trips, so every kill lands mid-drain,
often between a batch's publish and its commit (the batch is then published again)."""
CONSUMER = worker_argv(
    "tests.apps.outbox_app", pool="threads", concurrency=4, hostname="consumer@%h"
)
"""The consuming worker (its relay turned off): threads, as the handler waits on
PostgreSQL more than it computes."""


def commit_rows(port: QueuePort, database_url: str, count: int, per_tx: int = 500) -> list[str]:
    """``count`` jobs due now, committed ``per_tx`` to a transaction (``schedule_many`` with
    ``tx``: one insert per page of rows; a job already due is a plain published row);
    their job ids."""
    published: list[str] = []
    conn = psycopg2.connect(database_url)
    try:
        while len(published) < count:
            now = datetime.now(UTC)
            page = [
                effect(f"row-{len(published) + n}")
                for n in range(min(per_tx, count - len(published)))
            ]
            with conn:
                port.schedule_many(QUEUE, [(payload, now) for payload in page], tx=conn)
            published += [payload["job_id"] for payload in page]
    finally:
        conn.close()
    return published


def assert_each_applied_once(database_url: str, published: list[str]) -> None:
    done = applied(database_url)
    assert len(published) == len(set(published))
    assert sorted(done) == sorted(published), "no committed job lost, none invented"
    assert [job for job, n in done.items() if n != 1] == [], "no job applied twice"
    assert outbox_rows(database_url) == 0


@pytest.mark.slow
def test_sigkill_the_relaying_worker_five_times_while_rows_drain(
    redis_url: str, database_url: str, tmp_path: Path
) -> None:
    prepare(database_url)
    client = redis.Redis.from_url(redis_url)
    step = ROWS // (KILLS + 1)
    kills_mid_drain = 0
    with celery_processes() as started:
        consumer = start_worker(
            started,
            redis_url,
            database_url,
            tmp_path / "consumer.log",
            CONSUMER,
            PLATFORM_OUTBOX_RELAY="false",
        )
        with producer(redis_url, redis_url, database_url) as port:
            published = commit_rows(port, database_url, ROWS)
        assert outbox_rows(database_url) == ROWS
        for kill in range(KILLS):
            waiting = outbox_rows(database_url)
            relay = start_worker(
                started,
                redis_url,
                database_url,
                tmp_path / f"relay-{kill}.log",
                RELAY_ONLY,
                **RELAY_BATCHES,
            )
            wait_for(
                lambda waiting=waiting: outbox_rows(database_url) <= waiting - step,
                timeout=60,
                message="the relay is draining",
                worker=relay,
                interval=0.01,
            )
            relay.kill_group()  # SIGKILL: the relay's open batch is rolled back
            if outbox_rows(database_url):
                kills_mid_drain += 1
        relay = start_worker(
            started, redis_url, database_url, tmp_path / "relay-last.log", RELAY_ONLY
        )
        wait_for(
            lambda: (
                len(applied(database_url)) >= ROWS
                and not outbox_rows(database_url)
                and not broker_lists(client)
            ),
            timeout=180,
            message="every committed row applied after the kills",
            worker=consumer,
        )
        relay.stop()
        consumer.stop()
    client.close()
    assert kills_mid_drain == KILLS, "every kill caught the relay with rows still waiting"
    assert_each_applied_once(database_url, published)


@pytest.mark.slow
def test_postgres_and_redis_restarts_while_rows_wait(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    postgres = server_factory.postgres()
    migrate(postgres.url)
    prepare(postgres.url)
    broker = server_factory.redis(appendfsync="always")
    client = redis.Redis.from_url(broker.url)
    published: list[str] = []
    with celery_processes() as started, producer(broker.url, broker.url, postgres.url) as port:
        worker = start_worker(
            started, broker.url, postgres.url, tmp_path / "worker.log", **SMALL_BATCHES
        )
        # the producer's message builder connects to the broker once, when first used
        published += commit_rows(port, postgres.url, 1)
        # Redis stopped: committed rows wait in the outbox while the relay cannot publish
        offset = len(worker.log())
        broker.stop()
        published += commit_rows(port, postgres.url, 300)
        worker.wait_for_log("outbox relay failed", timeout=30, after=offset)
        assert outbox_rows(postgres.url) >= 300
        broker.start()
        wait_for(
            lambda: len(applied(postgres.url)) >= 301 and not outbox_rows(postgres.url),
            timeout=120,
            message="the rows committed during the Redis outage applied",
            worker=worker,
        )
        # PostgreSQL stopped while the relay drains: what it took is published again
        published += commit_rows(port, postgres.url, 1000)
        wait_for(
            lambda: outbox_rows(postgres.url) < 1000,
            timeout=30,
            message="the relay is draining",
            worker=worker,
            interval=0.01,
        )
        offset = len(worker.log())
        postgres.stop(mode="immediate")
        worker.wait_for_log("outbox relay failed", timeout=30, after=offset)
        postgres.start()
        wait_for(
            lambda: (
                len(applied(postgres.url)) >= 1301
                and not outbox_rows(postgres.url)
                and not broker_lists(client)
            ),
            timeout=180,
            message="every committed row applied after the restarts",
            worker=worker,
        )
        worker.stop()
    client.close()
    assert_each_applied_once(postgres.url, published)
