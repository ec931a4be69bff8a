"""Back-pressure of a fan-out: a batch is published only when it fits under the queue's bound.

A fan-out publishes far faster than its tenants' consumers apply (tens of thousands of
envelopes a second against a few hundred), so without a bound a 1,000,000-tenant fan-out
puts every envelope on the queue at once, and a ``noeviction`` Redis fills up. Before each
batch the publisher reads the depth of the list or queue the batch goes to; the batch is
published only when ``depth + len(batch) <= PLATFORM_FANOUT_MAX_QUEUE_DEPTH``, so the
fan-out never takes the queue above the bound (other publishers to the same queue are not
held back by it).

While the queue is full the delivery waits in place for up to :data:`WAIT_IN_PLACE_SECONDS`,
polling every :data:`POLL_SECONDS`. Past that it stops with :class:`QueueFull`: the consumer
turns it into :class:`~platform_tasks.errors.Throttled` (no attempt spent, never a dead
letter), the job comes back through the delay store after :data:`RETRY_AFTER_SECONDS`, and
its next delivery resumes at the progress marker. A fan-out behind slow consumers thus
holds no worker process and no PostgreSQL transaction for hours, and stays well inside
RabbitMQ's ``consumer_timeout``.
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = [
    "POLL_SECONDS",
    "RETRY_AFTER_SECONDS",
    "WAIT_IN_PLACE_SECONDS",
    "QueueBound",
    "QueueFull",
]

WAIT_IN_PLACE_SECONDS = 60.0
"""How long one delivery waits for room before it hands the fan-out back to the queue."""

POLL_SECONDS = 0.2
"""Between two reads of the queue's depth while it is full."""

RETRY_AFTER_SECONDS = 10.0
"""Delay of the delivery that resumes a fan-out handed back because its queue stayed full."""


class QueueFull(Exception):
    """The target queue stayed above its bound for the whole wait."""

    def __init__(self, queue: str, depth: int, bound: int) -> None:
        self.queue = queue
        self.depth = depth
        self.bound = bound
        super().__init__(f"queue {queue!r} holds {depth} message(s), bound {bound}")


class QueueBound:
    """Waits until ``count`` more messages fit on a queue under ``max_depth``."""

    def __init__(
        self,
        max_depth: int,
        *,
        wait_seconds: float = WAIT_IN_PLACE_SECONDS,
        poll_seconds: float = POLL_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.max_depth = max_depth
        self.wait_seconds = wait_seconds
        self.poll_seconds = poll_seconds
        self._clock = clock
        self._sleep = sleep
        self.waits = 0
        """Batches that had to wait for room (for the ``fanout.finished`` log line)."""

    def wait_for_room(self, queue: str, depth: Callable[[], int], count: int) -> None:
        """Return once ``depth() + count <= max_depth``; raise :class:`QueueFull` at the
        end of the wait."""
        deadline: float | None = None
        while True:
            current = depth()
            if current + count <= self.max_depth:
                return
            now = self._clock()
            if deadline is None:
                deadline = now + self.wait_seconds
                self.waits += 1
            elif now >= deadline:
                raise QueueFull(queue, current, self.max_depth)
            self._sleep(self.poll_seconds)
