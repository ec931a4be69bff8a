"""Admission on a real 3-node Redis Cluster that stops answering: points are skipped.

"Redis trouble skips triggers; it never runs a job without coordination" holds for
``PLATFORM_REDIS_CLUSTER=true`` too. With every node down, redis-py's cluster client
raises ``RedisClusterException``, which is no ``RedisError``. Time is driven by explicit
ticks. The cluster is started once for the module (this test stops and restarts it).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from redis.cluster import RedisCluster

from platform_tasks.brokers.redis_client import build_redis
from platform_tasks.errors import JobStartupError
from platform_tasks.jobs.runtime import start_jobs
from platform_tasks.settings import PlatformSettings
from platform_tasks.testing import JobTestScheduler
from platform_tasks.testing.servers import free_port
from tests.integration.jobs.conftest import RECORDING_JOB
from tests.support.servers import RedisClusterServers

START = datetime(2025, 1, 1, 12, 0, 0, tzinfo=UTC)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterServers]:
    servers = RedisClusterServers(tmp_path_factory.mktemp("cluster"))
    try:
        yield servers.start()
    finally:
        servers.stop()


def test_a_cluster_outage_skips_the_point_and_admission_resumes_after(
    cluster: RedisClusterServers, jobs_dir, redis_url: str
) -> None:
    settings = PlatformSettings.build(redis_url=cluster.url, redis_cluster=True)
    client = build_redis(settings, timeout=2)
    assert isinstance(client, RedisCluster)
    # the job records its runs on the single Redis, apart from the cluster
    folder = jobs_dir(
        {"tick.py": RECORDING_JOB.format(url=redis_url, schedule="interval=timedelta(minutes=1)")}
    )
    scheduler = JobTestScheduler(jobs_dir=folder, redis=client, started_at=START)
    try:
        cluster.stop()
        at = datetime(2025, 1, 1, 12, 1, tzinfo=UTC)
        assert [r.outcome for r in scheduler.tick(at=at)] == ["skipped_redis_error"]
        cluster.restart()
        at = datetime(2025, 1, 1, 12, 2, tzinfo=UTC)
        assert [(r.outcome, r.run) for r in scheduler.tick(at=at)] == [("admitted", "succeeded")]
        # admitted, then the cluster goes away before the start check: the run is skipped
        at = datetime(2025, 1, 1, 12, 3, tzinfo=UTC)
        assert [r.outcome for r in scheduler.tick(at=at, run=False)] == ["admitted"]
        cluster.stop()
        assert [(r.outcome, r.run) for r in scheduler.finish()] == [
            ("admitted", "skipped_redis_error")
        ]
        cluster.restart()  # the same client reconnects (the nodes keep no data: no AOF)
        at = datetime(2025, 1, 1, 12, 4, tzinfo=UTC)
        assert [(r.outcome, r.run) for r in scheduler.tick(at=at)] == [("admitted", "succeeded")]
    finally:
        client.close()


def test_an_unreachable_cluster_at_start_up_is_a_clear_error(jobs_dir, redis_url: str) -> None:
    """Before, a raw ``RedisClusterException`` traceback stopped ``celery worker``."""
    dead = f"redis://:s3cret-pass@127.0.0.1:{free_port()}/0"
    folder = jobs_dir(
        {"tick.py": RECORDING_JOB.format(url=redis_url, schedule="interval=timedelta(minutes=1)")}
    )
    settings = PlatformSettings.build(redis_url=dead, redis_cluster=True, jobs_dir=folder)
    with pytest.raises(JobStartupError, match="PLATFORM_REDIS_URL") as caught:
        start_jobs(settings, app_name="a", role="worker")
    assert "unreachable" in str(caught.value)
    assert "s3cret-pass" not in str(caught.value)
