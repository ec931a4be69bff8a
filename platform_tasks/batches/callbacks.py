"""A batch's callbacks: ordinary platform jobs, checked when the batch is made, published
through the outbox by the transaction that decides they fire.

A callback is a queue and an envelope's ``kind``, ``tenant_id`` and ``data``; when it
fires, ``data`` gets ``batch_id`` and ``counts`` (``applied``, ``dead_lettered``,
``discarded``, ``cancelled``, ``total``). Its job id is derived from the batch id and the
callback's name, so the same callback always has the same id; its correlation id is the
batch id (hex), so the batch's callbacks are found together in logs.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from platform_tasks.envelope import derived_uuid7
from platform_tasks.errors import EnvelopeError

if TYPE_CHECKING:
    from platform_tasks.publishing.queue_port import QueuePort

__all__ = ["CALLBACK_NAMES", "RESERVED_DATA_KEYS", "Callback", "callback_job_id", "fire"]

CALLBACK_NAMES = ("on_complete", "on_success", "on_death")
RESERVED_DATA_KEYS = ("batch_id", "counts")
"""Keys of a callback's ``data`` the platform fills in when it fires."""


@dataclass(frozen=True)
class Callback:
    """The job a batch publishes when it completes, succeeds or first loses a child."""

    queue: str
    kind: str
    tenant_id: str
    data: Mapping[str, Any] = field(default_factory=dict)

    def spec(self) -> dict[str, Any]:
        """The jsonb stored in ``core.batches``."""
        return {
            "queue": self.queue,
            "kind": self.kind,
            "tenant_id": self.tenant_id,
            "data": dict(self.data),
        }


def checked_spec(name: str, value: Any, port: QueuePort) -> dict[str, Any] | None:
    """``value`` (a :class:`Callback`, its mapping, or ``None``) as a stored spec, refused
    with an error naming ``name`` and the field when the job could never be published."""
    if value is None:
        return None
    if isinstance(value, Mapping):
        unknown = sorted(set(value) - {"queue", "kind", "tenant_id", "data"})
        if unknown:
            raise ValueError(f"{name}: unknown field(s) {', '.join(unknown)}")
        try:
            value = Callback(**value)
        except TypeError as exc:
            raise ValueError(f"{name}: {exc}") from None
    if not isinstance(value, Callback):
        raise TypeError(
            f"{name} must be a Callback(queue, kind, tenant_id, data), got {type(value).__name__}"
        )
    if not isinstance(value.queue, str) or not value.queue:
        raise ValueError(f"{name}.queue must be a non-empty queue name, got {value.queue!r}")
    if not isinstance(value.data, Mapping):
        raise ValueError(f"{name}.data must be a mapping, got {type(value.data).__name__}")
    taken = sorted(set(value.data) & set(RESERVED_DATA_KEYS))
    if taken:
        raise ValueError(
            f"{name}.data: {', '.join(taken)} is set by the platform when the callback fires"
        )
    spec = value.spec()
    try:
        json.dumps(spec["data"])
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name}.data must be JSON: {exc}") from None
    sample = _payload(spec, uuid.UUID(int=0), _zero_counts(), uuid.UUID(int=0))
    try:
        port.envelope(sample)
    except EnvelopeError as exc:
        detail = "; ".join(f"{name}.{where}: {why}" for where, why in exc.errors)
        raise ValueError(f"invalid batch callback: {detail}") from None
    return spec


def _zero_counts() -> dict[str, int]:
    return {"applied": 0, "dead_lettered": 0, "discarded": 0, "cancelled": 0, "total": 0}


def callback_job_id(batch_id: uuid.UUID, created_at: datetime, name: str) -> uuid.UUID:
    """The callback's job id: the batch's time, and a hash of the batch id and the name."""
    return derived_uuid7(int(created_at.timestamp() * 1000), "batch", str(batch_id), name)


def _payload(
    spec: Mapping[str, Any], batch_id: uuid.UUID, counts: Mapping[str, int], job_id: uuid.UUID
) -> dict[str, Any]:
    job = uuid.UUID(int=(7 << 76) | (0b10 << 62)) if job_id.int == 0 else job_id
    return {
        "job_id": str(job),
        "correlation_id": batch_id.hex,  # the batch's callbacks share one correlation id
        "kind": spec["kind"],
        "tenant_id": spec["tenant_id"],
        "data": {**dict(spec.get("data") or {}), "batch_id": str(batch_id), "counts": dict(counts)},
    }


def fire(
    port: QueuePort,
    cur: Any,
    name: str,
    spec: Mapping[str, Any],
    batch_id: uuid.UUID,
    created_at: datetime,
    counts: Mapping[str, int],
) -> uuid.UUID:
    """Publish the callback ``name`` of the batch into the outbox in ``cur``'s transaction."""
    job_id = callback_job_id(batch_id, created_at, name)
    payload = _payload(spec, batch_id, counts, job_id)
    return port.publish(str(spec["queue"]), payload, tx=cur)
