"""A PlatformTask job waits, unacknowledged, while the platform's Redis Cluster is down.

``PLATFORM_REDIS_CLUSTER=true`` on a real 3-node cluster, the broker a single Redis (a
cluster cannot be the broker). With every node stopped, redis-py's cluster client raises
``RedisClusterException`` (redis-py 8: its subclass ``RedisClusterUnreachableError``),
which is not a ``RedisError``: the consumer must judge it
"servers unavailable" (a warning, the delivery waits) rather than a failed consumer step
(an error with a traceback, alerting like a bug), and apply the job once the cluster is
back. Its own module because it stops the
cluster it starts.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from platform_tasks import QueuePort, create_app
from platform_tasks.settings import PlatformSettings
from platform_tasks.testing.servers import wait_until
from tests.apps.consumer_app import QUEUE, WORK_TABLE_SQL
from tests.conftest import REPO_ROOT
from tests.e2e.consumer.test_redis_cluster import payload, query
from tests.support.processes import (
    CeleryProcess,
    celery_processes,
    platform_env,
    start_worker,
    worker_argv,
)
from tests.support.servers import RedisClusterServers

CLUSTER_DOWN_WAITING = "database or Redis unavailable (RedisCluster"
"""The warning of a delivery that waits for the cluster: the error's class name follows
(``RedisClusterException``, or its subclass ``RedisClusterUnreachableError`` from
redis-py 8), never the error log of a failed consumer step."""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterServers]:
    servers = RedisClusterServers(tmp_path_factory.mktemp("cluster"))
    try:
        yield servers.start()
    finally:
        servers.stop()


def test_a_job_waits_while_the_cluster_is_down_and_is_applied_once_after(
    cluster: RedisClusterServers, redis_url: str, database_url: str, tmp_path: Path
) -> None:
    settings = PlatformSettings.build(
        redis_url=cluster.url,
        redis_cluster=True,
        broker_url=redis_url,
        database_url=database_url,
        profile="test",
    )
    query(database_url, WORK_TABLE_SQL)
    query(database_url, "TRUNCATE public.consumer_work")
    env = platform_env(
        redis_url=cluster.url,
        database_url=database_url,
        extra={
            "PLATFORM_REDIS_CLUSTER": "true",
            "PLATFORM_BROKER_URL": redis_url,
            "CONSUMER_TEST_RUNS_REDIS_URL": redis_url,
        },
    )
    producer = create_app("cluster_outage_producer", settings=settings)
    port = QueuePort(producer)

    def applied() -> int:
        return int(query(database_url, "SELECT count(*) FROM public.consumer_work")[0][0])

    with celery_processes() as started:
        worker = start_worker(
            started,
            "tests.apps.consumer_app",
            env=env,
            cwd=REPO_ROOT,
            log_path=tmp_path / "worker.log",
            ready_timeout=60,
        )
        try:
            port.publish(QUEUE, payload("before"))  # the pool process builds its client
            wait_until(lambda: applied() == 1, timeout=60, message="first job applied")
            cluster.stop()
            job = payload("during")
            port.publish(QUEUE, job)
            # judged "servers unavailable" (a warning), not a failed consumer step (an error)
            worker.wait_for_log(CLUSTER_DOWN_WAITING, timeout=60)
            assert applied() == 1
            assert query(database_url, "SELECT count(*) FROM core.dead_letters") == [(0,)]
            cluster.restart()
            wait_until(
                lambda: applied() == 2,
                timeout=90,
                interval=0.2,
                message="job applied after the cluster came back",
            )
        except (TimeoutError, AssertionError) as exc:
            raise AssertionError(f"{exc}\n--- worker log ---\n{worker.log()[-6000:]}") from exc
        finally:
            port.close()
            producer.close()
    assert "a consumer step failed" not in worker.log()
    rows = query(database_url, "SELECT job_id::text FROM core.processed_jobs")
    assert (job["job_id"],) in rows and len(rows) == 2
    assert query(database_url, "SELECT count(*) FROM core.dead_letters") == [(0,)]


def test_a_pool_process_whose_first_job_finds_the_cluster_down_waits_then_applies(
    cluster: RedisClusterServers, redis_url: str, database_url: str, tmp_path: Path
) -> None:
    """The pool process builds its cluster client at its first job: no node is up then.

    The worker itself starts with the cluster up (its start-up check refuses an
    unreachable one, see ``tests/integration/jobs/test_cluster_outage.py``)."""
    settings = PlatformSettings.build(
        redis_url=cluster.url,
        redis_cluster=True,
        broker_url=redis_url,
        database_url=database_url,
        profile="test",
    )
    query(database_url, WORK_TABLE_SQL)
    query(database_url, "TRUNCATE public.consumer_work")
    env = platform_env(
        redis_url=cluster.url,
        database_url=database_url,
        extra={
            "PLATFORM_REDIS_CLUSTER": "true",
            "PLATFORM_BROKER_URL": redis_url,
            "CONSUMER_TEST_RUNS_REDIS_URL": redis_url,
        },
    )
    producer = create_app("cluster_outage_producer", settings=settings)
    port = QueuePort(producer)
    jobs = [payload(f"early{i}") for i in range(2)]
    with celery_processes() as started:
        worker = CeleryProcess(
            worker_argv("tests.apps.consumer_app", concurrency=1),
            env=env,
            cwd=REPO_ROOT,
            log_path=tmp_path / "worker.log",
        )
        started.append(worker.start())
        try:
            worker.wait_for_log("ready.", timeout=60)
            cluster.stop()
            for job in jobs:
                port.publish(QUEUE, job)
            worker.wait_for_log(CLUSTER_DOWN_WAITING, timeout=60)
            assert query(database_url, "SELECT count(*) FROM core.processed_jobs") == [(0,)]
            cluster.restart()
            wait_until(
                lambda: query(database_url, "SELECT count(*) FROM core.processed_jobs") == [(2,)],
                timeout=90,
                interval=0.2,
                message="both jobs applied",
            )
        except (TimeoutError, AssertionError) as exc:
            raise AssertionError(f"{exc}\n--- worker log ---\n{worker.log()[-6000:]}") from exc
        finally:
            port.close()
            producer.close()
    rows = query(database_url, "SELECT job_id::text FROM public.consumer_work ORDER BY 1")
    assert rows == sorted((job["job_id"],) for job in jobs)
    assert query(database_url, "SELECT count(*) FROM core.dead_letters") == [(0,)]
    assert "a consumer step failed" not in worker.log()
