"""Attempts and delivery counting per ``(consumer, job_id)``: how crash loops end.

A job whose handler kills its worker (OOM kill, segfault, SIGKILL) never reaches the code
that would count a failed attempt; the broker just redelivers it, forever. Both Redis
transports mark such a message when they put it back (``delivery_info["redelivered"]``,
header ``redelivered``), so a *redelivery* is counted (field ``c``), in Redis, before the
handler runs. A handler that raises is counted (field ``f``) before its transaction rolls
back, so the next delivery of the job (a retry, or a duplicate copy waiting on the claim)
already sees it. The attempt a delivery is: ``max(platform_attempt header, f + c + 1)``;
past ``max_attempts`` it is dead-lettered instead of run. Duplicate copies of one job
share that one budget.

A first delivery of a healthy job writes nothing: it only reads the job's hash (one
``HGETALL``, empty for almost every job), which also tells it whether the job was
dead-lettered meanwhile (``done``), so a late duplicate is not run again.

An attempt the pool killed at the task's hard ``time_limit`` is no crash: the worker's main
process knows why it ended, writes the limit into the hash (field ``t``) and requeues the
message. Its redelivery finds ``t``, turns the redelivery it just counted into a failed
attempt (``c`` - 1, ``f`` + 1, ``t`` removed, in one ``MULTI``) and settles that attempt like
one whose handler raised: a retry with backoff, or a dead letter after the last attempt.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import redis
from redis.cluster import RedisCluster

from platform_tasks.consumer.retry import RetryPolicy
from platform_tasks.keys import DeliveryKeys


def attempt_number(header_attempt: Any, spent: int) -> int:
    """The attempt this delivery is: the header, or one past the attempts already spent.

    The header (``platform_attempt``) travels with the message and survives redelivery;
    ``spent`` (failed attempts plus redeliveries after a worker died, counted in Redis)
    also sees attempts of duplicate copies of the job and crashes that never published a
    retry.
    """
    if header_attempt is None:  # a first publish carries no header: no exception to raise
        header = 1
    else:
        try:
            header = int(header_attempt)
        except (TypeError, ValueError):
            header = 1
    return max(1, header, max(0, spent) + 1)


def delivery_ttl_seconds(policy: RetryPolicy, visibility_timeout_seconds: int) -> int:
    """How long a delivery count must live: the longest a job can stay in flight, plus an hour.

    Each attempt waits at most ``cap`` before it and can be held at most one visibility
    timeout by a worker that dies.
    """
    per_attempt = policy.cap.total_seconds() + visibility_timeout_seconds
    return int(policy.max_attempts * per_attempt) + 3600


@dataclass(frozen=True)
class DeliveryState:
    """What Redis knows about one job: nothing, for a first delivery of a healthy job."""

    spent: int = 0
    """Attempts known to have started and not finished well: failures + counted redeliveries."""
    exhausted: bool = False
    """The job was dead-lettered: its budget is spent until a replay restarts it."""
    generation: int | None = None
    """The dead letter whose replay last restarted the count, if any."""
    tracked: bool = False
    """The job has a hash at all (worth deleting once the job is applied)."""
    time_limit: float | None = None
    """The hard time limit (seconds) that stopped a delivery of the job, not yet settled."""


UNTRACKED = DeliveryState()
"""The state of a job Redis holds nothing for (one shared value: the class is frozen)."""


class DeliveryCounter:
    """The per-job delivery state, one small Redis hash per job that needed one.

    ``client`` is the platform's Redis, a :class:`RedisCluster` with
    ``PLATFORM_REDIS_CLUSTER=true``: every call and pipeline touches one job's one key,
    so one slot, and the transactions (``MULTI``) run on that slot's node.
    """

    def __init__(
        self,
        client: redis.Redis | RedisCluster | None,
        keys: DeliveryKeys,
        *,
        connect: Callable[[], redis.Redis | RedisCluster] | None = None,
    ) -> None:
        if client is None and connect is None:
            raise ValueError("DeliveryCounter needs a client or a connect callable")
        self._client = client
        self._connect = connect
        self._built = False
        self.keys = keys

    @property
    def client(self) -> redis.Redis | RedisCluster:
        """The client, built on first use by ``connect``: a :class:`RedisCluster` connects
        when it is built, and a cluster that is down then must make the delivery wait
        like any Redis error, not fail the task outside the pipeline's judgement."""
        if self._client is None:
            assert self._connect is not None
            self._client = self._connect()
            self._built = True
        return self._client

    def close(self) -> None:
        """Close the client built by ``connect`` (a client passed in is the caller's)."""
        if self._built and self._client is not None:
            self._client.close()
            self._client = None
            self._built = False

    def observe(
        self, consumer: str, job_id: str, *, redelivered: bool, ttl_seconds: int
    ) -> DeliveryState:
        """Read the job's state; count this delivery first when it is a redelivery.

        One round trip either way: ``HGETALL`` alone, or ``HINCRBY`` + ``EXPIRE`` +
        ``HGETALL`` pipelined.
        """
        key = self.keys.deliveries(consumer, job_id)
        if redelivered:
            with self.client.pipeline(transaction=False) as pipe:
                pipe.hincrby(key, "c", 1)
                pipe.expire(key, ttl_seconds)
                pipe.hgetall(key)
                _, _, raw = pipe.execute()
        else:
            raw = self.client.hgetall(key)
        return _state(cast(dict[Any, Any], raw))

    def failed(self, consumer: str, job_id: str, *, ttl_seconds: int) -> None:
        """Count one attempt whose handler raised (before its transaction rolls back)."""
        key = self.keys.deliveries(consumer, job_id)
        with self.client.pipeline(transaction=False) as pipe:
            pipe.hincrby(key, "f", 1)
            pipe.expire(key, ttl_seconds)
            pipe.execute()

    def stopped_at_time_limit(
        self, consumer: str, job_id: str, *, seconds: float, ttl_seconds: int
    ) -> None:
        """Record that the pool killed a delivery of the job at its hard time limit."""
        key = self.keys.deliveries(consumer, job_id)
        with self.client.pipeline(transaction=True) as pipe:
            pipe.hset(key, "t", repr(float(seconds)))
            pipe.expire(key, ttl_seconds)
            pipe.execute()

    def settle_time_limit(self, consumer: str, job_id: str, *, ttl_seconds: int) -> None:
        """The redelivery counted for a time-limit stop becomes the attempt that failed."""
        key = self.keys.deliveries(consumer, job_id)
        with self.client.pipeline(transaction=True) as pipe:
            pipe.hincrby(key, "c", -1)
            pipe.hincrby(key, "f", 1)
            pipe.hdel(key, "t")
            pipe.expire(key, ttl_seconds)
            pipe.execute()

    def undo(self, consumer: str, job_id: str) -> None:
        """Take back one counted redelivery that never reached a verdict (a server was down)."""
        self.client.hincrby(self.keys.deliveries(consumer, job_id), "c", -1)

    def exhaust(self, consumer: str, job_id: str, *, ttl_seconds: int) -> None:
        """Mark the job dead-lettered, so a duplicate still in flight is not run again."""
        key = self.keys.deliveries(consumer, job_id)
        with self.client.pipeline(transaction=True) as pipe:
            pipe.hset(key, mapping={"done": 1, "gen": -1})
            pipe.expire(key, ttl_seconds)
            pipe.execute()

    def restart(self, consumer: str, job_id: str, *, generation: int, ttl_seconds: int) -> None:
        """Start afresh for a replay of dead letter ``generation``: no counts, not done."""
        key = self.keys.deliveries(consumer, job_id)
        with self.client.pipeline(transaction=True) as pipe:
            pipe.delete(key)
            pipe.hset(key, "gen", generation)
            pipe.expire(key, ttl_seconds)
            pipe.execute()

    def forget(self, consumer: str, job_id: str) -> None:
        """Drop the hash once the job is applied; the idempotency row guards it now."""
        self.client.delete(self.keys.deliveries(consumer, job_id))


def _state(raw: dict[Any, Any]) -> DeliveryState:
    fields = {_text(k): _text(v) for k, v in raw.items()}
    gen = fields.get("gen")
    limit = fields.get("t")
    return DeliveryState(
        spent=max(0, int(fields.get("f", 0))) + max(0, int(fields.get("c", 0))),
        exhausted=fields.get("done") == "1",
        generation=int(gen) if gen is not None else None,
        tracked=bool(fields),
        time_limit=float(limit) if limit is not None else None,
    )


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
