"""The queue port's unique publish: lock the key, then publish or store the job.

Kept apart from :mod:`platform_tasks.publishing.queue_port` so the port only forwards to it when a
``unique_key`` is given; an ordinary publish does not change by one call.
"""

from __future__ import annotations

import json
import uuid
from datetime import datetime
from typing import TYPE_CHECKING, Any

from platform_tasks.errors import ConfigurationError
from platform_tasks.headers import UNIQUE_HEADER
from platform_tasks.limits.unique import UniqueLocks, UniquePublish

if TYPE_CHECKING:
    from collections.abc import Mapping

    from platform_tasks.publishing.queue_port import PublishOptions, QueuePort

__all__ = ["DEBOUNCE_LOCK_FACTOR", "publish_unique", "unique_locks_of"]

DEBOUNCE_LOCK_FACTOR = 2
"""A debounced job's lock lasts twice its window: past its due time, until it starts (the
consumer releases it then), so a publish between due and start finds the job gone from
the store and stores a new one rather than a second copy of an unstarted skip."""


def unique_locks_of(port: QueuePort) -> UniqueLocks:
    """The port's locks, beside its delay store; refused where there is no store."""
    if port._store_kind is None:
        raise ConfigurationError(
            "unique_key needs a delay store: a Redis broker, or RabbitMQ with "
            "PLATFORM_RABBITMQ_DELAYS=delay_store (RabbitMQ's native delayed delivery cannot "
            "find or replace a waiting job)"
        )
    locks = port._unique_locks
    if locks is None:
        store = port._delay_store()
        locks = UniqueLocks(store.client, store.keys)
        port._unique_locks = locks
    return locks


def publish_unique(
    port: QueuePort,
    queue: str,
    payload: Mapping[str, Any],
    options: PublishOptions,
    unique: UniquePublish,
    run_at: datetime | None,
) -> uuid.UUID:
    """Publish (``run_at`` None) or schedule ``payload`` under ``unique``; the job id that
    will run (the waiting job's when one holds the key)."""
    locks = unique_locks_of(port)
    options = options.model_copy(update={"headers": {**options.headers, UNIQUE_HEADER: unique.key}})
    envelope = port.envelope(payload)
    job_id = str(envelope.job_id)
    if run_at is not None and run_at <= port._clock():
        run_at = None
    if run_at is None and unique.mode == "skip":
        existing = locks.claim_now(unique.key, job_id, unique.ttl_ms)
        if existing is not None:
            return uuid.UUID(existing)
        try:
            port.app.send_task(envelope.kind, **port._send_options(queue, envelope, options))
        except BaseException:
            locks.release(unique.key, job_id)
            raise
        return envelope.job_id

    def build(for_job: str) -> str:
        copy = envelope if for_job == job_id else port.envelope({**payload, "job_id": for_job})
        send = port._send_options(queue, copy, options)
        if port._amqp_messages is not None:
            return port._store_amqp(copy.kind, send, run_at or port._clock())[2]
        message = port._wire.build(copy.kind, **send)
        return json.dumps({"q": message.list_key, "m": message.wire}, separators=(",", ":"))

    ttl_ms = unique.ttl_ms
    if unique.mode == "debounce":
        ttl_ms *= DEBOUNCE_LOCK_FACTOR
    request = UniquePublish(unique.key, ttl_ms, unique.mode)
    due_ms = None if run_at is None else int(run_at.timestamp() * 1000)
    winner = locks.store(request, job_id, uuid.uuid4().hex, due_ms, unique.ttl_ms, build)
    return uuid.UUID(winner)
