"""Outbox rows on their way to a queue, for the bounds that must count them.

A committed ``core.outbox`` row is a job the relay puts on its queue within moments. A
bound that reads only the queue's depth (fan-out back-pressure,
:mod:`platform_tasks.fanout.backpressure`) would let the queue pass the bound by every
row still waiting for the relay, so it adds the count here: the rows of this profile for
that queue that are due now (a row due later goes to the delay store, like a direct
``schedule``, which a queue's depth does not count either). A row whose delete a relay
has not committed yet is counted though the broker may hold it already: for that moment
the bound errs towards waiting.
"""

from __future__ import annotations

import contextlib
import time
from typing import TYPE_CHECKING, Any

import psycopg2

from platform_tasks.postgres.queries import load_queries

if TYPE_CHECKING:
    from platform_tasks.settings import PlatformSettings

__all__ = ["OutboxWaiting"]


class OutboxWaiting:
    """Counts the outbox rows due now for a queue, over a connection of its own (opened at
    the first count, autocommit: a count holds no transaction open between batches)."""

    def __init__(self, settings: PlatformSettings) -> None:
        self.database_url = settings.database_url
        self.profile = settings.profile
        self._sql = load_queries("outbox")
        self._conn: Any = None

    def for_queue(self, queue: str) -> int:
        """Rows of ``queue`` waiting for the relay (0 without a database or the table)."""
        if not self.database_url:
            return 0
        if self._conn is None or self._conn.closed:
            self._conn = psycopg2.connect(self.database_url, connect_timeout=5)
            self._conn.autocommit = True
        with self._conn.cursor() as cur:
            try:
                cur.execute(self._sql["waiting_for_queue"], (self.profile, queue, _now_ms()))
            except psycopg2.errors.UndefinedTable:  # not migrated yet: nothing can wait
                return 0
            (count,) = cur.fetchone()
        return int(count)

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(psycopg2.Error):
                conn.close()


def _now_ms() -> int:
    return int(time.time() * 1000)
