"""Prometheus gauge of the jobs waiting on each fair queue, by tenant (top N only).

``platform_queue_waiting_by_tenant{queue, tenant}``: jobs waiting in the tenant lanes of
a fair queue (``PLATFORM_FAIR_QUEUES``) for the ``TOP_TENANTS`` tenants with the most,
plus ``tenant="(other)"`` for the sum of the rest, ``tenant="(arriving)"`` for jobs
published but not yet sorted onto lanes and ``tenant="(none)"`` for jobs without a
tenant (labels no tenant id can take: parentheses are outside the tenant pattern). A
queue with 100,000 tenants still gives at most ``TOP_TENANTS + 3`` series: labels stay
bounded whatever tenants publish.

Read at scrape time by the worker's main process, so the numbers are Redis's at that
moment and cost nothing between scrapes. A scrape costs a few round trips and reads
``TOP_TENANTS`` names per priority list whatever the number of tenants: the fair
transport keeps each list's lane lengths in a sorted set (``fair_lane_parts.lua``), so
the largest lanes are one ``ZREVRANGE`` and the rest is the ``waiting`` counter minus
them.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

import redis
from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from platform_tasks.brokers.transport.fair_lanes import (
    ALL_QUEUES,
    waiting_by_tenant,
    waiting_in_lanes,
)
from platform_tasks.keys import FAIR_SEPARATOR
from platform_tasks.observability.metrics import add_exposition_registrar

if TYPE_CHECKING:
    from platform_tasks.kernel import PlatformCelery

logger = logging.getLogger("platform_tasks.transport")

TOP_TENANTS = 10
OTHER = "(other)"
ARRIVING = "(arriving)"
DEFAULT_LANE = "(none)"
"""Label of the lane of jobs without a tenant (the empty tenant id)."""
PRIORITY_STEPS = (0, 3, 6, 9)


def list_keys(queue: str, prefix: str = "", steps: Sequence[int] = PRIORITY_STEPS) -> list[str]:
    """The Redis lists of ``queue``, one per priority step, named as kombu names them."""
    return [f"{prefix}{queue}{FAIR_SEPARATOR}{pri}" if pri else f"{prefix}{queue}" for pri in steps]


class FairQueueCollector(Collector):
    """Collects ``platform_queue_waiting_by_tenant`` for the app's fair queues."""

    def __init__(
        self, app: PlatformCelery, client: redis.Redis | None = None, top: int = TOP_TENANTS
    ):
        self.app = app
        self.top = top
        self._client = client
        options = app.conf.broker_transport_options or {}
        self.prefix = str(options.get("global_keyprefix") or "")
        self.steps = tuple(options.get("priority_steps") or PRIORITY_STEPS)

    def queues(self) -> list[str]:
        configured = list(self.app.platform_settings.fair_queues)
        if ALL_QUEUES not in configured:
            return configured
        names = {str(name) for name in self.app.amqp.queues}
        names.add(str(self.app.conf.task_default_queue))
        return sorted(names)

    def client(self) -> redis.Redis:
        if self._client is None:
            url = self.app.platform_settings.effective_broker_url
            self._client = redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)
        return self._client

    def collect(self) -> Iterator[GaugeMetricFamily]:
        gauge = GaugeMetricFamily(
            "platform_queue_waiting_by_tenant",
            f"Jobs waiting on a fair queue by tenant (the {self.top} largest, '(other)' for "
            "the rest, '(arriving)' for jobs not yet sorted onto lanes).",
            labels=["queue", "tenant"],
        )
        try:
            for queue in self.queues():
                keys = list_keys(queue, self.prefix, self.steps)
                for tenant, count in self.waiting(keys):
                    gauge.add_metric([queue, tenant], count)
        except redis.RedisError as exc:
            logger.warning(
                "fair queue gauge skipped: %s", exc, extra={"event": "metrics.fair_queue_skipped"}
            )
            return
        yield gauge

    def waiting(self, keys: list[str]) -> list[tuple[str, int]]:
        client = self.client()
        top = list(waiting_by_tenant(client, keys, limit=self.top).items())
        rest = max(0, waiting_in_lanes(client, keys) - sum(count for _, count in top))
        pipe = client.pipeline(transaction=False)
        for key in keys:
            pipe.llen(key)
        arriving = sum(int(n) for n in pipe.execute())
        rows = [(tenant or DEFAULT_LANE, count) for tenant, count in top]
        return [*rows, (OTHER, rest), (ARRIVING, arriving)]


def _register(app: PlatformCelery, registry: CollectorRegistry | None) -> None:
    (registry if registry is not None else REGISTRY).register(FairQueueCollector(app))


def install(app: PlatformCelery) -> None:
    """Serve the waiting-by-tenant gauge on the worker's ``/metrics`` when a queue is fair."""
    if app.platform_settings.fair_queues:
        add_exposition_registrar(app, _register)
