"""Ack emulation of the platform transport: scripts instead of MULTI/EXEC.

Stock kombu records a delivered message as unacked in its own MULTI/EXEC after the pop,
and acks in another. Here the record is written by the fetch script in the same atomic
step as the pop (see ``transport_fetch.lua``), so :meth:`QoS.append` usually has nothing
to send; acks, rejects and restores are one script each. The Redis layout (the
``unacked`` hash and ``unacked_index`` sorted set) is kombu's, so a stock worker sharing
the broker restores our expired messages and we restore its.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from kombu.transport import virtual
from kombu.transport.redis import QoS as RedisQoS
from kombu.utils.json import dumps
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

if TYPE_CHECKING:
    from platform_tasks.brokers.transport.channel import Channel

logger = logging.getLogger("platform_tasks.transport")

DEFAULT_RESTORE_BATCH = 1000
"""Expired messages restored per sweep when ``unacked_restore_limit`` is not set."""

SWEEP_SLACK = 0.8


class QoS(RedisQoS):
    """kombu's Redis QoS with one script per state change and a time-based sweep."""

    channel: Channel

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._last_sweep = float("-inf")
        self.unsent_acks: set[str] = set()
        """Tags whose ack the broker refused with an error reply; resent by
        :meth:`retry_unsent_acks` (their records stay in Redis meanwhile)."""

    def append(self, message: Any, delivery_tag: str) -> None:
        """Track the message; write its unacked record unless the fetch script did."""
        if not self.channel.take_recorded(delivery_tag):
            delivery = message.delivery_info
            record = dumps([message._raw, delivery["exchange"], delivery["routing_key"]])
            try:
                self.channel.run_script("transport_append", [], [delivery_tag, record])
            except ResponseError as exc:
                # Only messages that were never on a queue list get here (fanout over
                # PUB/SUB): Redis holds no copy to lose, so deliver it unrecorded.
                logger.warning(
                    "could not record message %s as unacked (%s); delivering it unrecorded",
                    delivery_tag,
                    exc,
                    extra={"event": "transport.record_failed", "delivery_tag": delivery_tag},
                )
        virtual.QoS.append(self, message, delivery_tag)

    def ack(self, delivery_tag: str) -> None:
        self._require_open_channel("ack", delivery_tag)
        self._send_ack(delivery_tag)
        virtual.QoS.ack(self, delivery_tag)

    def reject(self, delivery_tag: str, requeue: bool = False) -> None:
        self._require_open_channel("reject", delivery_tag)
        if requeue:
            try:
                self.restore_by_tag(delivery_tag, leftmost=True)
            except ResponseError as exc:
                logger.warning(
                    "broker refused to requeue message %s (%s); it stays unacked until "
                    "the visibility sweep",
                    delivery_tag,
                    exc,
                    extra={"event": "transport.requeue_failed", "delivery_tag": delivery_tag},
                )
        else:
            self._send_ack(delivery_tag)
        virtual.QoS.ack(self, delivery_tag)

    def _send_ack(self, delivery_tag: str) -> None:
        """Remove the record; on an error reply keep it and resend the ack later.

        The work is done, so the prefetch slot is freed either way. The record stays in
        Redis (the message is not lost) until the resend succeeds; if the worker dies
        first, the sweep redelivers it and the idempotency row absorbs the duplicate.
        """
        try:
            self.channel.run_script("transport_ack", [], [delivery_tag])
        except ResponseError as exc:
            self.unsent_acks.add(delivery_tag)
            logger.warning(
                "broker refused the ack of message %s (%s); resending it shortly",
                delivery_tag,
                exc,
                extra={"event": "transport.ack_deferred", "delivery_tag": delivery_tag},
            )
        else:
            self.unsent_acks.discard(delivery_tag)

    def retry_unsent_acks(self) -> None:
        """Resend the acks the broker refused (called on the worker's in-flight timer)."""
        for tag in list(self.unsent_acks):
            try:
                self.channel.run_script("transport_ack", [], [tag])
            except ResponseError:
                return  # still refused: try again at the next tick
            self.unsent_acks.discard(tag)

    def _require_open_channel(self, action: str, delivery_tag: str) -> None:
        """Refuse with a connection error once the channel lost its broker connection.

        A task that finishes after the worker reconnected acks through the message's old
        channel, whose transport kombu has detached; building a client there fails with
        an ``AttributeError`` that would end the worker. A connection error is what
        Celery logs and survives: the record stays unacked and the sweep redelivers it.
        """
        transport = self.channel.connection
        if transport is None or getattr(transport, "client", None) is None:
            raise RedisConnectionError(
                f"cannot {action} message {delivery_tag}: its channel was closed with its "
                "broker connection; the message stays unacked until the visibility sweep"
            )

    def restore_unacked(self, client: Any = None) -> None:
        for tag in list(self._delivered):
            try:
                self.restore_by_tag(tag)
            except Exception:
                # Closing after a lost broker connection: kombu may already have detached
                # the transport (no client to reconnect with). Raising here would end the
                # worker; the unacked record stays in Redis and the sweep restores it.
                logger.warning(
                    "could not restore message %s on close; the visibility sweep will",
                    tag,
                    exc_info=True,
                    extra={"event": "transport.restore_deferred"},
                )
        self._delivered.clear()

    def restore_by_tag(self, tag: str, client: Any = None, leftmost: bool = False) -> bool:
        """Put one unacked message back on its queues; False if it was acked meanwhile."""
        raw = self.channel.raw_client.hget(self.channel.prefixed(self.unacked_key), tag)
        if raw is None:
            self.channel.run_script("transport_ack", [], [tag])
            return False
        return self.channel.restore_record(tag, raw, leftmost=leftmost)

    def restore_visible(self, start: int = 0, num: int | None = 10, interval: int = 10) -> None:
        """Sweep for messages unacked longer than the visibility timeout.

        Throttled by time rather than by call count, so the sweep period is the
        channel's ``restore_interval`` whichever loop calls it (kombu calls this on a
        timer with an event loop and on every empty poll without one).
        """
        now = time.monotonic()
        # A timer firing a little early must still sweep, hence the slack.
        if now - self._last_sweep < self.channel.restore_interval * SWEEP_SLACK:
            return
        try:
            self._sweep(num)
        except ResponseError as exc:
            logger.warning(
                "visibility sweep refused by the broker (%s); retrying at the next call",
                exc,
                extra={"event": "transport.sweep_failed"},
            )
            return
        # Only a sweep that ran counts: after a failed one (error reply, connection
        # error) the next call sweeps again instead of waiting a whole interval.
        self._last_sweep = now

    def _sweep(self, num: int | None) -> None:
        limit = num or DEFAULT_RESTORE_BATCH
        tags, records = self.channel.run_script(
            "transport_expired", [], [self.visibility_timeout, limit]
        )
        restored = 0
        for tag, raw in zip(tags, records, strict=True):
            if raw is None:
                self.channel.run_script("transport_ack", [], [tag])
                continue
            if self.channel.restore_record(tag, raw, leftmost=False, unroutable_here=True):
                restored += 1
        if restored:
            logger.info(
                "restored %d message(s) unacked for longer than %ss",
                restored,
                self.visibility_timeout,
                extra={"event": "transport.restored_expired", "count": restored},
            )
