"""Promote due delayed jobs from inside every worker (and beat) process.

Delays must be delivered while at least one worker runs, without requiring beat, so each
worker runs a small promoter thread. Promotion is one atomic script per batch, so running
it in many processes at once is safe and a killed process loses nothing.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any, Protocol

import redis
from celery import bootsteps

from platform_tasks.keys import delay_keys
from platform_tasks.observability.scheduler_metrics import delay_promoted, observe_delay_store
from platform_tasks.publishing.delay_store import DelayStore
from platform_tasks.settings import PlatformSettings

if TYPE_CHECKING:
    from platform_tasks.app import PlatformCelery

logger = logging.getLogger(__name__)

MIN_WAIT_SECONDS = 0.005
"""The shortest sleep between passes, so a promoter never spins on entries due within
a few milliseconds of each other."""


def wait_until_next_due(next_due_in_ms: int | None, interval: float) -> float:
    """Seconds to sleep after a pass: until the earliest entry left is due, so staggered
    delays come back at their own time rather than in poll-interval batches; at most the
    poll interval, so entries other processes add meanwhile are seen within it as before;
    at least :data:`MIN_WAIT_SECONDS`."""
    if next_due_in_ms is None:
        return interval
    return min(interval, max(MIN_WAIT_SECONDS, next_due_in_ms / 1000))


class DelayPromoter:
    """A background thread that promotes due entries until stopped."""

    def __init__(
        self, settings: PlatformSettings, *, name: str = "platform-delay-promoter"
    ) -> None:
        self.settings = settings
        self.name = name
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.moved_total = 0

    def measure(self, store: DelayStore) -> None:
        """Set the delay gauges: entries waiting and how overdue the oldest due one is,
        judged by Redis time (one round trip)."""
        with store.client.pipeline(transaction=False) as pipe:
            pipe.zcard(store.keys.schedule)
            pipe.zrange(store.keys.schedule, 0, 0, withscores=True)
            pipe.time()
            waiting, first, (seconds, micros) = pipe.execute()
        oldest = int(first[0][1]) if first else None
        observe_delay_store(int(waiting), oldest, int(seconds) * 1000 + int(micros) // 1000)

    def promote_pass(self, store: DelayStore) -> tuple[int, float]:
        """Promote until nothing more is due; return how many entries were moved and how
        many seconds to sleep before the next pass (see :func:`wait_until_next_due`).

        The promote script reports when the earliest entry left is due, so waking for it
        costs no round trip beyond the promotion itself."""
        interval = self.settings.delay_poll_interval_seconds
        moved = 0
        wait = interval
        while not self._stop.is_set():
            result = store.promote_due(self.settings.delay_batch_size)
            moved += result.moved
            if result.moved:
                delay_promoted(result.moved)
            wait = wait_until_next_due(result.next_due_in_ms, interval)
            if not result.more_due:
                break
        return moved, wait

    def run_once(self, store: DelayStore) -> int:
        """Promote until nothing more is due; return how many entries were moved."""
        return self.promote_pass(store)[0]

    def _loop(self) -> None:
        client = redis.Redis.from_url(
            self.settings.effective_broker_url, socket_timeout=10, socket_connect_timeout=5
        )
        store = DelayStore(client, delay_keys(self.settings.profile))
        interval = self.settings.delay_poll_interval_seconds
        measured = self.settings.metrics_port is not None
        failures = 0
        try:
            while not self._stop.is_set():
                wait = interval
                try:
                    if measured:
                        self.measure(store)  # before promoting: the lag promotion leaves
                    moved, wait = self.promote_pass(store)
                    failures = 0
                    if moved:
                        self.moved_total += moved
                        logger.debug(
                            "promoted delayed jobs",
                            extra={"event": "delay.promoted", "count": moved},
                        )
                except redis.RedisError as exc:
                    failures += 1
                    logger.warning(
                        "delay promotion failed (%s); retrying",
                        exc,
                        extra={"event": "delay.promote_failed"},
                    )
                except Exception:  # never end the thread: this worker's delays would stall
                    failures += 1
                    logger.exception(
                        "delay promotion failed unexpectedly; retrying",
                        extra={"event": "delay.promote_failed"},
                    )
                if failures:
                    wait = min(30.0, interval * 2 ** min(failures, 6))
                self._stop.wait(wait)
        finally:
            client.close()

    def start(self) -> None:
        from platform_tasks.brokers.selection import broker_kind

        if self._thread is not None:
            return
        if broker_kind(self.settings.effective_broker_url) != "redis":
            return  # RabbitMQ holds its own delays; there is no delay store to promote
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None


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
    from platform_tasks.brokers.selection import delays_in_store

    settings: PlatformSettings = app.platform_settings
    kind = delays_in_store(settings)
    if kind == "redis":
        return DelayPromoter(settings, name=name)
    if kind == "rabbitmq":
        from platform_tasks.publishing.rabbitmq_delay_promoter import RabbitMQDelayPromoter

        return RabbitMQDelayPromoter(app, name=name)
    return None


class DelayPromoterStep(bootsteps.StartStopStep):  # type: ignore[misc]
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
