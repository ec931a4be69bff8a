"""The worker's side of pause and resume: a consumer bootstep that honours the flags.

:class:`QueuePauseStep` reads the pause flags from the platform's Redis on a thread of
its own every :data:`~platform_tasks.operations.pause.POLL_SECONDS` (a Redis that hangs
never holds the event loop that dispatches and acks every queue, as the marketing yield
learnt), and the event loop acts on the newest reading: a paused queue the worker
consumes is held through :mod:`~platform_tasks.consumer.queue_gate` (its consumer
cancelled, as Celery's ``cancel_consumer`` does), and released on resume. While Redis
cannot be read the worker keeps its queues as they are. Jobs already fetched finish.
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from celery import bootsteps

from platform_tasks.consumer.queue_gate import hold, holds, release
from platform_tasks.keys import operation_keys

if TYPE_CHECKING:
    from platform_tasks.kernel import PlatformCelery

__all__ = ["PAUSE_REASON", "PauseReader", "QueuePauseStep", "install"]

logger = logging.getLogger(__name__)

PAUSE_REASON = "operator pause"
REDIS_TIMEOUT_SECONDS = 1.0

POLL_SECONDS = 0.25
"""How often a worker reads the pause flags: a pause is honoured within about this long
(plus the event loop's turn), well inside a second."""


class PauseReader:
    """A thread that keeps the newest set of paused queues (``None`` until first read)."""

    def __init__(self, settings: Any, *, interval: float = POLL_SECONDS) -> None:
        self.settings = settings
        self.interval = interval
        self.latest: frozenset[str] | None = None
        self.number = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._client: Any = None
        self._failing = False

    def start(self) -> PauseReader:
        self._thread = threading.Thread(target=self._run, name="platform-pause-reader", daemon=True)
        self._thread.start()
        return self

    def read_once(self) -> None:
        from platform_tasks.brokers.redis_client import REDIS_ERRORS, build_redis

        try:
            if self._client is None:
                self._client = build_redis(
                    self.settings, timeout=REDIS_TIMEOUT_SECONDS, single_attempt=True
                )
            paused = frozenset(read_paused(self._client, self.settings.profile))
        except REDIS_ERRORS as exc:
            if not self._failing:
                logger.warning(
                    "pause flags unreadable (%s); queues stay as they are",
                    type(exc).__name__,
                    extra={"event": "operations.pause_flags_unreadable"},
                )
            self._failing = True
            return
        self._failing = False
        self.latest = paused
        self.number += 1

    def _run(self) -> None:
        while not self._stop.is_set():
            self.read_once()
            self._stop.wait(self.interval)
        if self._client is not None:
            try:
                self._client.close()
            except Exception:
                logger.debug(
                    "closing the pause reader's client failed",
                    exc_info=True,
                    extra={"event": "operations.pause_reader_close_failed"},
                )

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None


class QueuePauseStep(bootsteps.StartStopStep):
    """Consumer bootstep: cancel/re-add consumers of queues an operator paused/resumed."""

    label = "platform queue pause"
    requires = ("celery.worker.consumer.tasks:Tasks",)

    def __init__(self, c: Any, **kwargs: Any) -> None:
        super().__init__(c, **kwargs)
        self.consumed: set[str] = set()  # every queue this worker consumes or consumed
        self.reader: PauseReader | None = None
        self._timer: Any = None
        self._acted_on = 0

    def start(self, c: Any) -> None:
        self.consumed |= set(c.app.amqp.queues.consume_from)
        for queue, reasons in holds(c).items():
            if reasons and queue in c.app.amqp.queues.consume_from:
                c.call_soon(c.cancel_task_queue, queue)  # the consumer restarted: hold again
        self.reader = PauseReader(c.app.platform_settings)
        # One read before the first message is fetched: a worker started while a queue is
        # paused starts paused (at most one Redis timeout spent here if Redis is away).
        self.reader.read_once()
        self._acted_on = 0
        if self.reader.latest is not None:
            self._acted_on = self.reader.number
            self.act(c, self.reader.latest)
        self.reader.start()
        self._timer = c.timer.call_repeatedly(POLL_SECONDS / 2, self.tick, (c,), priority=10)

    def tick(self, c: Any) -> None:
        """Act on the newest reading not acted on yet (the event loop; never waits)."""
        reader = self.reader
        if reader is None or reader.latest is None or reader.number <= self._acted_on:
            return
        self._acted_on = reader.number
        self.act(c, reader.latest)

    def act(self, c: Any, paused: frozenset[str]) -> None:
        # queues added while the worker runs (``celery control add_consumer``) count too
        self.consumed |= set(c.app.amqp.queues.consume_from)
        current = holds(c)
        for queue in sorted(self.consumed):
            mine = PAUSE_REASON in current.get(queue, ())
            if queue in paused and not mine:
                hold(c, queue, PAUSE_REASON)
                logger.info(
                    "queue %s paused on this worker",
                    queue,
                    extra={"event": "operations.worker_paused", "queue": queue},
                )
            elif queue not in paused and mine:
                release(c, queue, PAUSE_REASON)
                logger.info(
                    "queue %s resumed on this worker",
                    queue,
                    extra={"event": "operations.worker_resumed", "queue": queue},
                )

    def stop(self, c: Any) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.reader is not None:
            self.reader.stop()
            self.reader = None

    shutdown = stop


def install(app: PlatformCelery) -> None:
    """Every worker of ``app`` honours pause flags (``platform-tasks queues pause``)."""
    app.steps["consumer"].add(QueuePauseStep)


@dataclass(frozen=True)
class PausedQueue:
    queue: str
    operation_id: int
    actor: str
    since: datetime


def read_paused(client: Any, profile: str) -> dict[str, PausedQueue]:
    """The pause flags (one ``HGETALL``); an unreadable flag still pauses its queue."""
    paused: dict[str, PausedQueue] = {}
    for raw_queue, raw in client.hgetall(operation_keys(profile).paused).items():
        queue = raw_queue.decode() if isinstance(raw_queue, bytes) else str(raw_queue)
        try:
            data = json.loads(raw)
            paused[queue] = PausedQueue(
                queue,
                int(data["operation_id"]),
                str(data["actor"]),
                datetime.fromisoformat(data["since"]),
            )
        except (ValueError, KeyError, TypeError):
            paused[queue] = PausedQueue(queue, 0, "?", datetime.fromtimestamp(0, UTC))
    return paused
