"""What the runnable gauge leaves out: paused queues and jobs back on a full cap.

``platform_queue_runnable{queue}`` (:mod:`platform_tasks.brokers.queue_latency`) is the
queue's length (its lists and, on a fair queue, its tenant lanes) less what a new worker
could not start now. The broker's layer cannot know that; this module tells it, on each
scrape of the worker's ``/metrics``, from the platform's Redis:

- a paused queue (``platform-tasks queues pause``) counts 0: no worker takes its jobs;
- jobs back from a concurrency cap whose key's slots are all held do not count
  (:mod:`platform_tasks.limits.parked`).

Jobs waiting in the delay store (delays, retries, throttled and capped jobs until they
are due) are on no queue, so the queue's length never counted them. One ``HGETALL`` and
the cap reads (three round trips at most), on the worker's main process, only when
scraped.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from platform_tasks.brokers.queue_latency import NotRunnable, set_parked_reader
from platform_tasks.brokers.redis_client import REDIS_ERRORS, build_redis
from platform_tasks.consumer.queue_pause import read_paused
from platform_tasks.limits.admission import spec_of
from platform_tasks.limits.parked import CappedTask, blocked_on_caps

if TYPE_CHECKING:
    from platform_tasks.kernel import PlatformCelery

__all__ = ["ParkedJobs", "capped_tasks", "install"]

REDIS_TIMEOUT_SECONDS = 2.0


def capped_tasks(app: PlatformCelery) -> list[CappedTask]:
    """The app's tasks with a per-key concurrency cap."""
    capped = []
    for name, task in sorted(app.tasks.items()):
        spec = spec_of(task)
        if spec.max_concurrency is not None and spec.concurrency_key is not None:
            capped.append(CappedTask(name, spec.max_concurrency))
    return capped


class ParkedJobs:
    """The app's :data:`~platform_tasks.brokers.queue_latency.ParkedReader`."""

    def __init__(self, app: PlatformCelery) -> None:
        self.app = app
        self._client: Any = None

    def __call__(self, queues: Sequence[str]) -> NotRunnable:
        settings = self.app.platform_settings
        if self._client is None:
            self._client = build_redis(settings, timeout=REDIS_TIMEOUT_SECONDS, single_attempt=True)
        try:
            paused = frozenset(read_paused(self._client, settings.profile))
            blocked = blocked_on_caps(self._client, settings.profile, capped_tasks(self.app))
        except REDIS_ERRORS:
            self._client.close()
            self._client = None
            raise
        return NotRunnable(paused, blocked)


def install(app: PlatformCelery) -> None:
    """The runnable gauge of ``app``'s workers leaves out paused queues and full caps."""
    set_parked_reader(app, ParkedJobs(app))
