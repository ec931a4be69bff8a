"""The platform transport class kombu instantiates for a broker connection."""

from __future__ import annotations

import logging
from typing import Any

from kombu.transport.redis import Transport as RedisTransport
from redis.exceptions import ReadOnlyError, ResponseError

from platform_tasks.brokers.selection import in_flight_interval, sweep_interval
from platform_tasks.brokers.transport.channel import Channel
from platform_tasks.brokers.transport.fair_lanes import SORT_INTERVAL

logger = logging.getLogger("platform_tasks.transport")


class Transport(RedisTransport):
    """kombu's Redis transport with the platform channel and a timely sweep.

    kombu's event loop sweeps for expired unacked messages on a timer read from the
    stock channel's defaults (every 10 s, scanning every 10th time); here the timer runs
    every :func:`~platform_tasks.brokers.selection.sweep_interval`, never longer than
    the visibility timeout. A second timer in the same loop (the worker's main process)
    looks after the messages this process holds (:meth:`tend_in_flight`): it refreshes
    their unacked records, so a task running longer than the visibility timeout is not
    handed to another worker while its own worker lives.
    """

    Channel = Channel
    platform_server_checked = False
    #: ``READONLY`` means the server the URL names is a replica now (a failover): a
    #: connection error, so kombu drops the connection and Celery's consumer reconnects
    #: with its back-off until the server takes writes again. As a server error it ended
    #: the worker ("Unrecoverable error: ReadOnlyError") when the reconnect's queue
    #: declaration was refused.
    connection_errors = (*RedisTransport.connection_errors, ReadOnlyError)

    def register_with_event_loop(self, connection: Any, loop: Any) -> None:
        super().register_with_event_loop(connection, loop)
        options = connection.client.transport_options
        visibility = float(options.get("visibility_timeout", Channel.visibility_timeout))
        interval = sweep_interval(visibility, options.get("unacked_restore_interval"))
        cycle = self.cycle
        cycle._restore_messages_tref.cancel()
        cycle._restore_messages_tref = loop.call_repeatedly(interval, cycle.maybe_restore_messages)
        # As kombu does for its timers: a reconnect registers again, so drop the old one.
        previous = getattr(cycle, "_platform_in_flight_tref", None)
        if previous is not None:
            previous.cancel()
        cycle._platform_in_flight_tref = loop.call_repeatedly(
            in_flight_interval(visibility), self.tend_in_flight
        )
        previous = getattr(cycle, "_platform_fair_sort_tref", None)
        if previous is not None:
            previous.cancel()
        cycle._platform_fair_sort_tref = loop.call_repeatedly(
            SORT_INTERVAL, self.sort_fair_arrivals
        )

    def sort_fair_arrivals(self) -> None:
        """For every channel consuming a fair queue: sort its arrivals onto tenant lanes
        (``Channel.sort_arrivals``), so sorting a burst does not wait for jobs to end;
        and for every channel, adopt the lanes other workers filled on a queue it takes
        without fairness (``Channel.adopt_stranded_lanes``, throttled), so a busy worker
        that never finds its lists empty drains them too."""
        for channel in list(self.cycle._channels):
            if channel.closed:
                continue
            try:
                channel.adopt_stranded_lanes()
                channel.sort_arrivals()
            except ResponseError as exc:
                logger.warning(
                    "broker refused to sort fair-queue arrivals (%s); retrying at the next tick",
                    exc,
                    extra={"event": "transport.fair_sort_failed"},
                )
            except channel.connection_errors:
                logger.debug(
                    "fair sort skipped: broker connection error",
                    exc_info=True,
                    extra={"event": "transport.fair_sort_skipped"},
                )

    def tend_in_flight(self) -> None:
        """For every channel: refresh the records of the messages it holds (reserved or
        running, one script for all of them) and resend the acks Redis refused."""
        for channel in list(self.cycle._channels):
            try:
                channel.qos.retry_unsent_acks()
                channel.extend_unacked(channel.in_flight_tags())
            except ResponseError as exc:
                logger.warning(
                    "broker refused to refresh in-flight messages (%s); retrying at the next tick",
                    exc,
                    extra={"event": "transport.extend_failed"},
                )
            except channel.connection_errors:
                logger.debug(
                    "in-flight upkeep skipped: broker connection error",
                    exc_info=True,
                    extra={"event": "transport.upkeep_skipped"},
                )
