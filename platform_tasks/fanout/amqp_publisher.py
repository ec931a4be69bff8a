"""Publishing a batch of a fan-out's envelopes to RabbitMQ, confirmed before the marker moves.

The consumer writes its progress marker after each batch, so a batch must be RabbitMQ's
responsibility before that: each message is the one ``QueuePort.publish`` would send
(built by Celery's own ``send_task`` and recorded, :mod:`platform_tasks.publishing.amqp_wire`, with
the same derived job id as task id), and the batch goes out on a channel in confirm mode
(:class:`~platform_tasks.publishing.confirmed_publisher.ConfirmedPublisher`), ``mandatory``. A nack,
a return or a missing confirm raises: the delivery fails before its marker names the
batch, and the retry publishes the batch again with the same ids, which the tenants'
consumers absorb.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from platform_tasks.envelope import Envelope
from platform_tasks.errors import BrokerPublishError
from platform_tasks.fanout.backpressure import QueueBound
from platform_tasks.fanout.publisher import send_task_options
from platform_tasks.publishing.amqp_wire import AmqpMessageBuilder
from platform_tasks.publishing.confirmed_publisher import ConfirmedPublisher
from platform_tasks.publishing.outbox_waiting import OutboxWaiting
from platform_tasks.publishing.reference_clock import shared_clock

if TYPE_CHECKING:
    from platform_tasks.kernel import PlatformCelery

__all__ = ["AmqpBatchPublisher"]


class AmqpBatchPublisher:
    """Publishes batches of envelopes of one kind to one RabbitMQ queue, with confirms."""

    def __init__(
        self,
        app: PlatformCelery,
        *,
        queue: str,
        bound: QueueBound | None = None,
        confirm_timeout: float = 30.0,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self.queue = queue
        self.bound = bound
        self.headers = dict(headers or {})
        self._messages = AmqpMessageBuilder(app)
        self._reference = shared_clock(app.platform_settings)
        self._publisher = ConfirmedPublisher(app, confirm_timeout=confirm_timeout)
        self._outbox = OutboxWaiting(app.platform_settings)
        try:
            self._publisher.ensure_connected()
        except BaseException:
            self._messages.close()
            raise

    def publish(self, envelopes: Sequence[Envelope[Any]]) -> None:
        """Publish every envelope; return once RabbitMQ confirmed each of them."""
        if not envelopes:
            return
        stamp = self._reference.now()  # the batch's publish time
        messages = [
            self._messages.build(
                envelope.kind, **send_task_options(self.queue, envelope, stamp, self.headers)
            )
            for envelope in envelopes
        ]
        if self.bound is not None:
            self.bound.wait_for_room(self.queue, self.depth, len(messages))
        confirmed = self._publisher.publish(messages)
        missing = confirmed.count(False)
        if missing:
            raise BrokerPublishError(
                f"RabbitMQ did not confirm {missing} of {len(messages)} fan-out message(s) "
                f"to queue {self.queue!r}; the batch is published again on the next delivery"
            )

    def depth(self) -> int:
        """Messages ready on the target queue (declared first, as publishing declares it),
        and committed outbox rows on their way to it."""
        return self._publisher.queue_depth(self.queue) + self._outbox.for_queue(self.queue)

    def close(self) -> None:
        self._messages.close()
        self._publisher.close()
        self._outbox.close()
