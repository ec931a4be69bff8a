"""Deterministic job ids of a fan-out: valid UUIDv7s whose time part is the point.

A fan-out that runs again for the same point (a trigger delivered twice, a redelivery
after a crash, a replayed dead letter) must publish exactly the same job ids, so the
consumers' idempotency rows absorb every repeat. The 74 bits a UUIDv7 leaves to
randomness are taken from a SHA-256 of the identifying names instead; the 48-bit time
part is the point in milliseconds, so the ids of one point sort together and after the
ids of earlier points.
"""

from __future__ import annotations

import uuid
from datetime import datetime

from platform_tasks.envelope import derived_uuid7
from platform_tasks.epoch import epoch_ms

__all__ = ["derived_uuid7", "fan_out_job_id", "point_ms", "tenant_job_id"]


def point_ms(point: datetime) -> int:
    """Milliseconds since the epoch of an aware ``point``."""
    if point.tzinfo is None or point.utcoffset() is None:
        raise ValueError(f"point must be timezone-aware, got naive {point.isoformat()}")
    return epoch_ms(point)


def fan_out_job_id(job: str, point: datetime, kind: str) -> uuid.UUID:
    """The id of the one fan-out job of ``(job, point)`` towards consumer ``kind``.

    ``kind`` is part of the id so that a handler fanning out to two consumers at one point
    hands over two fan-out jobs, not one that swallows the other.
    """
    return derived_uuid7(point_ms(point), "fan-out", job, str(point_ms(point)), kind)


def tenant_job_id(job: str, point: datetime, kind: str, tenant_id: str) -> uuid.UUID:
    """The id of ``tenant_id``'s job in the fan-out of ``(job, point, kind)``."""
    ms = point_ms(point)
    return derived_uuid7(ms, "tenant", job, str(ms), kind, tenant_id)
