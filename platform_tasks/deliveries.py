"""Delivery counting per ``(consumer, job_id)``: how crash loops end.

A job whose handler kills its worker (OOM kill, segfault, SIGKILL) never reaches the code
that would count a failed attempt; the broker just redelivers it, forever. So every
delivery that reaches the handler is counted in Redis *before* the handler runs: after
``max_attempts`` of them the next delivery is dead-lettered instead of run.

The count is also the job's attempt number across duplicate publishes, so two copies of
one job share one budget of attempts. The ``platform_attempt`` header stays the floor
(``max(header, count)``) so a lost counter can never grant extra attempts beyond it.
"""

from __future__ import annotations

from typing import Any, cast

import redis

from platform_tasks.keys import DeliveryKeys


class DeliveryCounter:
    """The per-job delivery count, one small Redis hash per in-flight job."""

    def __init__(self, client: redis.Redis, keys: DeliveryKeys) -> None:
        self.client = client
        self.keys = keys

    def record(self, consumer: str, job_id: str, ttl_seconds: int) -> int:
        """Count one more delivery and return the new count (one round trip)."""
        key = self.keys.deliveries(consumer, job_id)
        with self.client.pipeline(transaction=False) as pipe:
            pipe.hincrby(key, "n", 1)
            pipe.expire(key, ttl_seconds)
            count, _ = pipe.execute()
        return int(count)

    def undo(self, consumer: str, job_id: str) -> None:
        """Take back one delivery that never reached a verdict (the database was down)."""
        self.client.hincrby(self.keys.deliveries(consumer, job_id), "n", -1)

    def generation(self, consumer: str, job_id: str) -> int | None:
        """The dead letter whose replay last restarted the count, if any."""
        raw = cast(Any, self.client.hget(self.keys.deliveries(consumer, job_id), "gen"))
        return int(raw) if raw is not None else None

    def restart(self, consumer: str, job_id: str, *, count: int, generation: int,
                ttl_seconds: int) -> None:  # fmt: skip
        """Start counting afresh for a replay of dead letter ``generation``."""
        key = self.keys.deliveries(consumer, job_id)
        with self.client.pipeline(transaction=True) as pipe:
            pipe.hset(key, mapping={"n": count, "gen": generation})
            pipe.expire(key, ttl_seconds)
            pipe.execute()

    def forget(self, consumer: str, job_id: str) -> None:
        """Drop the count once the job is applied; the idempotency row guards it now."""
        self.client.delete(self.keys.deliveries(consumer, job_id))
