"""The platform transport class kombu instantiates for a broker connection."""

from __future__ import annotations

import logging
from typing import Any

from kombu.transport.redis import Transport as RedisTransport

from platform_tasks.transport.channel import Channel
from platform_tasks.transport.selection import sweep_interval

logger = logging.getLogger("platform_tasks.transport")


class Transport(RedisTransport):  # type: ignore[misc]
    """kombu's Redis transport with the platform channel and a timely sweep.

    kombu's event loop sweeps for expired unacked messages on a timer read from the
    stock channel's defaults (every 10 s, scanning every 10th time); here the timer runs
    every :func:`~platform_tasks.transport.selection.sweep_interval`, never longer than
    the visibility timeout. A second timer in the same loop (the worker's main process)
    looks after the messages this process holds (:meth:`tend_in_flight`).
    """

    Channel = Channel
    platform_server_checked = False

    def register_with_event_loop(self, connection: Any, loop: Any) -> None:
        super().register_with_event_loop(connection, loop)
        options = connection.client.transport_options
        visibility = float(options.get("visibility_timeout", Channel.visibility_timeout))
        interval = sweep_interval(visibility, options.get("unacked_restore_interval"))
        cycle = self.cycle
        cycle._restore_messages_tref.cancel()
        cycle._restore_messages_tref = loop.call_repeatedly(interval, cycle.maybe_restore_messages)
        loop.call_repeatedly(interval, self.tend_in_flight)

    def tend_in_flight(self) -> None:
        """Resend acks the broker refused with an error reply, for every channel."""
        for channel in list(self.cycle._channels):
            try:
                channel.qos.retry_unsent_acks()
            except channel.connection_errors:
                logger.debug(
                    "in-flight upkeep skipped: broker connection error",
                    exc_info=True,
                    extra={"event": "transport.upkeep_skipped"},
                )
