"""Task events for Flower at a fraction of Celery's cost: one publish per batch, not per turn.

Celery's worker already buffers task events (``task-received``, ``task-started``,
``task-succeeded``/``failed``...) when it runs an event loop, but it schedules a flush
with ``hub.call_soon`` for every event, so in practice each event-loop turn publishes its
one or two events as a separate ``task.multi`` message: a kombu ``Producer.publish``
(JSON of the body, base64, JSON of the whole message again) and a synchronous Redis
``PUBLISH`` round trip, about 1.8 times per task. Profiled in the worker main process
of a prefork worker draining no-op tasks, that flush path was 41 % of the event loop's
samples (``bench/results-events.md``).

:class:`BatchingEventDispatcher` keeps Celery's wire format (a ``task.multi`` message
whose body is a list of events, which Celery's ``EventReceiver`` and Flower read as
before) and changes only when it flushes:

* at most :attr:`~BatchingEventDispatcher.flush_interval` seconds after the first event
  of a batch (a timer on the worker's event loop), so Flower is never more than that
  behind;
* at once when :attr:`~BatchingEventDispatcher.max_batch` events are waiting;
* at once from the moment the consumer stops (warm shutdown, connection loss), when the
  event loop no longer runs timers: tasks that finish during a warm shutdown still
  publish their ``task-succeeded``; the remaining buffer is flushed before Celery closes
  the event connection.

Worker events (heartbeats, online/offline) and events sent without an event loop are
published as Celery does, with one difference: Celery sends heartbeats with ``retry=True``
and no retry policy, which kombu takes as "reconnect until the broker answers". A
heartbeat that fell due while the broker was away then held the worker's event loop for
the whole outage: no acks, no results, no "Connection to broker lost" (so no reconnect
loop). Such publishes get :data:`WORKER_EVENT_RETRY_POLICY` instead; an
event that still cannot go out waits in the offline buffer for the next connection, as
Celery keeps every event it could not publish. :func:`install` adds the consumer step
that flushes on stop.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from celery import bootsteps
from celery.app.events import Events
from celery.events.dispatcher import EventDispatcher
from kombu.asynchronous import get_event_loop

if TYPE_CHECKING:
    from platform_tasks.kernel import PlatformCelery

FLUSH_INTERVAL = 0.1
"""Seconds an event waits at most before it is published (how far Flower may lag)."""

MAX_BATCH = 500
"""Events published in one message at most; a full batch is published at once."""

WORKER_EVENT_RETRY_POLICY: dict[str, float] = {
    "max_retries": 2,
    "interval_start": 0,
    "interval_step": 0.25,
    "interval_max": 0.5,
}
"""Reconnects a ``retry=True`` publish without a policy of its own gets (a heartbeat): enough
for a broker connection that dropped and answers again at once (what Celery's retry is
for), bounded so that an outage costs the event loop well under a heartbeat interval."""


class BatchingEventDispatcher(EventDispatcher):
    """Celery's dispatcher, flushing buffered task events on a timer instead of per turn."""

    flush_interval: float = FLUSH_INTERVAL
    max_batch: int = MAX_BATCH
    on_send_buffered: Any
    buffer_limit: int

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._flush_scheduled = False
        self._immediate = False
        if self.on_send_buffered is not None:
            # Celery passes the consumer's "flush on the next loop turn" callback only
            # when the worker runs an event loop; replace it with the bounded timer.
            self.buffer_limit = self.max_batch
            self.on_send_buffered = self._schedule_flush

    def _publish(
        self,
        event: Any,
        producer: Any,
        routing_key: str,
        retry: bool = False,
        retry_policy: Any = None,
        **kwargs: Any,
    ) -> Any:
        if retry and not retry_policy:
            retry_policy = WORKER_EVENT_RETRY_POLICY
        return super()._publish(
            event, producer, routing_key, retry=retry, retry_policy=retry_policy, **kwargs
        )

    def _schedule_flush(self) -> None:
        if self._immediate:
            self.flush(errors=False)
            return
        if self._flush_scheduled:
            return
        hub = get_event_loop()
        if hub is None:
            self.flush(errors=False)
            return
        self._flush_scheduled = True
        hub.call_later(self.flush_interval, self._flush_on_timer)

    def _flush_on_timer(self) -> None:
        self._flush_scheduled = False
        self.flush()

    def flush_now(self) -> None:
        """Publish everything buffered and publish each later event at once.

        Called when the consumer stops: the event loop stops running timers then, while
        the pool can still finish tasks (warm shutdown) whose events must not wait.
        """
        self._immediate = True
        self.flush()


class PlatformEvents(Events):
    """``app.events`` whose ``Dispatcher`` is :class:`BatchingEventDispatcher`."""

    dispatcher_cls = f"{__name__}:BatchingEventDispatcher"


class FlushEventsOnStop(bootsteps.StartStopStep):
    """Consumer step: on stop and shutdown, publish buffered task events at once.

    Requires Celery's ``Events`` step, so it is stopped and shut down before it, while
    the event connection is still open.
    """

    requires = ("celery.worker.consumer.events:Events",)

    def stop(self, c: Any) -> None:
        self._flush(c)

    def shutdown(self, c: Any) -> None:
        self._flush(c)

    @staticmethod
    def _flush(c: Any) -> None:
        dispatcher = getattr(c, "event_dispatcher", None)
        if isinstance(dispatcher, BatchingEventDispatcher):
            dispatcher.flush_now()


def install(app: PlatformCelery) -> None:
    """Add the consumer step that flushes buffered task events when the consumer stops."""
    app.steps["consumer"].add(FlushEventsOnStop)
