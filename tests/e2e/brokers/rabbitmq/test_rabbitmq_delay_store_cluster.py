"""The RabbitMQ delay store on a Redis Cluster: ``PLATFORM_BROKER_URL=amqp://…``,
``PLATFORM_RABBITMQ_DELAYS=delay_store`` and ``PLATFORM_REDIS_CLUSTER=true`` with
``PLATFORM_REDIS_URL`` a real 3-node cluster the harness starts.

The store's keys carry one hash tag, so the claim, removal and release scripts each touch
one slot; a plain client would be answered ``MOVED`` by two of the three nodes. The
worker starts as the README says (``celery -A tests.apps.consumer_app worker``, no
``-Q``); the test app counts handler runs on the session's single Redis
(``CONSUMER_TEST_RUNS_REDIS_URL``), because its counter is not cluster-aware.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
import redis
from redis.cluster import RedisCluster

from platform_tasks import QueuePort, create_app
from platform_tasks.keys import rabbitmq_delay_keys
from platform_tasks.settings import PlatformSettings
from platform_tasks.testing.servers import wait_until
from tests.apps.consumer_app import QUEUE, runs_key
from tests.e2e.brokers.rabbitmq.conftest import Workers, applied
from tests.e2e.brokers.rabbitmq.test_rabbitmq_broker import job
from tests.support.servers import RedisClusterServers

KEYS = rabbitmq_delay_keys("test")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterServers]:
    servers = RedisClusterServers(tmp_path_factory.mktemp("cluster"))
    try:
        yield servers.start()
    finally:
        servers.stop()


@pytest.fixture
def cluster_client(cluster: RedisClusterServers) -> Iterator[RedisCluster]:
    client = RedisCluster.from_url(cluster.url)
    client.flushall()
    yield client
    client.close()


def test_delays_and_retries_wait_on_the_cluster_and_apply_once(
    cluster: RedisClusterServers,
    cluster_client: RedisCluster,
    broker_settings: PlatformSettings,
    workers: Workers,
    redis_url: str,
    redis_client: redis.Redis,
) -> None:
    settings = broker_settings.model_copy(
        update={
            "redis_url": cluster.url,
            "redis_cluster": True,
            "rabbitmq_delays": "delay_store",
        }
    )
    database_url = str(settings.database_url)
    workers.env.update(
        PLATFORM_REDIS_URL=cluster.url,
        PLATFORM_REDIS_CLUSTER="true",
        PLATFORM_RABBITMQ_DELAYS="delay_store",
        CONSUMER_TEST_RUNS_REDIS_URL=redis_url,
    )
    app = create_app("rabbitmq_cluster_store_producer", settings=settings, task_default_queue=QUEUE)
    port = QueuePort(app)
    try:
        run_at = datetime.now(UTC) + timedelta(seconds=30)  # stays stored while we look
        waiting = port.schedule(QUEUE, job("waiting"), run_at)
        slots = {cluster_client.keyslot(KEYS.schedule), cluster_client.keyslot(KEYS.entries)}
        assert len(slots) == 1, "the store's keys share one slot"
        assert int(cluster_client.zcard(KEYS.schedule)) == 1
        assert redis_client.exists(KEYS.schedule, KEYS.entries) == 0, "nothing on the single Redis"

        workers.start("w1")
        soon = port.schedule(QUEUE, job("soon"), datetime.now(UTC) + timedelta(seconds=1))
        retried = port.publish(QUEUE, job("retried", fail_times=1))
        wait_until(
            lambda: applied(database_url, soon) == 1 and applied(database_url, retried) == 1,
            timeout=90,
            message="delayed and retried jobs applied",
        )
        assert int(redis_client.get(runs_key(retried)) or 0) == 2, "one failure, one retry"
        wait_until(
            lambda: int(cluster_client.zcard(KEYS.schedule)) == 1,
            timeout=30,
            message="published entries removed from the cluster's store",
        )
        assert applied(database_url, waiting) == 0, "the job due later still waits"
        assert applied(database_url, soon) == 1 and int(redis_client.get(runs_key(soon))) == 1
    finally:
        port.close()
        app.close()
