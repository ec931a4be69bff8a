"""PlatformTask consumers with ``PLATFORM_REDIS_CLUSTER=true`` on a real 3-node cluster.

The platform's own Redis (``PLATFORM_REDIS_URL``) is a Redis Cluster started by the
harness; the broker (``PLATFORM_BROKER_URL``) is the harness's single Redis, because a
Redis Cluster cannot be a broker (kombu has no cluster transport). The test app counts
handler runs on that single Redis. The worker starts as
the README says (``celery -A app worker``, no ``-Q``). It counts failed attempts and
redeliveries on the cluster: a plain client there answers ``MOVED`` for the keys of two
of the three nodes. The cluster is started once for the module.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.cluster import RedisCluster

from platform_tasks import QueuePort, create_app
from platform_tasks.brokers.redis_client import build_redis
from platform_tasks.consumer.attempts import DeliveryCounter
from platform_tasks.envelope import uuid7
from platform_tasks.keys import delivery_keys
from platform_tasks.settings import PlatformSettings
from platform_tasks.testing.servers import wait_until
from tests.apps.consumer_app import QUEUE, WORK_TABLE_SQL, runs_key
from tests.conftest import REPO_ROOT
from tests.support.database import query
from tests.support.processes import CeleryProcess, celery_processes, platform_env, worker_argv
from tests.support.servers import RedisClusterServers

MAX_ATTEMPTS = 3
CONSUMER = "tests.consumer.apply"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterServers]:
    servers = RedisClusterServers(tmp_path_factory.mktemp("cluster"))
    try:
        yield servers.start()
    finally:
        servers.stop()


@pytest.fixture
def cluster_settings(
    cluster: RedisClusterServers, redis_url: str, database_url: str
) -> Iterator[PlatformSettings]:
    client = RedisCluster.from_url(cluster.url)
    client.flushall()  # every primary
    client.close()
    yield PlatformSettings.build(
        redis_url=cluster.url,
        redis_cluster=True,
        broker_url=redis_url,
        database_url=database_url,
        profile="test",
    )


def payload(key: str, **data: Any) -> dict[str, Any]:
    return {
        "job_id": str(uuid7()),
        "tenant_id": "t1",
        "kind": CONSUMER,
        "data": {"key": key, **data},
    }


def test_delivery_counts_live_on_the_cluster_one_slot_per_job(
    cluster_settings: PlatformSettings,
) -> None:
    """Every counter call (pipelines and transactions included) works on the cluster."""
    client = build_redis(cluster_settings)
    assert isinstance(client, RedisCluster)
    keys = delivery_keys(cluster_settings.profile)
    counter = DeliveryCounter(client, keys)
    jobs = [str(uuid7()) for _ in range(12)]
    slots = {client.keyslot(keys.deliveries(CONSUMER, job)) for job in jobs}
    nodes = {client.get_node_from_key(keys.deliveries(CONSUMER, job)).name for job in jobs}
    assert len(slots) > 1 and len(nodes) > 1  # the jobs' counts spread over the nodes
    try:
        for job in jobs:
            assert counter.observe(CONSUMER, job, redelivered=False, ttl_seconds=60).spent == 0
            counter.failed(CONSUMER, job, ttl_seconds=60)
            state = counter.observe(CONSUMER, job, redelivered=True, ttl_seconds=60)
            assert (state.spent, state.tracked, state.exhausted) == (2, True, False)
            counter.undo(CONSUMER, job)
            counter.exhaust(CONSUMER, job, ttl_seconds=60)
            state = counter.observe(CONSUMER, job, redelivered=False, ttl_seconds=60)
            assert (state.spent, state.exhausted) == (1, True)
            counter.restart(CONSUMER, job, generation=7, ttl_seconds=60)
            state = counter.observe(CONSUMER, job, redelivered=False, ttl_seconds=60)
            assert (state.spent, state.exhausted, state.generation) == (0, False, 7)
            assert 0 < client.ttl(keys.deliveries(CONSUMER, job)) <= 60
            counter.forget(CONSUMER, job)
            assert client.exists(keys.deliveries(CONSUMER, job)) == 0
    finally:
        client.close()


@pytest.fixture
def worker(
    cluster_settings: PlatformSettings, redis_url: str, tmp_path: Path
) -> Iterator[CeleryProcess]:
    env = platform_env(
        redis_url=cluster_settings.redis_url,
        database_url=str(cluster_settings.database_url),
        extra={
            "PLATFORM_REDIS_CLUSTER": "true",
            "PLATFORM_BROKER_URL": str(cluster_settings.broker_url),
            "PLATFORM_VISIBILITY_TIMEOUT_SECONDS": "5",
            "PLATFORM_DELAY_POLL_INTERVAL_SECONDS": "0.1",
            "CONSUMER_TEST_MAX_ATTEMPTS": str(MAX_ATTEMPTS),
            "CONSUMER_TEST_RUNS_REDIS_URL": redis_url,
        },
    )
    with celery_processes() as started:
        argv = worker_argv("tests.apps.consumer_app", concurrency=2)
        proc = CeleryProcess(argv, env=env, cwd=REPO_ROOT, log_path=tmp_path / "worker.log")
        started.append(proc.start())
        proc.wait_for_log("ready.", timeout=60)
        yield proc


def test_a_worker_applies_retries_and_dead_letters_with_the_cluster(
    cluster_settings: PlatformSettings, worker: CeleryProcess, redis_client: redis.Redis
) -> None:
    database_url = str(cluster_settings.database_url)
    query(database_url, WORK_TABLE_SQL)
    query(database_url, "TRUNCATE public.consumer_work")
    producer = create_app("cluster_e2e_producer", settings=cluster_settings)
    port = QueuePort(producer)
    jobs = {
        "ok": payload("ok"),
        "retried": payload("retried", fail_times=1),
        "failing": payload("failing", fail_times=1000),
        "crashing": payload("crashing", crash_times=1000),
    }
    try:
        for job in jobs.values():
            port.publish(QUEUE, job)
    finally:
        port.close()
        producer.close()

    def settled() -> bool:
        (done,) = query(database_url, "SELECT count(*) FROM core.processed_jobs")[0]
        (dead,) = query(database_url, "SELECT count(*) FROM core.dead_letters")[0]
        return (done, dead) == (2, 2)

    try:
        wait_until(settled, timeout=120, interval=0.2, message="2 applied, 2 dead-lettered")
    except TimeoutError as exc:
        raise AssertionError(f"{exc}\n--- worker log ---\n{worker.log()[-6000:]}") from exc
    applied = query(database_url, "SELECT job_id::text FROM public.consumer_work ORDER BY 1")
    assert sorted(row[0] for row in applied) == sorted(
        [jobs["ok"]["job_id"], jobs["retried"]["job_id"]]
    )
    assert int(redis_client.get(runs_key(jobs["retried"]["job_id"]))) == 2
    rows = query(database_url, "SELECT job_id::text, reason, attempts FROM core.dead_letters")
    letters = {row[0]: (row[1], row[2]) for row in rows}
    assert letters == {
        jobs["failing"]["job_id"]: ("retries_exhausted", MAX_ATTEMPTS),
        jobs["crashing"]["job_id"]: ("crash_loop", MAX_ATTEMPTS),
    }
    for name in ("failing", "crashing"):
        assert int(redis_client.get(runs_key(jobs[name]["job_id"]))) == MAX_ATTEMPTS
    # the counts are on the cluster (the dead-lettered jobs' hashes stay, marked done)
    client = build_redis(cluster_settings)
    try:
        keys = delivery_keys(cluster_settings.profile)
        failing = client.hgetall(keys.deliveries(CONSUMER, jobs["failing"]["job_id"]))
        crashing = client.hgetall(keys.deliveries(CONSUMER, jobs["crashing"]["job_id"]))
        assert failing[b"done"] == b"1" and int(failing[b"f"]) == MAX_ATTEMPTS
        # three crashes, three counted redeliveries: the third is refused, not run
        assert crashing[b"done"] == b"1" and int(crashing[b"c"]) == MAX_ATTEMPTS
        assert client.exists(keys.deliveries(CONSUMER, jobs["retried"]["job_id"])) == 0
        assert redis_client.keys("platform:test:consumer:*") == []  # none on the single Redis
    finally:
        client.close()
    assert "MovedError" not in worker.log()
