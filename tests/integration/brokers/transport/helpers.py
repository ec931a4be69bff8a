"""Consuming helpers for transport tests: drain until a condition, with a deadline."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

import redis
from kombu import Connection

from platform_tasks.keys import fair_lane_keys


def drain_until(conn: Connection, condition: Callable[[], bool], *, timeout: float = 10.0) -> None:
    """Run ``conn.drain_events`` until ``condition()`` holds; fail at the deadline."""
    deadline = time.monotonic() + timeout
    while not condition():
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AssertionError("condition not reached while draining")
        with contextlib.suppress(TimeoutError):
            conn.drain_events(timeout=min(remaining, 0.5))


def collector() -> tuple[list[Any], Callable[[Any, Any], None]]:
    """A list of received messages and a kombu callback appending to it."""
    received: list[Any] = []

    def on_message(body: Any, message: Any) -> None:
        received.append(message)

    return received, on_message


def queued(client: redis.Redis, list_key: str) -> int:
    """Messages waiting on one queue list: on the list itself and, on a fair queue
    (``TEST_FAIR_QUEUES``), on its tenant lanes, where a restored message goes."""
    waiting = client.get(fair_lane_keys(list_key).waiting)
    return int(client.llen(list_key)) + max(0, int(waiting or 0))
