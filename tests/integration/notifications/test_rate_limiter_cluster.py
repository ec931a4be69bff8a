"""The notification rate-limit scripts on a real 3-node Redis Cluster.

``PLATFORM_REDIS_CLUSTER=true`` gives the limiter a :class:`RedisCluster` client (the one
the notification setup builds); each script's keys share one hash tag, so each call runs
on the one node that holds the provider's slot. Time is Redis ``TIME`` (no injected
clock), as in production. The cluster is started once for the module.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from redis.cluster import RedisCluster

from platform_tasks.brokers.redis_client import build_redis
from platform_tasks.notifications.limiter import RateLimiter
from platform_tasks.settings import PlatformSettings
from platform_tasks.settings.rate_limits import RateLimit
from tests.support.servers import RedisClusterServers

PROVIDERS = [f"provider{i}" for i in range(12)]


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


@pytest.fixture
def limiter(cluster_client: RedisCluster) -> RateLimiter:
    cluster_client.flushall()
    return RateLimiter(
        cluster_client,
        profile="test",
        provider_limits={name: RateLimit(1, 3600) for name in PROVIDERS},
    )


def test_each_provider_s_keys_are_one_slot_and_providers_spread_over_nodes(
    cluster_client: RedisCluster, limiter: RateLimiter
) -> None:
    nodes = set()
    for provider in PROVIDERS:
        keys = limiter.keys(provider)
        slots = {
            cluster_client.keyslot(key)
            for key in (keys.bucket, keys.pause_alerted, keys.tenant("acme"), keys.tenant("globex"))
        }
        assert len(slots) == 1, provider
        nodes.add(cluster_client.get_node_from_key(keys.bucket).name)
    assert len(nodes) == 3  # the calls below reach every node of the cluster


def test_take_refuses_past_the_buckets_on_every_node(
    cluster_client: RedisCluster, limiter: RateLimiter
) -> None:
    """``limiter``: one request an hour per provider; ``tenants``: one message an hour
    per tenant under a generous provider limit (another profile, so other keys)."""
    tenants = RateLimiter(
        cluster_client,
        profile="tenants",
        provider_limits={name: RateLimit(3600, 1) for name in PROVIDERS},
        tenant_limits={name: RateLimit(1, 3600) for name in PROVIDERS},
    )
    for provider in PROVIDERS:
        assert limiter.take(provider, "acme").granted
        refused = limiter.take(provider, "globex")
        assert (refused.granted, refused.reason) == (False, "provider_rate_limit")
        assert refused.wait_ms > 0
        tokens = cluster_client.hget(limiter.keys(provider).bucket, "tokens")
        assert tokens is not None and float(tokens) < 1
        assert tenants.take(provider, "acme").granted
        refused = tenants.take(provider, "acme")
        assert (refused.granted, refused.reason) == (False, "tenant_rate_limit")
        assert tenants.take(provider, "globex").granted  # acme's empty bucket is acme's


def test_pause_alerts_once_and_back_off_blocks_on_the_cluster(
    cluster_client: RedisCluster, limiter: RateLimiter
) -> None:
    for provider in PROVIDERS:
        assert limiter.pause(provider, 60, "quota")[0] is True
        assert limiter.pause(provider, 60, "quota")[0] is False  # one alert per pause
        assert 0 < limiter.paused_ms(provider) <= 60_000
        assert limiter.take(provider, "acme").reason == "provider_paused"
        assert cluster_client.exists(limiter.keys(provider).pause_alerted) == 1
    other = RateLimiter(
        cluster_client, profile="other", provider_limits={"resend": RateLimit(100, 1)}
    )
    assert other.back_off("resend", 30) == 30_000
    assert other.take("resend", "acme").reason == "provider_backoff"
    assert other.learn("resend", 10) is True
