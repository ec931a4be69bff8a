"""The platform transport class kombu instantiates for a broker connection."""

from __future__ import annotations

from typing import Any

from kombu.transport.redis import Transport as RedisTransport

from platform_tasks.transport.channel import Channel
from platform_tasks.transport.selection import sweep_interval


class Transport(RedisTransport):  # type: ignore[misc]
    """kombu's Redis transport with the platform channel and a timely sweep.

    kombu's event loop sweeps for expired unacked messages on a timer read from the
    stock channel's defaults (every 10 s, scanning every 10th time); here the timer runs
    every :func:`~platform_tasks.transport.selection.sweep_interval`, never longer than
    the visibility timeout.
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
