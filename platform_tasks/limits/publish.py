"""The queue port's unique publish: lock the key, then publish or store the job.

A collaborator of the port (:class:`UniquePublisher`), kept apart from
:mod:`platform_tasks.publishing.queue_port` so the port only forwards to it when a
``unique_key`` is given, and an ordinary publish does not change by one call. It uses
only the port's public methods (:class:`UniquePort`) and the port's delay back end, so it
never asks which broker it is on: the back end encodes the job as its store holds it and
refuses a unique publish where there is no store (RabbitMQ's native delayed delivery).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from datetime import datetime
from typing import Any, Protocol

from platform_tasks.envelope import Envelope
from platform_tasks.epoch import epoch_ms
from platform_tasks.headers import UNIQUE_HEADER
from platform_tasks.limits.unique import UniqueLocks, UniquePublish

__all__ = ["DEBOUNCE_LOCK_FACTOR", "UniqueDelays", "UniquePort", "UniquePublisher"]

DEBOUNCE_LOCK_FACTOR = 2
"""A debounced job's lock lasts twice its window: past its due time, until it starts (the
consumer releases it then), so a publish between due and start finds the job gone from
the store and stores a new one rather than a second copy of an unstarted skip."""


class UniqueDelays(Protocol):
    """What unique publish needs of the port's delay back end."""

    def encode(self, task_name: str, send: dict[str, Any]) -> str: ...

    def unique_locks(self) -> UniqueLocks: ...


class UniquePort(Protocol):
    """The public methods of :class:`~platform_tasks.publishing.queue_port.QueuePort`
    unique publish uses (``options`` is the port's ``PublishOptions``)."""

    @property
    def delays(self) -> UniqueDelays: ...

    def now(self) -> datetime: ...

    def envelope(self, payload: Mapping[str, Any]) -> Envelope[Any]: ...

    def send_options(
        self, queue: str, envelope: Envelope[Any], options: Any, ready_at: datetime | None = None
    ) -> dict[str, Any]: ...

    def send_now(self, envelope: Envelope[Any], send: Mapping[str, Any]) -> None: ...


class UniquePublisher:
    """Publish or schedule under a unique key, through one port."""

    def __init__(self, port: UniquePort) -> None:
        self.port = port

    def publish(
        self,
        queue: str,
        payload: Mapping[str, Any],
        options: Any,
        unique: UniquePublish,
        run_at: datetime | None,
    ) -> uuid.UUID:
        """Publish (``run_at`` None) or schedule ``payload`` under ``unique``; the job id
        that will run (the waiting job's when one holds the key). ``options`` is the
        port's ``PublishOptions``."""
        port = self.port
        locks = port.delays.unique_locks()
        options = options.model_copy(
            update={"headers": {**options.headers, UNIQUE_HEADER: unique.key}}
        )
        envelope = port.envelope(payload)
        job_id = str(envelope.job_id)
        if run_at is not None and run_at <= port.now():
            run_at = None
        if run_at is None and unique.mode == "skip":
            existing = locks.claim_now(unique.key, job_id, unique.ttl_ms)
            if existing is not None:
                return uuid.UUID(existing)
            try:
                port.send_now(envelope, port.send_options(queue, envelope, options))
            except BaseException:
                locks.release(unique.key, job_id)
                raise
            return envelope.job_id

        def build(for_job: str) -> str:
            copy = envelope if for_job == job_id else port.envelope({**payload, "job_id": for_job})
            return port.delays.encode(copy.kind, port.send_options(queue, copy, options))

        ttl_ms = unique.ttl_ms
        if unique.mode == "debounce":
            ttl_ms *= DEBOUNCE_LOCK_FACTOR
        request = UniquePublish(unique.key, ttl_ms, unique.mode)
        due_ms = None if run_at is None else epoch_ms(run_at)
        winner = locks.store(request, job_id, uuid.uuid4().hex, due_ms, unique.ttl_ms, build)
        return uuid.UUID(winner)
