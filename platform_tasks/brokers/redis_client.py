"""Build the Redis client for leases (and other coordination) from settings.

``PLATFORM_REDIS_CLUSTER=true`` gives a :class:`redis.cluster.RedisCluster`, otherwise a
plain :class:`redis.Redis`. Ownership is explicit: a client built here from the URL is
owned and closed by platform-tasks; a client passed in stays the caller's.
"""

from __future__ import annotations

from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.exceptions import RedisClusterException
from redis.retry import Retry

from platform_tasks.errors import JobStartupError, UnsafeRedisError
from platform_tasks.settings import PlatformSettings, redact_url

__all__ = [
    "REDIS_ERRORS",
    "SAFE_EVICTION_POLICIES",
    "ManagedRedis",
    "build_redis",
    "check_redis_safe",
]

SAFE_EVICTION_POLICIES = frozenset({"noeviction"})
"""Every other policy may evict a lease (all of them carry a TTL) or a marker."""

REDIS_ERRORS: tuple[type[Exception], ...] = (redis.RedisError, RedisClusterException)
"""What a call to the platform's Redis raises when it fails: a :class:`RedisCluster` whose
nodes all stopped answering raises ``RedisClusterException``, which is no ``RedisError``."""


def build_redis(
    settings: PlatformSettings,
    *,
    timeout: float = 5.0,
    connect_timeout: float | None = None,
    single_attempt: bool = False,
) -> Any:
    """A new client for ``settings.redis_url``, cluster-aware when configured.

    Every client of the platform's own Redis (leases, rate limits, delivery counts) is
    built here, so ``PLATFORM_REDIS_CLUSTER=true`` reaches all of them; the broker's Redis
    is never a cluster and keeps its plain client. ``single_attempt`` turns off
    redis-py's retries (three, with back-off, by default): a call then fails after one
    ``timeout``, for readers that would rather look again later than wait.
    """
    options: dict[str, Any] = {
        "socket_timeout": timeout,
        "socket_connect_timeout": timeout if connect_timeout is None else connect_timeout,
    }
    if single_attempt:
        options["retry"] = Retry(NoBackoff(), 0)
    if settings.redis_cluster:
        return RedisCluster.from_url(settings.redis_url, **options)
    return redis.Redis.from_url(settings.redis_url, **options)


class ManagedRedis:
    """A Redis client with its ownership: ``close()`` only closes what we built."""

    def __init__(self, settings: PlatformSettings, client: Any | None = None) -> None:
        self.owned = client is None
        if client is None:
            try:
                client = build_redis(settings)  # a RedisCluster connects right here
            except REDIS_ERRORS as exc:
                raise JobStartupError(
                    f"PLATFORM_REDIS_URL: Redis Cluster {redact_url(settings.redis_url)} is "
                    f"unreachable (PLATFORM_REDIS_CLUSTER=true): {exc}"
                ) from exc
        self.client = client

    def close(self) -> None:
        if self.owned:
            self.client.close()


def _policy_of(reply: Any) -> str:
    for key, value in dict(reply).items():
        name = key.decode() if isinstance(key, bytes) else str(key)
        if name == "maxmemory-policy":
            return value.decode() if isinstance(value, bytes) else str(value)
    return ""


def _policies(client: Any) -> list[str]:
    """The eviction policy of every node that holds keys (each primary of a cluster)."""
    if isinstance(client, RedisCluster):
        return [
            _policy_of(node.redis_connection.config_get("maxmemory-policy"))
            for node in client.get_primaries()  # type: ignore[no-untyped-call]
        ]
    return [_policy_of(client.config_get("maxmemory-policy"))]


def check_redis_safe(client: Any, *, setting: str = "PLATFORM_REDIS_URL") -> None:
    """Refuse a Redis that is unreachable or may evict job keys; raise naming ``setting``."""
    try:
        client.ping()
        policies = _policies(client)
    except redis.RedisError as exc:
        raise JobStartupError(f"{setting}: Redis is unreachable: {exc}") from exc
    unsafe = sorted({policy for policy in policies if policy not in SAFE_EVICTION_POLICIES})
    if unsafe:
        raise UnsafeRedisError(
            f"{setting}: maxmemory-policy {', '.join(unsafe)} may evict scheduled-job keys "
            "(an evicted marker or lease would allow a duplicate run); set "
            "maxmemory-policy noeviction"
        )
