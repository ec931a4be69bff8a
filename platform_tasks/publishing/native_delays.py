"""Delays on RabbitMQ: the job waits in the broker's own delayed-delivery quorum queues.

Celery's native delayed delivery publishes a message with a countdown to a chain of 28
quorum queues whose message TTLs are powers of two seconds; each queue dead-letters
(at least once) into the next level, and the last into ``celery_delayed_delivery``, which
routes to the job's queue. From the moment the publish is confirmed the job is a message
in a replicated queue: a worker crash, a publisher crash or a broker restart cannot lose
it, and no worker holds it unacknowledged while it waits (``consumer_timeout``).

Workers declare this topology when they start; the publisher declares it too (once per
queue and process), so a job scheduled before any worker ever ran is routed, not dropped.
"""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from kombu.transport.native_delayed_delivery import (
    bind_queue_to_native_delayed_delivery_exchange,
    declare_native_delayed_delivery_exchanges_and_queues,
)

from platform_tasks.brokers.selection import delay_countdown_seconds

if TYPE_CHECKING:
    from platform_tasks.kernel import PlatformCelery


class NativeDelays:
    """Publish jobs with a countdown through RabbitMQ's delayed-delivery queues."""

    def __init__(self, app: PlatformCelery) -> None:
        self.app = app
        self._lock = threading.Lock()
        self._topology_declared = False
        self._bound: set[str] = set()

    def ensure_routable(self, queue_name: str) -> None:
        """Declare the delayed-delivery topology and bind ``queue_name`` to it (once per
        queue and process), so a message published with a countdown is routed."""
        self._ensure_routable(queue_name)

    def _ensure_routable(self, queue_name: str) -> None:
        if queue_name in self._bound:
            return
        with self._lock:
            if queue_name in self._bound:
                return
            queue = self.app.amqp.queues[queue_name]  # created like the route creates it
            with self.app.connection_for_write() as connection:
                if not self._topology_declared:
                    declare_native_delayed_delivery_exchanges_and_queues(
                        connection, self.app.conf.broker_native_delayed_delivery_queue_type
                    )
                    self._topology_declared = True
                queue.bind(connection.default_channel).declare()
                bind_queue_to_native_delayed_delivery_exchange(connection, queue)
            self._bound.add(queue_name)

    def send(self, task_name: str, delay: timedelta, **send_task_options: Any) -> None:
        """Publish ``task_name`` to arrive after ``delay`` (rounded up to whole seconds)."""
        self._ensure_routable(str(send_task_options["queue"]))
        countdown = delay_countdown_seconds(delay.total_seconds())
        self.app.send_task(task_name, countdown=countdown, **send_task_options)
