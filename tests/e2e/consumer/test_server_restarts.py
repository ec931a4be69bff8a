"""PostgreSQL and Redis restarted while a prefork worker runs jobs: none lost, none twice.

Each job writes one row into ``public.effects`` (no unique key) inside its transaction
and holds that transaction open for a moment, so the stop catches jobs mid-transaction.
"""

from __future__ import annotations

from pathlib import Path

import psycopg2
import pytest
import redis

from platform_tasks.postgres.migrations import migrate
from tests.apps.fault_app import TASK
from tests.conftest import ServerFactory
from tests.e2e.consumer.faults import (
    broker_lists,
    count,
    delays_pending,
    duplicated_effects,
    effect_payload,
    job_ids,
    prepare_effects,
    producer,
    publish_all,
    start_worker,
    wait_for,
)
from tests.support.database import query
from tests.support.processes import CeleryProcess, celery_processes

JOBS = 300
HOLD_MS = 20


def settled(database_url: str, client: redis.Redis) -> bool:
    """Every job applied and nothing left on the broker or in the delay store."""
    return (
        count(database_url, "public.effects") >= JOBS
        and count(database_url, "core.processed_jobs") >= JOBS
        and not broker_lists(client)
        and delays_pending(client) == 0
    )


def assert_each_applied_once(database_url: str, published: list[str]) -> None:
    assert duplicated_effects(database_url) == []
    assert sorted(job_ids(database_url, "SELECT job_id::text FROM public.effects")) == sorted(
        published
    )
    processed = "SELECT job_id::text FROM core.processed_jobs WHERE consumer = %s"
    assert sorted(job_ids(database_url, processed, TASK)) == sorted(published)
    assert count(database_url, "core.processed_jobs") == JOBS
    assert count(database_url, "core.dead_letters") == 0


def stop_midway(worker: CeleryProcess, database_url: str) -> int:
    """Wait until a fifth of the jobs are applied; return how many were applied."""
    wait_for(
        lambda: count(database_url, "public.effects") >= JOBS // 5,
        timeout=60,
        message="a fifth of the jobs applied",
        worker=worker,
    )
    return count(database_url, "public.effects")


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["fast", "immediate"])
def test_postgres_restart_while_jobs_run(
    server_factory: ServerFactory, tmp_path: Path, mode: str
) -> None:
    postgres = server_factory.postgres()
    migrate(postgres.url)
    prepare_effects(postgres.url)
    broker = server_factory.redis(appendfsync="always")
    client = redis.Redis.from_url(broker.url)
    payloads = [effect_payload(hold_ms=HOLD_MS) for _ in range(JOBS)]
    published = [p["job_id"] for p in payloads]

    with celery_processes() as started:
        worker = start_worker(
            started,
            redis_url=broker.url,
            database_url=postgres.url,
            log_path=tmp_path / "worker.log",
        )
        with producer(broker.url, postgres.url) as (_, port):
            publish_all(port, payloads)
        applied_before = stop_midway(worker, postgres.url)
        log_offset = len(worker.log())
        postgres.stop(mode=mode)
        assert applied_before < JOBS * 0.8, "the stop must catch jobs still running"
        worker.wait_for_log("database or Redis unavailable", timeout=30, after=log_offset)
        postgres.start()
        wait_for(
            lambda: settled(postgres.url, client),
            timeout=90,
            message="all jobs applied after the restart",
            worker=worker,
        )
        worker.stop()

    client.close()
    assert_each_applied_once(postgres.url, published)


@pytest.mark.slow
def test_redis_restart_while_jobs_run(
    server_factory: ServerFactory, database_url: str, tmp_path: Path
) -> None:
    prepare_effects(database_url)
    broker = server_factory.redis(appendfsync="always")
    client = redis.Redis.from_url(broker.url)
    payloads = [effect_payload(hold_ms=HOLD_MS) for _ in range(JOBS)]
    published = [p["job_id"] for p in payloads]

    with celery_processes() as started:
        worker = start_worker(
            started,
            redis_url=broker.url,
            database_url=database_url,
            log_path=tmp_path / "worker.log",
        )
        with producer(broker.url, database_url) as (_, port):
            publish_all(port, payloads)
        applied_before = stop_midway(worker, database_url)
        log_offset = len(worker.log())
        broker.stop()  # SIGTERM: Redis writes its append-only file and exits
        assert applied_before < JOBS * 0.8, "the stop must catch jobs still running"
        worker.wait_for_log("Connection to broker lost", timeout=30, after=log_offset)
        broker.start()  # same port, same data directory
        wait_for(
            lambda: settled(database_url, client),
            timeout=90,
            message="all jobs applied after the restart",
            worker=worker,
        )
        worker.stop()

    client.close()
    assert_each_applied_once(database_url, published)


GATE = 4242
"""Advisory lock key the gated jobs of the test below wait on."""


def test_redis_stopped_while_every_slot_is_busy_the_worker_consumes_again_after_it(
    server_factory: ServerFactory, database_url: str, tmp_path: Path
) -> None:
    """Redis stops while both pool processes run a job (the prefetch window is full, so
    the worker has no fetch outstanding); the two jobs finish while Redis is down, so their
    acks cannot reach it. Once Redis is back, the worker must consume again: a new job is
    applied, and the two are each applied once."""
    prepare_effects(database_url)
    broker = server_factory.redis(appendfsync="always")
    client = redis.Redis.from_url(broker.url)
    gated = [effect_payload(gate=GATE) for _ in range(2)]
    later = effect_payload()
    gate = psycopg2.connect(database_url)
    gate.autocommit = True
    try:
        with gate.cursor() as cur:
            cur.execute("SELECT pg_advisory_lock(%s)", (GATE,))
        with celery_processes() as started:
            worker = start_worker(
                started,
                redis_url=broker.url,
                database_url=database_url,
                log_path=tmp_path / "worker.log",
            )
            with producer(broker.url, database_url) as (_, port):
                publish_all(port, gated)
            wait_for(
                lambda: waiting_on_gate(database_url) == 2,
                timeout=60,
                message="both jobs waiting on the gate",
                worker=worker,
            )
            broker.stop()
            with gate.cursor() as cur:
                cur.execute("SELECT pg_advisory_unlock(%s)", (GATE,))
            wait_for(
                lambda: count(database_url, "public.effects") == 2,
                timeout=30,
                message="both gated jobs committed while Redis is down",
                worker=worker,
            )
            broker.start()  # same port, same data directory
            with producer(broker.url, database_url) as (_, port):
                publish_all(port, [later])
            wait_for(
                lambda: later["job_id"] in applied(database_url),
                timeout=60,
                message="a job published after the restart is applied",
                worker=worker,
            )
            wait_for(
                lambda: settled_jobs(database_url, client, 3),
                timeout=60,
                message="nothing left on the broker",
                worker=worker,
            )
            worker.stop()
    finally:
        gate.close()
        client.close()
    published = [p["job_id"] for p in [*gated, later]]
    assert duplicated_effects(database_url) == []
    assert sorted(applied(database_url)) == sorted(published)
    assert count(database_url, "core.dead_letters") == 0


def waiting_on_gate(database_url: str) -> int:
    sql = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objid = %s AND NOT granted"
    return int(query(database_url, sql, GATE)[0][0])


def applied(database_url: str) -> list[str]:
    return job_ids(database_url, "SELECT job_id::text FROM public.effects")


def settled_jobs(database_url: str, client: redis.Redis, jobs: int) -> bool:
    return (
        count(database_url, "core.processed_jobs") >= jobs
        and not broker_lists(client)
        and delays_pending(client) == 0
    )
