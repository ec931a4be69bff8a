"""Promote due delayed jobs onto a Redis broker's queues, from every worker (and beat).

The promotion pass for a Redis broker is :class:`RedisPromotion`: one atomic script per
batch moves due entries from the delay store onto the broker's lists, so running it in many
processes at once is safe and a killed process loses nothing. :class:`DelayPromoter` runs it
in the one promotion loop every broker shares
(:class:`~platform_tasks.publishing.promotion_loop.PromotionLoop`: thread, back-off, logging).

This module also picks the promoter a broker needs (:func:`delay_promoter_for`) and runs it
in every worker (:class:`DelayPromoterStep`).
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any, Protocol

import redis
from celery import bootsteps

from platform_tasks.brokers.delay_location import DelayStoreLocation, delay_store_location
from platform_tasks.brokers.selection import broker_kind
from platform_tasks.brokers.server_time import reply_ms
from platform_tasks.observability.scheduler_metrics import delay_promoted, observe_delay_store
from platform_tasks.publishing.delay_store import DelayStore
from platform_tasks.publishing.promotion_loop import PassLog, PromotionLoop, wait_until_next_due
from platform_tasks.settings import PlatformSettings

if TYPE_CHECKING:
    from platform_tasks.kernel import PlatformCelery

logger = logging.getLogger(__name__)


class RedisPromotion:
    """The promotion pass onto a Redis broker: measure the store (when metrics are served),
    then promote until nothing more is due."""

    log = PassLog(
        logger,
        promoted="promoted delayed jobs",
        failed="delay promotion failed (%s); retrying",
        failed_unexpectedly="delay promotion failed unexpectedly; retrying",
    )
    expected_errors: tuple[type[Exception], ...] = (redis.RedisError,)

    def __init__(self, settings: PlatformSettings, stopping: threading.Event | None = None) -> None:
        self.settings = settings
        self.stopping = stopping if stopping is not None else threading.Event()
        self._client: Any = None  # a redis.Redis, as the store's location makes it
        self._store: DelayStore | None = None

    @property
    def interval(self) -> float:
        return self.settings.delay_poll_interval_seconds

    def open(self) -> None:
        """Connect to the broker's Redis, where the delay store lives beside the queues."""
        location = DelayStoreLocation.on_redis_broker(self.settings)
        self._client = location.connect(timeout=10, connect_timeout=5)
        self._store = DelayStore(self._client, location.keys)

    def run_pass(self) -> tuple[int, float]:
        if self._store is None:
            raise RuntimeError("RedisPromotion.run_pass before open()")
        if self.settings.metrics_port is not None:
            self.measure(self._store)  # before promoting: the lag promotion leaves
        return self.promote(self._store)

    def close(self) -> None:
        client, self._client, self._store = self._client, None, None
        if client is not None:
            client.close()

    def measure(self, store: DelayStore) -> None:
        """Set the delay gauges: entries waiting and how overdue the oldest due one is,
        judged by Redis time (one round trip)."""
        with store.client.pipeline(transaction=False) as pipe:
            pipe.zcard(store.keys.schedule)
            pipe.zrange(store.keys.schedule, 0, 0, withscores=True)
            pipe.time()
            waiting, first, time_reply = pipe.execute()
        oldest = int(first[0][1]) if first else None
        observe_delay_store(int(waiting), oldest, reply_ms(time_reply))

    def promote(self, store: DelayStore) -> tuple[int, float]:
        """Promote until nothing more is due; return how many entries were moved and how
        many seconds to sleep before the next pass (see :func:`wait_until_next_due`).

        The promote script reports when the earliest entry left is due, so waking for it
        costs no round trip beyond the promotion itself."""
        interval = self.interval
        moved = 0
        wait = interval
        while not self.stopping.is_set():
            result = store.promote_due(self.settings.delay_batch_size)
            moved += result.moved
            if result.moved:
                delay_promoted(result.moved)
            wait = wait_until_next_due(result.next_due_in_ms, interval)
            if not result.more_due:
                break
        return moved, wait


class DelayPromoter(PromotionLoop[RedisPromotion]):
    """The promotion loop running :class:`RedisPromotion`: a background thread that moves
    due entries onto a Redis broker's queues until stopped."""

    def __init__(
        self, settings: PlatformSettings, *, name: str = "platform-delay-promoter"
    ) -> None:
        super().__init__(RedisPromotion(settings), name=name)
        self.settings = settings

    def measure(self, store: DelayStore) -> None:
        """See :meth:`RedisPromotion.measure`."""
        self.promotion.measure(store)

    def promote_pass(self, store: DelayStore) -> tuple[int, float]:
        """One pass over ``store`` (see :meth:`RedisPromotion.promote`), for callers that
        hold their own store: tests and benchmarks."""
        return self.promotion.promote(store)

    def run_once(self, store: DelayStore) -> int:
        """Promote until nothing more is due; return how many entries were moved."""
        return self.promote_pass(store)[0]

    def start(self) -> None:
        """Start the loop, unless the broker is not Redis: there is then no delay store on
        the broker to promote from (RabbitMQ holds delays itself, or in the platform's
        Redis, promoted by
        :class:`~platform_tasks.publishing.rabbitmq_delay_promoter.RabbitMQDelayPromoter`)."""
        if broker_kind(self.settings.effective_broker_url) != "redis":
            return
        super().start()


class Promoter(Protocol):
    """What a worker or beat needs of a promoter: start it, stop it."""

    def start(self) -> None: ...

    def stop(self, timeout: float = 10.0) -> None: ...


def delay_promoter_for(
    app: PlatformCelery, *, name: str = "platform-delay-promoter"
) -> Promoter | None:
    """The promoter this app's broker needs, or ``None`` when RabbitMQ holds delays itself.

    A Redis broker: :class:`DelayPromoter` (atomic, onto the broker's lists). RabbitMQ with
    ``PLATFORM_RABBITMQ_DELAYS=delay_store``: a
    :class:`~platform_tasks.publishing.rabbitmq_delay_promoter.RabbitMQDelayPromoter` (publisher
    confirms, at least once). RabbitMQ's native delayed delivery needs none.
    """
    settings: PlatformSettings = app.platform_settings
    location = delay_store_location(settings)
    if location is None:
        return None
    if location.kind == "redis":
        return DelayPromoter(settings, name=name)
    # imported only here: it loads the PostgreSQL driver (dead letters), which an app
    # whose delays need no RabbitMQ promoter should not pay for at startup
    from platform_tasks.publishing.rabbitmq_delay_promoter import RabbitMQDelayPromoter

    return RabbitMQDelayPromoter(app, name=name)


class DelayPromoterStep(bootsteps.StartStopStep):
    """Worker bootstep: runs the broker's delay promoter in the worker's main process."""

    label = "platform delay promoter"

    def __init__(self, worker: Any, **kwargs: Any) -> None:
        super().__init__(worker, **kwargs)
        self.promoter: Promoter | None = None

    def start(self, worker: Any) -> None:
        self.promoter = delay_promoter_for(worker.app)
        if self.promoter is not None:
            self.promoter.start()

    def stop(self, worker: Any) -> None:
        if self.promoter is not None:
            self.promoter.stop()

    def shutdown(self, worker: Any) -> None:
        self.stop(worker)

    def terminate(self, worker: Any) -> None:
        """A cold shutdown (``WorkController.terminate``, Celery's embedded test worker)
        stops the promoter too: ``StartStopStep.terminate`` only stops a step's ``obj``."""
        self.stop(worker)


def install(app: PlatformCelery) -> None:
    """Run a promoter in every worker of ``app``."""
    app.steps["worker"].add(DelayPromoterStep)
