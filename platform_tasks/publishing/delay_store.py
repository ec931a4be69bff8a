"""Durable delays: jobs scheduled for later wait in Redis, not in a worker's memory.

Celery's ETA messages are held by the worker that fetched them; with the Redis transport
they come back only after the visibility timeout when that worker dies. Here a delayed
job is stored as the exact wire message its queue will receive, and a promoter moves due
entries onto the broker list in one atomic script, so any number of promoters can run and
a killed one loses nothing.

The store must live on the broker's Redis server: the hand-off from store to queue is
atomic only because both are on the same server.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, cast

import redis

from platform_tasks.brokers.scripts import script_source
from platform_tasks.keys import DelayKeys


@dataclass(frozen=True)
class Claim:
    """Entries claimed for publishing elsewhere, under a lease until removed.

    ``entries`` pairs each entry id with its encoded entry; ``more_due`` says the batch
    was full; ``next_due_in_ms`` is how long until the earliest entry left in the store
    is due (claimed ones included, at their lease's end), ``None`` when the store is empty.
    """

    entries: list[tuple[str, bytes]]
    more_due: bool
    next_due_in_ms: int | None


@dataclass(frozen=True)
class PromotionResult:
    """What one promotion call did: entries moved, whether more were already due, and
    ``next_due_in_ms``, how long until the earliest entry left is due by the Redis clock
    (0 when one is already due, ``None`` when the store is empty)."""

    moved: int
    more_due: bool
    next_due_in_ms: int | None


class DelayStore:
    """Add delayed entries and promote the due ones, in batches of one round trip."""

    def __init__(self, client: redis.Redis, keys: DelayKeys) -> None:
        self.client = client
        self.keys = keys
        self._add = client.register_script(script_source("add_delay"))
        self._promote = client.register_script(script_source("promote_delays"))
        self._claim = client.register_script(script_source("claim_delays"))
        self._remove = client.register_script(script_source("remove_delays"))
        self._release = client.register_script(script_source("release_delays"))
        self._extend = client.register_script(script_source("extend_delays"))
        self._record_return = client.register_script(script_source("record_return"))

    def add(self, entry_id: str, due_ms: int, list_key: str, wire: str) -> None:
        """Store one entry due at ``due_ms`` (ms since the epoch) for list ``list_key``."""
        entry = json.dumps({"q": list_key, "m": wire}, separators=(",", ":"))
        self.add_encoded(entry_id, due_ms, entry)

    def add_encoded(self, entry_id: str, due_ms: int, entry: str) -> None:
        """Store one already encoded entry (an AMQP message for a RabbitMQ promoter)."""
        self._add(keys=[self.keys.schedule, self.keys.entries], args=[entry_id, due_ms, entry])

    def add_many_encoded(self, entries: list[tuple[str, int, str]]) -> None:
        """Store many ``(entry id, due ms, encoded entry)`` with one pipelined round trip."""
        with self.client.pipeline(transaction=False) as pipe:
            for entry_id, due_ms, entry in entries:
                self._add(
                    keys=[self.keys.schedule, self.keys.entries],
                    args=[entry_id, due_ms, entry],
                    client=pipe,
                )
            pipe.execute()

    def add_many(self, entries: list[tuple[str, int, str, str]]) -> None:
        """Store many entries with one pipelined round trip (bulk scheduling, benchmarks)."""
        with self.client.pipeline(transaction=False) as pipe:
            for entry_id, due_ms, list_key, wire in entries:
                entry = json.dumps({"q": list_key, "m": wire}, separators=(",", ":"))
                self._add(
                    keys=[self.keys.schedule, self.keys.entries],
                    args=[entry_id, due_ms, entry],
                    client=pipe,
                )
            pipe.execute()

    def promote_due(self, limit: int = 500) -> PromotionResult:
        """Move up to ``limit`` due entries onto their lists; Redis ``TIME`` decides due-ness."""
        raw = cast(
            list[Any], self._promote(keys=[self.keys.schedule, self.keys.entries], args=[limit])
        )
        wait = int(raw[2])
        return PromotionResult(
            moved=int(raw[0]), more_due=bool(int(raw[1])), next_due_in_ms=None if wait < 0 else wait
        )

    def claim_due(self, limit: int, lease_ms: int) -> Claim:
        """Claim up to ``limit`` due entries for ``lease_ms``; they stay stored until
        :meth:`remove`, and become due again when the lease ends. A claimed entry is
        marked (``keys.claimed``) until removed: a debounce publish no longer replaces its
        data, which may already be on the broker under the waiting job's id."""
        raw = cast(
            list[Any],
            self._claim(
                keys=[self.keys.schedule, self.keys.entries, self.keys.claimed],
                args=[limit, lease_ms],
            ),
        )
        pairs = [(_text(raw[i]), bytes(raw[i + 1])) for i in range(2, len(raw), 2)]
        wait = int(raw[1])
        return Claim(
            entries=pairs, more_due=bool(int(raw[0])), next_due_in_ms=None if wait < 0 else wait
        )

    def remove(self, entry_ids: list[str]) -> int:
        """Remove entries (their publish was confirmed); returns how many were still there."""
        if not entry_ids:
            return 0
        return int(
            self._remove(
                keys=[self.keys.schedule, self.keys.entries, self.keys.claimed], args=entry_ids
            )
        )

    def release(self, entry_ids: list[str]) -> None:
        """Make claimed entries due again now (their publish was not confirmed)."""
        if entry_ids:
            self._release(keys=[self.keys.schedule], args=entry_ids)

    def extend(self, entry_ids: list[str], lease_ms: int) -> None:
        """Renew the lease of claimed entries to ``lease_ms`` from now (confirms awaited)."""
        if entry_ids:
            self._extend(keys=[self.keys.schedule], args=[lease_ms, *entry_ids])

    def record_return(self, entry_id: str, backoff_ms: int, max_returns: int) -> int:
        """Count a return of a claimed entry; under ``max_returns`` it is due again after
        ``backoff_ms`` doubled per earlier return (Redis clock). Returns the count."""
        return int(
            self._record_return(
                keys=[self.keys.schedule, self.keys.returns],
                args=[entry_id, backoff_ms, max_returns],
            )
        )

    def forget_returns(self, entry_ids: list[str]) -> None:
        """Drop the return counts of entries that were published or dead-lettered."""
        if entry_ids:
            self.client.hdel(self.keys.returns, *entry_ids)

    def pending(self) -> int:
        """Entries still waiting (due or not)."""
        return int(self.client.zcard(self.keys.schedule))

    def next_due_ms(self) -> int | None:
        first = cast(
            list[tuple[bytes, float]], self.client.zrange(self.keys.schedule, 0, 0, withscores=True)
        )
        return int(first[0][1]) if first else None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
