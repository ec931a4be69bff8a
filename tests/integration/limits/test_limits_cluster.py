"""The limits' scripts on a real 3-node Redis Cluster (``PLATFORM_REDIS_CLUSTER=true``).

A lease set is one key per script call; a throttle's two buckets share one hash tag; the
pipelines that count waiting jobs span slots (a cluster pipeline splits them by node).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from redis.cluster import RedisCluster

from platform_tasks.brokers.redis_client import build_redis
from platform_tasks.keys import throttle_key_bucket, throttle_total_bucket
from platform_tasks.limits import Rate
from platform_tasks.limits.concurrency import ConcurrencyLeases, Lease
from platform_tasks.limits.throttle import Throttles
from platform_tasks.settings import PlatformSettings
from tests.support.servers import RedisClusterServers


@pytest.fixture(scope="module")
def cluster_client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisCluster]:
    servers = RedisClusterServers(tmp_path_factory.mktemp("cluster"))
    try:
        servers.start()
        settings = PlatformSettings.build(redis_url=servers.url, redis_cluster=True)
        client = build_redis(settings)
        assert isinstance(client, RedisCluster)
        yield client
        client.close()
    finally:
        servers.stop()


def test_caps_and_throttles_work_on_a_cluster(cluster_client: RedisCluster) -> None:
    cluster_client.flushall()
    leases = ConcurrencyLeases(cluster_client, profile="test")
    for tenant in ("a", "b", "c", "d"):
        assert leases.acquire_and_track("t", tenant, f"{tenant}1", 1, 60_000, 1_000)[0].granted
        decision, waiting = leases.acquire_and_track("t", tenant, f"{tenant}2", 1, 60_000, 1_000)
        assert not decision.granted and waiting >= 1
    assert leases.renew([Lease(leases.key("t", "a"), "a1", 60_000)]) == 0
    throttles = Throttles(cluster_client, profile="test")
    assert cluster_client.keyslot(throttle_total_bucket("test", "t")) == cluster_client.keyslot(
        throttle_key_bucket("test", "t", "a")
    )
    assert throttles.take("t", "a", Rate(1, 60), Rate(100, 1)).granted
    assert throttles.take("t", "a", Rate(1, 60), Rate(100, 1)).reason == "throttle"
    assert throttles.take("t", "b", Rate(1, 60), None).granted
    assert not throttles.take("t", "b", Rate(1, 60), None).granted


def test_redis_time_reads_one_clock_on_a_cluster(cluster_client: RedisCluster) -> None:
    from platform_tasks.brokers.server_time import redis_now_ms, redis_time, reply_ms

    now = redis_now_ms(cluster_client)
    assert isinstance(now, int) and now > 1_700_000_000_000
    assert now <= redis_time(cluster_client) * 1000 < now + 60_000
    per_node = cluster_client.time(target_nodes=RedisCluster.ALL_NODES)
    assert isinstance(per_node, dict) and len(per_node) == 3
    assert now <= reply_ms(per_node) < now + 60_000
