"""PostgreSQL and Redis restarted while a prefork worker runs jobs: none lost, none twice.

Each job writes one row into ``public.effects`` (no unique key) inside its transaction
and holds that transaction open for a moment, so the stop catches jobs mid-transaction.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from platform_tasks.migrations import migrate
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
    wait_for(lambda: count(database_url, "public.effects") >= JOBS // 5, timeout=60,
             message="a fifth of the jobs applied", worker=worker)  # fmt: skip
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
        worker = start_worker(started, redis_url=broker.url, database_url=postgres.url,
                              log_path=tmp_path / "worker.log")  # fmt: skip
        with producer(broker.url, postgres.url) as (_, port):
            publish_all(port, payloads)
        applied_before = stop_midway(worker, postgres.url)
        log_offset = len(worker.log())
        postgres.stop(mode=mode)
        assert applied_before < JOBS * 0.8, "the stop must catch jobs still running"
        worker.wait_for_log("database or Redis unavailable", timeout=30, after=log_offset)
        postgres.start()
        wait_for(lambda: settled(postgres.url, client), timeout=90,
                 message="all jobs applied after the restart", worker=worker)  # fmt: skip
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
        worker = start_worker(started, redis_url=broker.url, database_url=database_url,
                              log_path=tmp_path / "worker.log")  # fmt: skip
        with producer(broker.url, database_url) as (_, port):
            publish_all(port, payloads)
        applied_before = stop_midway(worker, database_url)
        log_offset = len(worker.log())
        broker.stop()  # SIGTERM: Redis writes its append-only file and exits
        assert applied_before < JOBS * 0.8, "the stop must catch jobs still running"
        worker.wait_for_log("Connection to broker lost", timeout=30, after=log_offset)
        broker.start()  # same port, same data directory
        wait_for(lambda: settled(database_url, client), timeout=90,
                 message="all jobs applied after the restart", worker=worker)  # fmt: skip
        worker.stop()

    client.close()
    assert_each_applied_once(database_url, published)
