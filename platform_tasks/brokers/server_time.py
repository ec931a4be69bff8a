"""Now on the Redis server's clock: the one reading of ``TIME`` for every stage.

Leases, rate limits, the delay store, job triggers and cancel rules are judged by the
Redis server's clock, never a worker's, so that workers whose clocks disagree still agree
on what is due. This module is the one place that turns a ``TIME`` reply into a number:
a plain client answers ``(seconds, microseconds)``; a cluster client may answer one pair
per node (``{node: (seconds, microseconds)}``), of which any one is read (the nodes'
clocks are their hosts'). A pipelined ``TIME`` reply goes through :func:`reply_ms`.
"""

from __future__ import annotations

from typing import Any

__all__ = ["redis_now_ms", "redis_time", "reply_ms"]


def _pair(reply: Any) -> tuple[int, int]:
    if isinstance(reply, dict):  # a cluster client may answer per node
        reply = next(iter(reply.values()))
    seconds, micros = reply
    return int(seconds), int(micros)


def reply_ms(reply: Any) -> int:
    """A ``TIME`` reply (one of a pipeline's results) in Unix milliseconds."""
    seconds, micros = _pair(reply)
    return seconds * 1000 + micros // 1000


def redis_now_ms(client: Any) -> int:
    """The Redis server's ``TIME`` in Unix milliseconds (one round trip)."""
    return reply_ms(client.time())


def redis_time(client: Any) -> float:
    """The Redis server's ``TIME`` in Unix seconds, to the microsecond (one round trip)."""
    seconds, micros = _pair(client.time())
    return seconds + micros / 1_000_000
