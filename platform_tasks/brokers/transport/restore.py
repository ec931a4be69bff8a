"""Putting one unacked record back on its queues: the transport's restore path.

Used by the QoS (a worker's restore at shutdown, the visibility-timeout sweep). Routing
(exchange lookup, priority list) is kombu's, computed on the channel; the
``transport_restore`` script then removes the record and pushes the message atomically,
so a record is restored once however many sweeps race for it.
"""

from __future__ import annotations

import logging
import uuid
from typing import TYPE_CHECKING, Any

from kombu.utils.encoding import bytes_to_str
from kombu.utils.json import dumps, loads

from platform_tasks.headers import UNROUTABLE_HEADER
from platform_tasks.keys import fair_lane_keys

if TYPE_CHECKING:
    from platform_tasks.brokers.transport.channel import Channel

logger = logging.getLogger("platform_tasks.transport")


def restore_record(
    channel: Channel,
    tag: str,
    record: bytes | str,
    *,
    leftmost: bool,
    unroutable_here: bool = False,
) -> bool:
    """Push one unacked record back onto its queues (once); True if this call did.

    See :meth:`Channel.restore_record`. A record that cannot be routed stays unacked
    (logged), so nothing is lost: a later sweep, or one with ``unroutable_here``, hands
    it over.
    """
    try:
        message, exchange, routing_key = loads(bytes_to_str(record))
        _mark_redelivered(message)
        priority = channel._get_message_priority(message, reverse=False)
        queues = _route(channel, tag, message, exchange, routing_key, unroutable_here)
        targets = [
            (channel.prefixed(channel._q_for_pri(queue, priority)), channel._is_fair(queue))
            for queue in queues
        ]
    except channel.connection_errors:
        raise
    except Exception:
        logger.exception(
            "cannot route unacked message %s back to its queue; it stays unacked",
            tag,
            extra={"event": "transport.restore_failed", "delivery_tag": tag},
        )
        return False
    if not targets:
        logger.warning(
            "unacked message %s has no queue to go back to; it stays unacked until a "
            "sweep hands it over",
            tag,
            extra={"event": "transport.restore_unroutable", "delivery_tag": tag},
        )
        return False
    keys: list[str] = []
    args = [tag, dumps(message), "1" if leftmost else "0"]
    for list_key, fair in targets:
        lane = fair_lane_keys(list_key)
        keys.extend((list_key, lane.ring, lane.waiting, lane.lengths, lane.heads))
        args.extend(("fair" if fair else "plain", lane.lane_prefix))
    return bool(channel.run_script("transport_restore", keys, args))


def _mark_redelivered(message: dict[str, Any]) -> None:
    """Flag the copy as redelivered under a new delivery tag (a malformed message is left
    as it is: its consumer dead-letters it)."""
    try:
        message["headers"]["redelivered"] = True
        message["properties"]["delivery_info"]["redelivered"] = True
        # Each delivery gets its own tag, hence its own record: a late ack of
        # this copy (its worker was slow, not dead) cannot delete the record of
        # the copy delivered next.
        message["properties"]["delivery_tag"] = str(uuid.uuid4())
    except (KeyError, TypeError):
        pass


def _route(
    channel: Channel,
    tag: str,
    message: dict[str, Any],
    exchange: str,
    routing_key: str,
    unroutable_here: bool,
) -> list[str]:
    """The queues the message goes back to; none when no queue is bound for it any more,
    except with ``unroutable_here``: then the channel's first queue, the message marked
    unroutable so the worker's consumer dead-letters it instead of it staying unacked for
    ever, swept again and again."""
    try:
        queues: list[str] = channel._lookup(exchange, routing_key)
    except channel.connection_errors:
        raise
    except Exception:
        logger.warning(
            "no route for unacked message %s",
            tag,
            exc_info=True,
            extra={"event": "transport.route_lookup_failed"},
        )
        queues = []
    if not queues and unroutable_here and channel._active_queues:
        queues = [channel._active_queues[0]]
        _mark_unroutable(message, exchange, routing_key, queues[0])
        logger.error(
            "unacked message %s has no queue bound for exchange %r, routing key %r "
            "any more; handed to queue %s to be dead-lettered",
            tag,
            exchange,
            routing_key,
            queues[0],
            extra={
                "event": "transport.unroutable",
                "delivery_tag": tag,
                "exchange": exchange,
                "routing_key": routing_key,
            },
        )
    return queues


def _mark_unroutable(message: dict[str, Any], exchange: str, routing_key: str, queue: str) -> None:
    """Mark a message for the dead-letter path and route it to ``queue`` from now on.

    The original exchange and routing key go into the header; the delivery info names the
    anonymous exchange and ``queue``, so a requeue (the dead letter could not be written
    yet) puts it back there instead of finding no route again.
    """
    headers = message.setdefault("headers", {})
    headers[UNROUTABLE_HEADER] = {"exchange": exchange, "routing_key": routing_key}
    info = message.setdefault("properties", {}).setdefault("delivery_info", {})
    info["exchange"] = ""
    info["routing_key"] = queue
