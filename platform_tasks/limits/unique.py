"""Uniqueness at publish: one waiting job per unique key (best effort).

``port.publish(queue, payload, unique_key="sync:tenant-7", unique_for=timedelta(minutes=5))``
takes a lock in Redis (value: the job id and, for a delayed job, its delay-store entry);
a second publish of the key while the lock holds returns the first job's id and publishes
nothing. ``unique_mode="debounce"`` stores the job in the delay store for ``unique_for``
(due by Redis ``TIME``) and a second publish while it waits replaces the stored entry's
data, keeping the first job's id and due time: only the latest data runs, at most one
window after the first publish. An entry a RabbitMQ promoter has claimed is never
replaced (its data may already be on the queue under that id): the publish stores a new job.

The lock is released when the job starts (the consumer, after the job passed its limits
and before the handler runs) or when ``unique_for`` ends, whichever comes first: a publish
made after the job started is new work and runs again. A job that will never start
(cancelled, dead-lettered before it ran) releases it at once. ``unique_for`` bounds how long a
lost job (its message purged) can hold the key.

Best effort, stated honestly: the lock and an immediate publish are two steps (a crash
between them leaves the key locked for ``unique_for`` with no job), and a lock that
expires before the job starts lets a second copy through. Consume-time idempotency (the
job id claimed in ``core.processed_jobs``) stays the guarantee that one job id applies
once. Delayed and debounced jobs are stored in the same script that takes the lock,
atomically.

The lock sits in the delay store's Redis and hash tag (the broker's Redis for a Redis
broker; the platform's Redis with ``PLATFORM_RABBITMQ_DELAYS=delay_store``); RabbitMQ's
native delayed delivery has no store to replace entries in, so unique publishes are
refused there with a :class:`~platform_tasks.errors.ConfigurationError`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal, cast

from platform_tasks.brokers.scripts import script_source
from platform_tasks.headers import UNIQUE_HEADER
from platform_tasks.keys import DelayKeys
from platform_tasks.keys import unique_key as unique_lock_key

__all__ = ["UNIQUE_HEADER", "UniqueLocks", "UniquePublish", "unique_publish"]


UniqueMode = Literal["skip", "debounce"]
MAX_KEY_LENGTH = 512
_REBUILDS = 5


@dataclass(frozen=True)
class UniquePublish:
    """A checked unique-publish request."""

    key: str
    ttl_ms: int
    mode: UniqueMode


def unique_publish(key: Any, unique_for: Any, mode: Any) -> UniquePublish | None:
    """Check the arguments of a unique publish; ``None`` when ``key`` is ``None``.

    Raises ``ValueError`` naming the argument: a unique key needs a positive
    ``unique_for`` (the lock must end even if the job is lost).
    """
    if key is None:
        if unique_for is not None or mode not in (None, "skip"):
            raise ValueError("unique_for and unique_mode need unique_key")
        return None
    if not isinstance(key, str) or not key or len(key) > MAX_KEY_LENGTH:
        raise ValueError(
            f"unique_key must be a non-empty text of at most {MAX_KEY_LENGTH} "
            f"characters, got {key!r}"
        )
    if not isinstance(unique_for, timedelta) or unique_for.total_seconds() <= 0:
        raise ValueError(
            f"unique_for must be a positive timedelta with unique_key, got {unique_for!r}"
        )
    if mode is None:
        mode = "skip"
    if mode not in ("skip", "debounce"):
        raise ValueError(f"unique_mode must be 'skip' or 'debounce', got {mode!r}")
    return UniquePublish(key, max(1, int(unique_for.total_seconds() * 1000)), mode)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class UniqueLocks:
    """The locks of unique publish keys, beside the delay store they replace entries in."""

    def __init__(self, client: Any, keys: DelayKeys) -> None:
        self.client = client
        self.keys = keys
        self._schedule = client.register_script(script_source("unique_schedule"))
        self._release = client.register_script(script_source("unique_release"))

    def lock_key(self, key: str) -> str:
        return unique_lock_key(self.keys.namespace, self.keys.store, key)

    def claim_now(self, key: str, job_id: str, ttl_ms: int) -> str | None:
        """Lock ``key`` for a job published now; the waiting job's id when already locked."""
        lock = self.lock_key(key)
        for _ in range(_REBUILDS):
            if self.client.set(lock, f"{job_id} ", nx=True, px=ttl_ms):
                return None
            held = self.client.get(lock)
            if held is not None:
                return _text(held).split(" ", 1)[0]
        raise RuntimeError(f"unique key {key!r}: its lock kept changing; publish again")

    def store(
        self,
        request: UniquePublish,
        job_id: str,
        entry_id: str,
        due_ms: int | None,
        delay_ms: int,
        build: Callable[[str], str],
    ) -> str:
        """Store a delayed job under ``request.key`` (see the module docstring).

        ``build(job_id)`` encodes the entry for a job id: the new job's, or the waiting
        job's when debounce replaces its data. Returns the id of the job that will run.
        """
        lock = self.lock_key(request.key)
        keys = [lock, self.keys.schedule, self.keys.entries, self.keys.claimed]
        expected = ""
        entry = build(job_id)
        for _ in range(_REBUILDS):
            outcome, value = cast(
                list[Any],
                self._schedule(
                    keys=keys,
                    args=[
                        request.mode,
                        job_id,
                        entry_id,
                        "" if due_ms is None else due_ms,
                        request.ttl_ms,
                        entry,
                        delay_ms,
                        expected,
                    ],
                ),
            )
            outcome, value = _text(outcome), _text(value)
            if outcome == "rebuild":
                expected = value
                entry = build(value.split(" ", 1)[0]) if value else build(job_id)
                continue
            return value.split(" ", 1)[0]
        raise RuntimeError(f"unique key {request.key!r}: its lock kept changing; publish again")

    def release(self, key: str, job_id: str) -> bool:
        """Release ``key`` if it is still ``job_id``'s lock (a later job's is kept)."""
        return bool(int(self._release(keys=[self.lock_key(key)], args=[job_id])))

    def holder(self, key: str) -> str | None:
        held = self.client.get(self.lock_key(key))
        return None if held is None else _text(held).split(" ", 1)[0]
