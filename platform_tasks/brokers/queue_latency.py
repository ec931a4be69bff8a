"""Queue gauges measured when ``/metrics`` is scraped: length, latency, dead letters.

- ``celery_queue_length{queue_name}`` — messages waiting in the broker queue (Redis: the
  queue's lists, every priority, and on a fair queue its tenant lanes; RabbitMQ: the
  queue's ready count), celery-exporter's name
- ``platform_queue_latency_seconds{queue}`` — age of the oldest job waiting in the queue:
  now minus the ready time its message carries (``platform_published_at``, set at
  publish, and for a scheduled job or a retry the time it became due); 0 for an empty
  queue. The oldest job is the one at the head of the queue, the next to be taken: on
  Redis the tail of each priority list, read without taking it, and on a fair queue the
  oldest of its tenant lanes' heads, whose ready times the fair transport keeps in a
  sorted set (``fair_lane_parts.lua``). Measured on Redis brokers; RabbitMQ cannot show
  a message without delivering it, so there it is absent.
- ``platform_queue_runnable{queue}`` — of those messages, the jobs a new worker could
  start now: 0 for a paused queue, else the length less the jobs back from a concurrency
  cap that is still full (what the layers above count, through :func:`set_parked_reader`:
  :mod:`platform_tasks.consumer.runnable`). Jobs waiting in the delay store (delays,
  retries, throttles, caps) are on no queue, so none of these gauges counts them. The
  signal to autoscale workers on (docs/autoscaling.md); absent when the platform's Redis
  cannot be read
- ``platform_dead_letters_pending{queue}`` — ``pending_review`` rows of
  ``core.dead_letters``, read at most every :data:`DEAD_LETTER_REFRESH_SECONDS`

The queues are the ones the app declares and the platform routes to (the ones a worker
started without ``-Q`` consumes); other names are summed under ``unknown``. Only the
worker's main process measures, on the scrape, so a deployment pays nothing between
scrapes and the numbers are never older than the scrape. Delay-store lag is
``platform_delay_promotion_lag_seconds`` (:mod:`platform_tasks.observability.scheduler_metrics`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from platform_tasks.app_state import AppState
from platform_tasks.headers import PUBLISHED_AT_HEADER
from platform_tasks.keys import fair_lane_keys
from platform_tasks.observability.metrics import add_exposition_registrar

if TYPE_CHECKING:
    from platform_tasks.kernel import PlatformCelery

__all__ = [
    "DEAD_LETTER_REFRESH_SECONDS",
    "NotRunnable",
    "ParkedReader",
    "QueueCollector",
    "register_queue_metrics",
    "set_parked_reader",
]

logger = logging.getLogger(__name__)

DEAD_LETTER_REFRESH_SECONDS = 15.0
UNKNOWN = "unknown"
_PENDING_SQL = (
    "SELECT queue, count(*) FROM core.dead_letters WHERE status = 'pending_review' GROUP BY queue"
)


@dataclass(frozen=True)
class NotRunnable:
    """What waits on the broker but no worker could start now: the paused queues, and
    per queue the jobs back from a concurrency cap that is still full."""

    paused: frozenset[str] = frozenset()
    blocked: Mapping[str, int] = field(default_factory=dict)

    def runnable(self, queue: str, length: int) -> int:
        return 0 if queue in self.paused else max(0, length - self.blocked.get(queue, 0))


ParkedReader = Callable[[Sequence[str]], NotRunnable]
"""Called with the measured queues on a scrape; raises when it cannot read (the
runnable gauge is then left out rather than wrong)."""

_PARKED: AppState[ParkedReader] = AppState("platform_parked_reader")
"""Kept on the app: pauses and caps belong to the layers above the broker's."""


def set_parked_reader(app: PlatformCelery, reader: ParkedReader) -> None:
    """Have the runnable gauge of ``app`` leave out what ``reader`` says cannot start."""
    _PARKED.set(app, reader)


def queues_of(app: PlatformCelery) -> list[str]:
    """The queues to measure: declared, routed to by the platform, with a retry policy."""
    from platform_tasks.brokers.worker_queues import platform_queues

    names = dict.fromkeys(platform_queues(app))
    names.update(dict.fromkeys(getattr(app.amqp, "queues", None) or {}))
    names.update(dict.fromkeys(getattr(app, "retry_policies", None) or {}))
    return list(names)


def message_ready_at(raw: bytes | str | None) -> float | None:
    """The ready time a Redis wire message carries, if it is a platform message."""
    if raw is None:
        return None
    try:
        message = json.loads(raw)
        value = message.get("headers", {}).get(PUBLISHED_AT_HEADER)
    except (ValueError, AttributeError):
        return None
    return float(value) if isinstance(value, int | float) else None


class QueueCollector(Collector):
    """Reads the broker (and PostgreSQL) when scraped; one per worker main process."""

    def __init__(self, app: PlatformCelery, *, clock: Callable[[], float] = time.time) -> None:
        self.app = app
        self._clock = clock
        self._lock = threading.Lock()
        self._connection: Any = None
        self._pending: tuple[float, dict[str, int]] | None = None
        self._pending_failed = False
        self._parked_failed = False

    # -- broker -------------------------------------------------------------------------

    def _channel(self) -> Any:
        if self._connection is None:
            self._connection = self.app.connection_for_read()
        return self._connection.default_channel

    def _reset(self) -> None:
        if self._connection is not None:
            with contextlib.suppress(Exception):  # already broken: nothing to release
                self._connection.release()
            self._connection = None

    def _redis_queue(self, channel: Any, queue: str) -> tuple[int, float | None]:
        """Length over the queue's priority lists and tenant lanes, and the oldest ready
        time at their heads.

        A fair queue (``PLATFORM_FAIR_QUEUES``) keeps most of its backlog on tenant lanes,
        not on its list: the lanes' count and their oldest head count too, else a fair
        queue's length and latency would read 0 while jobs wait. The fetch script keeps
        the ready time of every lane's head in a sorted set, so the oldest is one
        ``ZRANGE`` whatever the number of tenants: one round trip, a few hundred bytes,
        and at most one JSON message decoded per priority list.
        """
        keys = [channel._q_for_pri(queue, pri) for pri in channel.priority_steps]
        pipe = channel.client.pipeline(transaction=False)
        for key in keys:
            lanes = fair_lane_keys(key)
            pipe.llen(key)
            pipe.lindex(key, -1)  # consumers pop from the right: the next job out
            pipe.get(lanes.waiting)
            pipe.zrange(lanes.heads, 0, 0, withscores=True)
        replies = pipe.execute()
        length = sum(int(n) for n in replies[0::4])
        length += sum(max(0, int(n)) for n in replies[2::4] if n is not None)
        ready = [t for t in (message_ready_at(raw) for raw in replies[1::4]) if t is not None]
        ready.extend(float(score) for oldest in replies[3::4] for _, score in oldest)
        return length, (min(ready) if ready else None)

    def _amqp_length(self, channel: Any, queue: str) -> int | None:
        try:
            _, count, _ = channel.queue_declare(queue=queue, passive=True)
        except Exception:  # not declared yet: the channel is closed by the broker
            self._reset()
            return None
        return int(count)

    def _broker(self, queues: Iterable[str]) -> Iterator[tuple[str, int, float | None, bool]]:
        """``(queue, length, oldest ready time, whether the head could be read)``."""
        channel = self._channel()
        redis_like = hasattr(channel, "_q_for_pri") and hasattr(channel, "client")
        for queue in queues:
            if redis_like:
                length, ready_at = self._redis_queue(channel, queue)
                yield queue, length, ready_at, True
            else:
                count = self._amqp_length(channel, queue)
                if count is not None:
                    yield queue, count, None, False
                channel = self._channel()

    # -- dead letters -------------------------------------------------------------------

    def _dead_letters(self, queues: set[str]) -> dict[str, int] | None:
        url = getattr(self.app.platform_settings, "database_url", None)
        if not url:
            return None
        now = time.monotonic()
        if self._pending is not None and now - self._pending[0] < DEAD_LETTER_REFRESH_SECONDS:
            return self._pending[1]
        import psycopg2

        try:
            conn = psycopg2.connect(url, connect_timeout=5)
            try:
                with conn, conn.cursor() as cur:
                    cur.execute(_PENDING_SQL)
                    rows = cur.fetchall()
            finally:
                conn.close()
        except psycopg2.Error as exc:
            if not self._pending_failed:
                logger.warning(
                    "cannot count pending dead letters (%s)",
                    type(exc).__name__,
                    extra={"event": "metrics.dead_letters_unavailable"},
                )
            self._pending_failed = True
            return self._pending[1] if self._pending else None
        self._pending_failed = False
        counts = dict.fromkeys(queues, 0)
        for queue, count in rows:
            label = queue if queue in queues else UNKNOWN
            counts[label] = counts.get(label, 0) + int(count)
        self._pending = (now, counts)
        return counts

    # -- runnable -----------------------------------------------------------------------

    def _not_runnable(self, queues: Sequence[str]) -> NotRunnable | None:
        reader = _PARKED.get(self.app)
        if reader is None:
            return NotRunnable()
        try:
            parked = reader(queues)
        except Exception as exc:
            if not self._parked_failed:  # once per outage, not on every scrape
                logger.warning(
                    "cannot read paused queues and full caps (%s); runnable gauge left out",
                    type(exc).__name__,
                    extra={"event": "metrics.runnable_unavailable"},
                )
            self._parked_failed = True
            return None
        self._parked_failed = False
        return parked

    # -- collect ------------------------------------------------------------------------

    def collect(self) -> Iterator[Metric]:
        length = GaugeMetricFamily(
            "celery_queue_length", "The number of message in broker queue.", labels=["queue_name"]
        )
        latency = GaugeMetricFamily(
            "platform_queue_latency_seconds",
            "Age of the oldest job waiting in the queue (0 when it is empty).",
            labels=["queue"],
        )
        pending = GaugeMetricFamily(
            "platform_dead_letters_pending",
            "Dead letters pending review, by queue.",
            labels=["queue"],
        )
        runnable = GaugeMetricFamily(
            "platform_queue_runnable",
            "Jobs waiting in the queue that a new worker could start now (0 when paused).",
            labels=["queue"],
        )
        with self._lock:
            queues = queues_of(self.app)
            parked = self._not_runnable(queues)
            now = self._clock()
            try:
                for queue, count, ready_at, head_read in self._broker(queues):
                    length.add_metric([queue], count)
                    if parked is not None:
                        runnable.add_metric([queue], parked.runnable(queue, count))
                    if head_read and (ready_at is not None or count == 0):
                        age = 0.0 if ready_at is None else max(0.0, now - ready_at)
                        latency.add_metric([queue], age)
            except Exception as exc:
                logger.warning(
                    "cannot read queue lengths from the broker (%s)",
                    type(exc).__name__,
                    extra={"event": "metrics.queues_unavailable"},
                )
                self._reset()
            counts = self._dead_letters(set(queues))
            for queue, count in sorted((counts or {}).items()):
                pending.add_metric([queue], count)
        yield length
        yield runnable
        yield latency
        yield pending


_registered: dict[int, QueueCollector] = {}


def register_queue_metrics(
    app: PlatformCelery, registry: CollectorRegistry | None = None
) -> QueueCollector:
    """Add the queue gauges of ``app`` to ``registry`` (default: the global one), once."""
    target = registry if registry is not None else REGISTRY
    collector = _registered.get(id(target))
    if collector is None:
        collector = QueueCollector(app)
        target.register(collector)
        _registered[id(target)] = collector
    return collector


def install(app: PlatformCelery) -> None:
    """Serve ``app``'s queue gauges on its worker's ``/metrics`` endpoint."""
    add_exposition_registrar(app, register_queue_metrics)
