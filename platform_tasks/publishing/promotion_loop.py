"""The one delay promotion loop: a thread that runs a broker's promotion pass until stopped.

Delays must be delivered while at least one worker runs, so every worker (and beat
replica) runs a promoter thread. What one pass does depends on the broker: an atomic move
onto a Redis broker's lists (:mod:`~platform_tasks.publishing.delay_promoter`), or a publish
into RabbitMQ that removes entries only after their confirms
(:mod:`~platform_tasks.publishing.rabbitmq_delay_promoter`). Everything around the pass is
the same for both and lives here once, in :class:`PromotionLoop`: starting and stopping the
thread, sleeping until the next entry is due, backing off after failures, the
``delay.promoted`` and ``delay.promote_failed`` log events, the count of moved entries and
closing the pass's clients when the thread ends. A broker contributes a
:class:`PromotionPass`.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from platform_tasks.background import BackgroundThread

MIN_WAIT_SECONDS = 0.005
"""The shortest sleep between passes, so a promoter never spins on entries due within
a few milliseconds of each other."""

MAX_BACKOFF_SECONDS = 30.0
"""The longest sleep after failed passes: a promoter whose broker comes back resumes
within this, however long the outage was."""

MAX_BACKOFF_DOUBLINGS = 6
"""Failures after which the back-off stops doubling (poll interval times 64 at most)."""


def wait_until_next_due(next_due_in_ms: int | None, interval: float) -> float:
    """Seconds to sleep after a pass: until the earliest entry left is due, so staggered
    delays come back at their own time rather than in poll-interval batches; at most the
    poll interval, so entries other processes add meanwhile are seen within it as before;
    at least :data:`MIN_WAIT_SECONDS`."""
    if next_due_in_ms is None:
        return interval
    return min(interval, max(MIN_WAIT_SECONDS, next_due_in_ms / 1000))


def failure_backoff(interval: float, failures: int) -> float:
    """Seconds to sleep after ``failures`` failed passes in a row: doubling from the poll
    interval, so an unreachable broker is not hammered by every worker at once, and
    capped at :data:`MAX_BACKOFF_SECONDS`, so promotion resumes soon after it returns."""
    return min(MAX_BACKOFF_SECONDS, interval * 2.0 ** min(failures, MAX_BACKOFF_DOUBLINGS))


@dataclass(frozen=True)
class PassLog:
    """How the loop words its log lines for one broker's passes, and the logger it uses.

    Each broker keeps its own module's logger and wording, so operators' filters and
    alerts on either promoter see the same lines as before the loop was shared.
    ``failed`` takes the exception as its one ``%s``.
    """

    logger: logging.Logger
    promoted: str
    failed: str
    failed_unexpectedly: str


class PromotionPass(Protocol):
    """What the loop needs of a broker: open its clients, promote what is due, close them.

    ``stopping`` is set when the loop stops; a pass checks it between batches so stopping
    never waits for a long backlog to drain. ``expected_errors`` are the failures a pass
    meets when a server is unreachable: logged as a warning and retried with back-off;
    any other exception is logged with its traceback and retried the same way, because
    the thread must never end while the process runs (its delays would stall).
    """

    stopping: threading.Event
    log: PassLog
    expected_errors: tuple[type[Exception], ...]

    @property
    def interval(self) -> float:
        """Seconds between passes when nothing is due sooner; the back-off's base."""
        ...

    def open(self) -> None:
        """Create the clients the passes use (called once, on the loop's thread)."""
        ...

    def run_pass(self) -> tuple[int, float]:
        """Promote what is due; return entries moved and seconds to sleep until the next
        pass (see :func:`wait_until_next_due`)."""
        ...

    def close(self) -> None:
        """Close whatever :meth:`open` created, including after an incomplete ``open``."""
        ...


P = TypeVar("P", bound=PromotionPass)


class PromotionLoop(BackgroundThread, Generic[P]):
    """A background thread that runs ``promotion``'s passes until stopped.

    One loop for every broker, so the back-off, logging and stopping cannot drift apart
    between the Redis and RabbitMQ promoters.
    """

    def __init__(self, promotion: P, *, name: str) -> None:
        self.promotion = promotion
        self.name = name
        self.moved_total = 0
        self._stop = promotion.stopping
        self._thread: threading.Thread | None = None

    def _loop(self) -> None:
        promotion = self.promotion
        log = promotion.log
        interval = promotion.interval
        failures = 0
        try:
            promotion.open()
            while not self._stop.is_set():
                wait = interval
                try:
                    moved, wait = promotion.run_pass()
                    failures = 0
                    if moved:
                        self.moved_total += moved
                        log.logger.debug(
                            log.promoted, extra={"event": "delay.promoted", "count": moved}
                        )
                except promotion.expected_errors as exc:
                    failures += 1
                    log.logger.warning(log.failed, exc, extra={"event": "delay.promote_failed"})
                except Exception:  # never end the thread: this process's delays would stall
                    failures += 1
                    log.logger.exception(
                        log.failed_unexpectedly, extra={"event": "delay.promote_failed"}
                    )
                if failures:
                    wait = failure_backoff(interval, failures)
                self._stop.wait(wait)
        finally:
            promotion.close()
